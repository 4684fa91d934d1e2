#!/usr/bin/env bash
# compression_bench.sh: distributed.compression (none, bf16, fp16) across two "nodes" on this
# machine (network namespaces joined by a veth pair, tests/cluster/netns.sh), the link limited by
# tc's token bucket to each rate: per model, layout and rate, the step time of each format and
# the bytes that crossed the link per step, in the same run, repeats interleaved, medians. One
# markdown table on stdout; the logs and metrics in OUTDIR.
#   bench/compression_bench.sh OUTDIR [--rates "10gbit 1gbit"] [--per-node "1 2"]
#       [--models "fashion wide"] [--formats "none bf16 fp16"] [--repeats R]
#       [--steps-fashion N] [--steps-wide N] [--set key.path=value ...]
# fashion: bench/fashion_mnist_bench.yaml (784-256-256-10); wide: 784-4096-4096-10 (20.0 M
# parameters, 25 MiB buckets). Step time: between the first and the last logged step (startup
# and the first steps left out). Link bytes per step: both directions, from the veth's counters,
# less a one-step run's (the startup's parameter broadcast), over the remaining steps.
# Prediction (docs/scaling.md): the same ranks on one node give the compute time C (float32 on
# shared memory) and C' (compressed there too, compression_on_node: the casts and 16-bit sums);
# a compressed step across nodes is then C' + (fp32 step - C) / 2, half the bytes of the fp32
# run's communication at the same rate.
# Needs root, iproute2, util-linux; builds nothing: $DDP_TRAIN (default build/ddp-train).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${1:?usage: compression_bench.sh OUTDIR [options] (see the header)}"
shift
rates="10gbit 1gbit"; per_nodes="1 2"; models="fashion wide"; formats="none bf16 fp16"
repeats=1; steps_fashion=300; steps_wide=12; extra_sets=()
while (($#)); do
  case "$1" in
    --rates) rates="${2:?}"; shift 2 ;;
    --per-node) per_nodes="${2:?}"; shift 2 ;;
    --models) models="${2:?}"; shift 2 ;;
    --formats) formats="${2:?}"; shift 2 ;;
    --repeats) repeats="${2:?}"; shift 2 ;;
    --steps-fashion) steps_fashion="${2:?}"; shift 2 ;;
    --steps-wide) steps_wide="${2:?}"; shift 2 ;;
    --set) extra_sets+=(--set "${2:?--set needs key.path=value}"); shift 2 ;;
    *) echo "compression_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
train="${DDP_TRAIN:-$root/build/ddp-train}"
[[ -x "$train" ]] || { echo "compression_bench.sh: build ddp-train first (or set DDP_TRAIN)" >&2; exit 2; }
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# shellcheck source=tests/cluster/netns.sh
source "$root/tests/cluster/netns.sh"
h1=ddpca h2=ddpcb subnet=10.79.0.0/24
trap 'netns_remove $h1 $h2' EXIT
netns_remove $h1 $h2
netns_pair $h1 $h2 vca vcb 10.79.0 || { echo "compression_bench.sh: $NETNS_ERROR" >&2; exit 2; }
netns_rsh_agent "$out/nsrsh"

link_bytes() { echo $(($(netns_rx_bytes $h1 vca) + $(netns_rx_bytes $h2 vcb))); }

# train_args MODEL FORMAT STEPS DIR: ddp-train's arguments for one run, into `args`.
train_args() {
  local model="$1" format="$2" steps="$3" dir="$4"
  args=(--config "$root/bench/fashion_mnist_bench.yaml" --set training.max_steps="$steps"
        --set training.log_every=$((steps > 4 ? steps / 4 : 1)) --set output.dir="$dir"
        --set output.save_model=false --set distributed.compression="$format"
        "${extra_sets[@]}")
  [[ "$model" == wide ]] && args+=(--set "model.layers=[784,4096,4096,10]"
                                   --set distributed.bucket_cap_mb=25 --set distributed.first_bucket_mb=1)
  [[ "$format" == none ]] || args+=(--set distributed.compression_on_node=true)
}

# one_node PER_NODE MODEL FORMAT STEPS DIR: the same ranks on one node (shared memory).
one_node() {
  local args
  train_args "$2" "$3" "$4" "$5"
  mpirun -n $((2 * $1)) --oversubscribe --bind-to none "$train" "${args[@]}" >"$5.log" 2>&1 ||
    { echo "compression_bench.sh: run failed, see $5.log" >&2; exit 1; }
}

