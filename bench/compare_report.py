#!/usr/bin/python3
"""The table of bench/compare_ddp.sh: reads what the script collected (machine facts, the
ddp_bench_gemm output, one JSON result per run) and prints markdown that can be pasted into
docs/performance.md as is. Samples/s is the median of the repeats; the range is shown beside it.
"""
import argparse
import json
import statistics
import sys

TARGET_VS_TORCH = 2.0    # ddp at 2 ranks >= 2x PyTorch DDP at 2 ranks
TARGET_SCALING = 1.6     # ddp at 2 ranks >= 1.6x ddp at 1 rank


def read_keys(path, prefix=""):
    """key=value lines (those starting with prefix, prefix removed) as a dict of strings."""
    keys = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith(prefix) and "=" in line:
                k, v = line[len(prefix):].split("=", 1)
                keys[k] = v
    return keys


def read_results(path):
    """{(impl, ranks): [run dicts]} from one JSON object per line."""
    runs = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"compare_report.py: {path}:{n}: not JSON ({e}): {line[:80]}")
            runs.setdefault((d["impl"], int(d["world_size"])), []).append(d)
    return runs


def fmt_int(x):
    return f"{x:,.0f}"


def header(machine, gemm, runs):
    torch_run = next((r[0] for (impl, _), r in sorted(runs.items()) if impl == "torch"), None)
    ddp_run = next((r[0] for (impl, _), r in sorted(runs.items()) if impl == "ddp"), None)
    lines = [
        "#### ddp-train vs PyTorch DDP: Fashion-MNIST MLP 784-256-256-10, batch 64 per rank",
        "",
        f"- machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores; CPUs "
        f"{machine.get('busy_before', '?')}% busy with other work just before the runs; load average "
        f"(1/5/15 min) {machine.get('load_before', '?')} before, {machine.get('load_after', '?')} after",
        f"- single-core GEMM ceiling (Eigen, 1024x1024x1024): {float(gemm['gemm_ceiling_gflops']):.1f} GFLOP/s; "
        f"GEMM FLOPs per sample (forward + backward): {fmt_int(float(gemm['flops_per_sample']))}; "
        f"one core's compute-only train step: {fmt_int(float(gemm['train_step_samples_per_sec']))} samples/s",
    ]
    if ddp_run:
        extra = machine.get("ddp_extra", "").strip()
        lines.append(f"- ddp-train: {ddp_run['steps']} steps per run, launch/ddp-run (ranks bound to cores), "
                     f"bench/fashion_mnist_bench.yaml{' ' + extra if extra else ''}")
    if torch_run:
        blas = ", ".join(torch_run.get("blas", [])) or "none loaded"
        lines.append(f"- PyTorch {torch_run['torch']} DDP: {torch_run['steps']} timed steps per run after warm-up, "
                     f"gloo, {torch_run['threads_per_rank']} thread per rank, "
                     f"{'ranks bound to cores' if torch_run['bound_to_cores'] else 'unbound'}, "
                     f"bucket_cap_mb {torch_run['bucket_cap_mb']:g}; BLAS: {blas} "
                     f"(libblas.so.3 alternative: {machine.get('blas_alternative', '?')}), "
                     f"OpenBLAS kernels: {torch_run.get('openblas_core')} "
                     f"({machine.get('blas_note', '?')})")
    env = [f"{k[4:]}={v}" for k, v in sorted(machine.items()) if k.startswith("env_")]
    lines.append(f"- environment: {', '.join(env) if env else 'no OPENBLAS_*/OMP_* variables set'} "
                 "(torch_ddp.py sets OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=1 for its ranks)")
    lines.append(f"- samples/s: median of {machine.get('repeats', '?')} runs, interleaved; "
                 "GFLOP/s = samples/s x FLOPs per sample; % of ceiling = GFLOP/s / (ceiling x ranks)")
    return lines


def table(runs, gemm):
    ceiling = float(gemm["gemm_ceiling_gflops"])
    per_sample = float(gemm["flops_per_sample"])
    med = {key: statistics.median(r["samples_per_sec"] for r in rs) for key, rs in runs.items()}
    lines = [
        "| implementation | ranks | samples/s | runs (min-max) | speedup vs 1 rank | GFLOP/s "
        "| % of ceiling x ranks | ddp/torch | allreduce hidden |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {"ddp": 0, "torch": 1}
    for key in sorted(runs, key=lambda k: (order.get(k[0], 2), k[0], k[1])):
        impl, ranks = key
        rates = [r["samples_per_sec"] for r in runs[key]]
        one = med.get((impl, 1))
        speedup = f"{med[key] / one:.2f}x" if one else "-"
        gflops = med[key] * per_sample / 1e9
        other = med.get(("torch", ranks))
        ratio = f"{med[key] / other:.2f}x" if impl == "ddp" and other else "-"
        hidden = "-"
        if impl == "ddp" and ranks > 1:
            hidden = f"{statistics.median(r['allreduce_hidden_fraction'] for r in runs[key]):.0%}"
        name = {"ddp": "ddp-train", "torch": "PyTorch DDP", "torch-plain": "PyTorch, no DDP"}.get(impl, impl)
        lines.append(f"| {name} | {ranks} | {fmt_int(med[key])} | {fmt_int(min(rates))}-{fmt_int(max(rates))} "
                     f"| {speedup} | {gflops:.1f} | {gflops / (ceiling * ranks):.0%} | {ratio} | {hidden} |")
    return lines, med


def targets(med):
    lines = ["", "Targets:"]
    ddp2, torch2, ddp1 = med.get(("ddp", 2)), med.get(("torch", 2)), med.get(("ddp", 1))
    if ddp2 and torch2:
        r = ddp2 / torch2
        lines.append(f"- ddp-train at 2 ranks >= {TARGET_VS_TORCH:g}x PyTorch DDP at 2 ranks: {r:.2f}x, "
                     f"{'met' if r >= TARGET_VS_TORCH else 'NOT met'}")
    if ddp2 and ddp1:
        r = ddp2 / ddp1
        lines.append(f"- ddp-train 2 ranks >= {TARGET_SCALING:g}x ddp-train 1 rank: {r:.2f}x, "
                     f"{'met' if r >= TARGET_SCALING else 'NOT met'}")
    return lines


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--machine", required=True, help="key=value facts about the machine")
    p.add_argument("--gemm", required=True, help="ddp_bench_gemm's output")
    p.add_argument("--results", required=True, help="one JSON summary per run")
    args = p.parse_args(argv)
    machine = read_keys(args.machine)
    gemm = read_keys(args.gemm, prefix="result.")
    for k in ("gemm_ceiling_gflops", "flops_per_sample", "train_step_samples_per_sec"):
        if k not in gemm:
            sys.exit(f"compare_report.py: {args.gemm}: no result.{k}= line (is it ddp_bench_gemm's output?)")
    runs = read_results(args.results)
    if not runs:
        sys.exit(f"compare_report.py: {args.results}: no results")
    rows, med = table(runs, gemm)
    print("\n".join(header(machine, gemm, runs) + [""] + rows + targets(med)))


if __name__ == "__main__":
    main(sys.argv[1:])
