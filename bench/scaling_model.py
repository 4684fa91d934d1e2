"""scaling_model.py: the step-time model of docs/scaling.md, fitted to bench/netns_scaling.sh's
output and checked against its measured training runs.

  python3 bench/scaling_model.py OUTDIR [--nodes 2 4 8 16] [--calibrate MODEL:LINK | --no-cpu-term
                                  | --gamma NS_PER_BYTE]

Model. A link is an alpha-beta pair: one allreduce of S bytes across N nodes takes
    T_N(S) = 2(N-1)·alpha + 2(N-1)/N · S / B
(ring allreduce between nodes: 2(N-1) steps, each moving S/N bytes over the link; ranks inside a
node meet through shared memory, which is much faster and ignored). alpha and B come from the
MPI_Allreduce sweep between the two nodes (N = 2: T = 2·alpha + S/B): alpha from the smallest
messages, B at each bucket's size S from the sweep's time there (interpolated between the
measured sizes; --global-fit uses one B fitted by least squares over the buckets' range). A training step is
    step = compute + sum over buckets k of T_N(S_k)          (no overlap: one core per rank)
    step = forward + max(backward, comm chain) + optimizer   (full overlap: spare core or GPU)
where compute is the one-node run's time per step minus its allreduce wait (same placement of
ranks on cores), and the buckets are the run's own bucket plan.

CPU term. Where ranks and the network stack share cores (every measurement on this machine),
moving a byte also costs CPU time that no longer overlaps anything: the kernel's TCP copies and
MPI's own copies run on the cores that compute, which the isolated sweep (idle cores around it)
does not see. The no-overlap form therefore gets
    + gamma · V_N,   V_N = sum over buckets of 2(N-1)/N · S_k   (bytes each rank sends per step)
gamma (seconds per byte) is calibrated on ONE training run (--calibrate MODEL:LINK, default the
Fashion-MNIST MLP on the unlimited link: the run where the link itself costs least, so the gap
is mostly CPU) and every other run is a prediction; the error table marks the calibration run
and the largest error is taken over the others. --gamma takes it from another series (e.g. the
unsharded runs' for distributed.shard_optimizer runs), so every run is a prediction.

Sharded optimizer (distributed.shard_optimizer). Per bucket a reduce-scatter (each rank sends
(N-1)/N of the bucket, N-1 messages) and an allgather (the same again) replace the allreduce:
the same bytes and the same 2(N-1) latencies, so T_N and V_N are unchanged; what changes is
compute, which the series' own one-node runs (sharded too) measure.
"""
import argparse
import json
import os
import re
import sys


def read_allreduce(path):
    rows = []
    for line in open(path):
        m = re.match(r"\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|", line)
        if m:
            rows.append((int(m.group(1)), float(m.group(2)) * 1e-6))
    return rows


def fit_alpha_beta(rows, min_bytes):
    """alpha from the smallest messages (T = 2·alpha when S/B is negligible), then 1/B by least
    squares on relative error of T - 2·alpha = S/B over sizes >= min_bytes (the buckets' range;
    a token-bucket link lets smaller messages through at full speed)."""
    alpha = min(t for _, t in rows[:3]) / 2
    big = [(s, t) for s, t in rows if s >= min_bytes]
    # minimise sum(((2a + S·x) - T) / T)^2 over x: x = sum(S(T-2a)/T^2) / sum(S^2/T^2)
    x = sum(s * (t - 2 * alpha) / t**2 for s, t in big) / sum(s * s / t**2 for s, t in big)
    return alpha, x


def one_summary(run_dir):
    last = None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") == "summary":
                last = j
    return last


