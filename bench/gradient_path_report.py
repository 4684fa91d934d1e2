#!/usr/bin/env python3
"""The table of bench/gradient_path_bench.sh from its results.tsv: per model, layout and link
rate, each variant's median step time and link bytes per step, its prediction (see the bench's
header) and its step time against the flat float32 allreduce's; then each distributed.tune
variant against the best variant of the sweep that it was allowed to choose.

    python3 bench/gradient_path_report.py OUTDIR/results.tsv [OUTDIR/choices.tsv]
"""
import statistics
import sys
from collections import defaultdict

# Float32 bytes of each model's parameters (784-256-256-10, 784-1024-1024-10, 784-4096-4096-10).
MODEL_BYTES = {"fashion": 4 * 269_322, "mlp1024": 4 * 1_863_690, "wide": 4 * 20_037_642}


def load(path):
    runs = defaultdict(list)
    for line in open(path):
        model, layout, rate, variant, sec, nbytes = line.rstrip("\n").split("\t")
        runs[(model, layout, rate, variant)].append((float(sec), int(nbytes)))
    return runs


def median(runs, key, field):
    return statistics.median(r[field] for r in runs[key]) if key in runs else None


def predict(runs, model, layout, rate, variant):
    """The step time the bench's model predicts, or None (the baseline, or a missing run)."""
    flat = median(runs, (model, layout, rate, "none"), 0)
    flat_bytes = median(runs, (model, layout, rate, "none"), 1)
    compute = median(runs, (model, layout, "one-node", "none"), 0)
    if None in (flat, flat_bytes, compute) or variant == "none" or "busy" in rate:
        return None
    comm = flat - compute
    size = MODEL_BYTES[model]
    if variant in ("bf16", "fp16"):
        compute16 = median(runs, (model, layout, "one-node", variant), 0)
        return None if compute16 is None else compute16 + comm / 2
    if variant == "hier":
        return compute + comm * 2 * size / flat_bytes
    if variant == "hier-bf16":
        return compute + comm * size / flat_bytes
    if variant.startswith("psgd"):
        # Its link bytes are the format's (fixed by the model's shapes), not a timing.
        compute_p = median(runs, (model, layout, "one-node", variant), 0)
        sent = median(runs, (model, layout, rate, variant), 1)
        return None if compute_p is None else compute_p + comm * sent / flat_bytes
    return None


def allowed(tune, variant, rate):
    """Whether the tune variant `tune` may choose what the sweep's `variant` runs. On one node
    the sweep's 16-bit variants set compression_on_node, which the tuner's configs do not."""
    if variant.startswith("tune"):
        return False
    if rate == "one-node" and variant in ("bf16", "fp16"):
        return False
    if variant in ("none", "hier"):
        return True
    if tune == "tune":
        return False
    if variant in ("bf16", "hier-bf16"):
        return True
    return (tune.startswith("tune-psgd") and variant.startswith("psgd")
            and int(variant[4:]) >= int(tune[9:]))


def tuner_table(runs, choices_path):
    choices = defaultdict(set)
    for line in open(choices_path):
        model, layout, rate, variant, choice = line.rstrip("\n").split("\t")
        choices[(model, layout, rate, variant)].add(choice.split(" (bucket caps")[0])
    print()
    print("| model | nodes x ranks | link | tuner | chose | ms/step | best of the sweep it may "
          "choose | ms/step | tuner vs best |")
    print("|---|---|---|---|---|---:|---|---:|---:|")
    for key in runs:
        model, layout, rate, variant = key
        if not variant.startswith("tune"):
            continue
        sweep = [(median(runs, k, 0), k[3]) for k in runs
                 if k[:3] == key[:3] and allowed(variant, k[3], rate)]
        if not sweep:
            continue
        best, name = min(sweep)
        sec = median(runs, key, 0)
        chose = " / ".join(sorted(choices.get(key, {"?"})))
        print(f"| {model} | {layout.replace('x', ' x ')} | {rate} | {variant} | {chose} |"
              f" {sec * 1000:.1f} | {name} | {best * 1000:.1f} | {sec / best:.2f}x |")


def main(path, choices_path=None):
    runs = load(path)
    print("| model | nodes x ranks | link | variant | ms/step | predicted | error |"
          " MB/step on the link | step time vs none |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for key in runs:
        model, layout, rate, variant = key
        if rate == "one-node":
            continue
        sec, nbytes = median(runs, key, 0), median(runs, key, 1)
        flat = median(runs, (model, layout, rate, "none"), 0)
        p = predict(runs, model, layout, rate, variant)
        pred = f"{p * 1000:.1f}" if p else "-"
        err = f"{(p - sec) / sec:+.0%}" if p else "-"
        ratio = f"{sec / flat:.2f}x" if flat else "-"
        print(f"| {model} | {layout.replace('x', ' x ')} | {rate} | {variant} |"
              f" {sec * 1000:.1f} | {pred} | {err} | {nbytes / 1e6:.2f} | {ratio} |")
    if choices_path:
        tuner_table(runs, choices_path)
    one = [k for k in runs if k[2] == "one-node"]
    if one:
        print()
        print("One node, the same ranks, ms/step (C, C16 and Cp of the predictions): " + ", ".join(
            f"{m} {l.replace('x', ' x ')} {v}: {median(runs, (m, l, r, v), 0) * 1000:.1f}"
            for (m, l, r, v) in one))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