# run PER_NODE MODEL FORMAT STEPS DIR: one training across the two nodes; prints the link bytes.
run() {
  local per_node="$1" model="$2" format="$3" steps="$4" dir="$5" args before
  printf '%s slots=%d\n%s slots=%d\n' $h1 "$per_node" $h2 "$per_node" >"$out/hostfile"
  train_args "$model" "$format" "$steps" "$dir"
  before=$(link_bytes)
  # The namespaces share this machine's cores, which Open MPI cannot see: waiting ranks yield.
  netns_mpirun $h1 "$out/hostfile" "$out/nsrsh" $subnet -np $((2 * per_node)) --bind-to none \
    --mca mpi_yield_when_idle 1 --mca btl tcp,self,vader -- "$train" "${args[@]}" \
    >"$dir.log" 2>&1 || { echo "compression_bench.sh: run failed, see $dir.log" >&2; exit 1; }
  echo $(($(link_bytes) - before))
}

# Seconds per step between the first and the last logged step of a metrics file.
step_seconds() {
  python3 - "$1" <<'EOF'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "train"]
a, b = steps[0], steps[-1]
print((b["time"] - a["time"]) / (b["global_step"] - a["global_step"]))
EOF
}

results="$out/results.tsv"
: >"$results"
for ((rep = 1; rep <= repeats; ++rep)); do
  for per_node in $per_nodes; do
    for model in $models; do
      steps=$steps_fashion
      [[ "$model" == wide ]] && steps=$steps_wide
      for format in $formats; do
        tag="$model-2x$per_node-one-node-$format"
        one_node "$per_node" "$model" "$format" "$steps" "$out/$tag.r$rep"
        printf '%s\t%s\t%s\t%s\t%s\t0\n' "$model" "2x$per_node" one-node "$format" \
          "$(step_seconds "$out/$tag.r$rep/metrics.jsonl")" >>"$results"
      done
    done
  done
  for rate in $rates; do
    netns_set_rate $h1 vca "$rate"
    netns_set_rate $h2 vcb "$rate"
    for per_node in $per_nodes; do
      for model in $models; do
        steps=$steps_fashion
        [[ "$model" == wide ]] && steps=$steps_wide
        for format in $formats; do
          tag="$model-2x$per_node-$rate-$format"
          one=$(run "$per_node" "$model" "$format" 1 "$out/$tag.one.r$rep")
          all=$(run "$per_node" "$model" "$format" "$steps" "$out/$tag.r$rep")
          sec=$(step_seconds "$out/$tag.r$rep/metrics.jsonl")
          per_step=$(((all - one) / (steps - 1)))
          printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$model" "2x$per_node" "$rate" "$format" "$sec" \
            "$per_step" >>"$results"
          echo "$tag (repeat $rep): $(awk "BEGIN {printf \"%.1f\", $sec * 1000}") ms/step," \
            "$((per_step / 1000)) kB/step on the link" >&2
        done
      done
    done
  done
done

python3 - "$results" <<'EOF'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    model, layout, rate, fmt, sec, nbytes = line.split("\t")
    runs[(model, layout, rate, fmt)].append((float(sec), int(nbytes)))
def sec(key):
    return statistics.median(s for s, _ in runs[key]) if key in runs else None
print("| model | nodes x ranks | link | format | ms/step | predicted | MB/step on the link |"
      " step time vs none |")
print("|---|---|---|---|---:|---:|---:|---:|")
for key in runs:
    model, layout, rate, fmt = key
    if rate == "one-node":
        continue
    t, base = sec(key), sec((model, layout, rate, "none"))
    c, c16 = sec((model, layout, "one-node", "none")), sec((model, layout, "one-node", fmt))
    predicted = "-"
    if fmt != "none" and None not in (base, c, c16):
        predicted = f"{(c16 + (base - c) / 2) * 1000:.1f}"
    mb = statistics.median(b for _, b in runs[key]) / 1e6
    ratio = f"{t / base:.2f}x" if base else "-"
    print(f"| {model} | {layout.replace('x', ' x ')} | {rate} | {fmt} | {t * 1000:.1f} |"
          f" {predicted} | {mb:.2f} | {ratio} |")
print()
print("One node, the same ranks (ms/step): " + ", ".join(
    f"{m} {l} {f}: {sec((m, l, r, f)) * 1000:.1f}" for (m, l, r, f) in runs if r == "one-node"))
EOF