def summary(run_dir):
    """The run's summary; with repeats (run_dir.r2, .r3, ...) the one of median step time."""
    runs = [run_dir] + sorted(d for d in (os.path.join(os.path.dirname(run_dir), e)
                                          for e in os.listdir(os.path.dirname(run_dir)))
                              if re.fullmatch(re.escape(run_dir) + r"\.r\d+", d))
    found = [one_summary(r) for r in runs if os.path.exists(os.path.join(r, "metrics.jsonl"))]
    found.sort(key=lambda j: j["seconds"] / j["steps"])
    return found[len(found) // 2] if found else None


def buckets(log_path):
    sizes = []
    for line in open(log_path):
        m = re.match(r"\s*bucket \d+: (\d+) floats", line)
        if m:
            sizes.append(4 * int(m.group(1)))
    return sizes


def t_allreduce(nodes, size, alpha, beta_inv):
    return 2 * (nodes - 1) * alpha + 2 * (nodes - 1) / nodes * size * beta_inv


def beta_inv_at(rows, alpha, size, fallback):
    """1/B at `size` read off the sweep: the measured two-node time T_2(S) = 2·alpha + S/B,
    interpolated linearly between the sizes around S (a token-bucket link is not one
    bandwidth: small messages ride its burst, large ones see its rate)."""
    pts = [(s, t) for s, t in rows]
    for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
        if s0 <= size <= s1:
            t = t0 + (t1 - t0) * (size - s0) / (s1 - s0)
            return max(t - 2 * alpha, 0.0) / size
    return fallback


def bytes_sent(nodes, sizes):
    return sum(2 * (nodes - 1) / nodes * s for s in sizes)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("outdir")
    p.add_argument("--nodes", type=int, nargs="*", default=[2, 4, 8, 16])
    p.add_argument("--fit-min-bytes", type=int, default=256 * 1024)
    p.add_argument("--calibrate", default="fashion:unlimited",
                   help="MODEL:LINK, the one training run gamma is taken from")
    p.add_argument("--no-cpu-term", action="store_true", help="the pure link model (gamma = 0)")
    p.add_argument("--gamma", type=float, default=None,
                   help="the CPU term in ns per byte, from another series (no calibration run)")
    p.add_argument("--global-fit", action="store_true",
                   help="one bandwidth per link (fitted over the sweep) instead of the sweep's "
                        "bandwidth at each bucket's size")
    args = p.parse_args()
    out = args.outdir
    rates = sorted({m.group(1) for f in os.listdir(out) for m in [re.match(r"allreduce-(.+)\.md$", f)] if m},
                   key=lambda r: (r != "unlimited", -float(re.sub(r"[^\d.]", "", r) or 0)))
    models = sorted({m.group(1) for f in os.listdir(out) for m in [re.match(r"one-node-([^.]+)\.log$", f)] if m})

    links = {}
    print(f"### Links (MPI_Allreduce between the two nodes, fitted over sizes >= {args.fit_min_bytes} bytes)\n")
    print("| link | alpha (us) | fitted bandwidth B (GB/s) | sweep points | max fit error |")
    print("|---|---:|---:|---:|---:|")
    for rate in rates:
        rows = read_allreduce(os.path.join(out, f"allreduce-{rate}.md"))
        alpha, beta_inv = fit_alpha_beta(rows, args.fit_min_bytes)
        fitted = [(s, t) for s, t in rows if s >= args.fit_min_bytes]
        worst = max(abs(2 * alpha + beta_inv * s - t) / t for s, t in fitted)
        links[rate] = (alpha, beta_inv, rows)
        print(f"| {rate} | {alpha * 1e6:.1f} | {1 / beta_inv / 1e9:.3f} | {len(fitted)} | {worst * 100:.0f}% |")

    def compute_and_sizes(model):
        one = summary(os.path.join(out, f"one-node-{model}"))
        compute = (one["seconds"] - one.get("allreduce_wait_seconds", 0.0)) / one["steps"]
        return compute, buckets(os.path.join(out, f"one-node-{model}.log"))

    def link_only(model, rate, nodes):
        compute, sizes = compute_and_sizes(model)
        alpha, beta_inv, rows = links[rate]
        if args.global_fit:
            return compute + sum(t_allreduce(nodes, b, alpha, beta_inv) for b in sizes)
        return compute + sum(t_allreduce(nodes, b, alpha, beta_inv_at(rows, alpha, b, beta_inv))
                             for b in sizes)

    gamma = 0.0
    cal_model, _, cal_rate = args.calibrate.partition(":")
    if args.gamma is not None:
        gamma = args.gamma * 1e-9
        cal_model = cal_rate = None  # every run is a prediction
        print(f"\nCPU term: gamma = {args.gamma:.3f} ns per byte sent, given (--gamma)")
    elif not args.no_cpu_term:
        cal = summary(os.path.join(out, f"two-nodes-{cal_rate}-{cal_model}"))
        if cal is None or cal_rate not in links:
            print(f"scaling_model.py: no run {args.calibrate} to calibrate gamma on", file=sys.stderr)
            return 2
        _, sizes = compute_and_sizes(cal_model)
        gamma = max(0.0, (cal["seconds"] / cal["steps"] - link_only(cal_model, cal_rate, 2)) /
                    bytes_sent(2, sizes))
        print(f"\nCPU term: gamma = {gamma * 1e9:.3f} ns per byte sent "
              f"({gamma * 2**20 * 1e3:.2f} ms per MiB), calibrated on {args.calibrate}")

    print("\n### Step time at 2 nodes: measured vs model\n")
    print("| model | link | buckets (MB) | compute ms/step | measured ms/step | link model ms/step "
          "| + CPU term ms/step | error | allreduce hidden |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    errors = []
    for model in models:
        compute, sizes = compute_and_sizes(model)
        for rate in rates:
            run = os.path.join(out, f"two-nodes-{rate}-{model}")
            s = summary(run)
            if s is None:
                continue
            measured = s["seconds"] / s["steps"]
            base = link_only(model, rate, 2)
            predicted = base + gamma * bytes_sent(2, sizes)
            err = (predicted - measured) / measured
            calibration = (not args.no_cpu_term and args.gamma is None and
                           (model, rate) == (cal_model, cal_rate))
            if not calibration:
                errors.append(abs(err))
            mb = " + ".join(f"{b / 2**20:.2f}" for b in sizes)
            print(f"| {model} | {rate} | {mb} | {compute * 1e3:.2f} | {measured * 1e3:.2f} | "
                  f"{base * 1e3:.2f} | {predicted * 1e3:.2f} | "
                  f"{'(calibration)' if calibration else f'{err * 100:+.0f}%'} | "
                  f"{s.get('allreduce_hidden_fraction', 0) * 100:.0f}% |")
    if errors:
        print(f"\nlargest prediction error: {max(errors) * 100:.0f}% over {len(errors)} predicted runs")

    print("\n### Predicted step time (ms) for N nodes, one core per rank (no overlap)\n")
    print("| model | link | " + " | ".join(f"N={n}" for n in args.nodes) + " |")
    print("|---|---|" + "---:|" * len(args.nodes))
    for model in models:
        _, sizes = compute_and_sizes(model)
        for rate in rates:
            cells = [link_only(model, rate, n) + gamma * bytes_sent(n, sizes) for n in args.nodes]
            print(f"| {model} | {rate} | " + " | ".join(f"{c * 1e3:.1f}" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
