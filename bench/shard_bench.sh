#!/usr/bin/env bash
# shard_bench.sh: distributed.shard_optimizer (ZeRO-1) against the unsharded optimizer in the same
# run, its update after backward (overlap_optimizer: false) and fused into the reduce-scatters
# (true): samples/s, the optimizer's time per step on each rank after backward (its trace span:
# the non-finite check, clipping and the update; none when fused) and the optimizer state each
# rank keeps, for SGD with momentum and AdamW, at 2 and 4 ranks, idle and beside busy programs;
# interleaved repeats, medians; one markdown table.
#   bench/shard_bench.sh [--model fashion|wide] [--steps N] [--repeats N] [--ranks "2 4"]
#                        [--loads "0 1"] [--optimizers "sgd adamw"] [--run-timeout S]
# fashion: bench/fashion_mnist_bench.yaml (784-256-256-10, 269,322 parameters); wide: the same
# data with 784-4096-4096-10 (20.0 M parameters, 25 MiB buckets), where the optimizer is a large
# part of a step. Ranks are bound to cores (launch/ddp-run); the load is `sh -c 'while :; do :;
# done'` at nice 0 in the job's session.
set -euo pipefail

usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
model=fashion; steps=""; repeats=3; ranks_list="2 4"; loads_list="0 1"; optimizers="sgd adamw"
run_timeout=300
while (($#)); do
  case "$1" in
    --model) model="${2:?--model needs fashion or wide}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
    --repeats) repeats="${2:?--repeats needs a number}"; shift 2 ;;
    --ranks) ranks_list="${2:?--ranks needs a list like \"2 4\"}"; shift 2 ;;
    --loads) loads_list="${2:?--loads needs a list like \"0 1\"}"; shift 2 ;;
    --optimizers) optimizers="${2:?--optimizers needs a list like \"sgd adamw\"}"; shift 2 ;;
    --run-timeout) run_timeout="${2:?--run-timeout needs seconds}"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "shard_bench.sh: unknown argument $1" >&2; usage ;;
  esac
done
case "$model" in
  fashion) layers="[784, 256, 256, 10]"; bucket_mb=0.25; steps="${steps:-1500}" ;;
  wide) layers="[784, 4096, 4096, 10]"; bucket_mb=25; steps="${steps:-60}" ;;
  *) echo "shard_bench.sh: --model is fashion or wide, got '$model'" >&2; exit 2 ;;
esac
for v in "$repeats" "$steps" "$run_timeout" $ranks_list; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "shard_bench.sh: expected a positive integer, got '$v'" >&2; exit 2; }
done
for v in $loads_list; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "shard_bench.sh: --loads takes counts like \"0 1\", got '$v'" >&2; exit 2; }
done
for o in $optimizers; do
  [[ "$o" == sgd || "$o" == adamw ]] || { echo "shard_bench.sh: --optimizers takes sgd and adamw, got '$o'" >&2; exit 2; }
done

train="${DDP_TRAIN:-$root/build/ddp-train}"
python="${BENCH_PYTHON:-python3}"
[[ -x "$train" ]] || { echo "shard_bench.sh: ddp-train not found at $train (build it, or set DDP_TRAIN)" >&2; exit 2; }
if [[ "$(id -u)" == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/shard_bench.XXXXXX")"
# shellcheck source=bench/background_load.sh
source "$here/background_load.sh"
trap 'stop_load; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

optimizer_sets() {  # sgd | adamw: the --set arguments
  if [[ "$1" == sgd ]]; then
    echo "--set optimizer.name=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9"
  else
    echo "--set optimizer.name=adamw --set optimizer.lr=0.001 --set optimizer.momentum=0 --set optimizer.weight_decay=0.01"
  fi
}

results="$work/results.txt"  # optimizer ranks load variant repeat samples/s optimizer_ms state_floats | failed
variant_sets() {  # replicated | sharded | fused
  case "$1" in
    replicated) echo "--set distributed.shard_optimizer=false" ;;
    sharded) echo "--set distributed.shard_optimizer=true --set distributed.overlap_optimizer=false" ;;
    fused) echo "--set distributed.shard_optimizer=true --set distributed.overlap_optimizer=true" ;;
  esac
}
: > "$results"
run() {  # optimizer ranks load variant repeat
  local out="$work/$1_n$2_l$3_s$4_r$5" cmd rc=0
  # shellcheck disable=SC2046
  cmd="$(DDP_TRAIN="$train" "$root/launch/ddp-run" --dry-run -n "$2" "$here/fashion_mnist_bench.yaml" \
    --set "model.layers=$layers" --set "distributed.bucket_cap_mb=$bucket_mb" \
    --set "distributed.first_bucket_mb=$bucket_mb" $(optimizer_sets "$1") \
    $(variant_sets "$4") --set "training.max_steps=$steps" \
    --set "output.trace=true" --set "output.trace_steps=$steps" --set "output.dir=$out")"
  start_load "$3"
  timeout --kill-after=5 "$run_timeout" bash -c "$cmd" > "$out.log" 2>&1 || rc=$?
  stop_load
  if ((rc != 0)); then
    echo "shard_bench.sh: $1 at $2 ranks, load $3, $4 failed (exit $rc):" >&2
    tail -5 "$out.log" >&2
    echo "$1 $2 $3 $4 $5 failed" >> "$results"
    return
  fi
  "$python" - "$out" "$1 $2 $3 $4 $5" >> "$results" <<'PY'
import json, re, statistics, sys
out, key = sys.argv[1:3]
rate = json.loads(open(out + "/metrics.jsonl").readlines()[-1])["samples_per_sec"]
spans = {}
for e in json.load(open(out + "/trace.json"))["traceEvents"]:
    if e.get("ph") == "X" and e["name"].startswith("optimizer ("):
        spans.setdefault(e["pid"], []).append(e["dur"] / 1000.0)
# The median step's optimizer time of each rank, averaged over the ranks (the first step
# allocates and is left out).
per_rank = [statistics.median(v[1:]) for v in spans.values()] or [0.0]
state = re.search(r"optimizer: \w+, (?:no state|state [^:]*: (\d+) x (\d+) floats)",
                  open(out + ".log").read())
floats = int(state.group(1)) * int(state.group(2)) if state and state.group(1) else 0
print(key, rate, statistics.mean(per_rank), floats)
PY
}

for ((r = 1; r <= repeats; r++)); do
  for load in $loads_list; do
    for n in $ranks_list; do
      for o in $optimizers; do
        for s in replicated sharded fused; do
          echo "shard_bench.sh: repeat $r/$repeats, load $load, $n ranks, $o, $s" >&2
          run "$o" "$n" "$load" "$s" "$r"
        done
      done
    done
  done
done

"$python" - "$results" "$model" "$steps" "$layers" <<'PY'
import statistics, subprocess, sys
path, model, steps, layers = sys.argv[1:5]
runs = {}
for line in open(path):
    f = line.split()
    runs.setdefault((f[0], int(f[1]), int(f[2]), f[3]), []).append(f[5:])
def med(key, i):
    vals = runs.get(key, [])
    if not vals or any(v[0] == "failed" for v in vals):
        return None
    return statistics.median(float(v[i]) for v in vals)
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p' | head -1"],
                     capture_output=True, text=True).stdout.strip()
reps = len(next(iter(runs.values())))
print(f"{cpu}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores; "
      f"model {layers} ({model}), batch 64 per rank, {steps} steps; median of {reps} interleaved runs")
print()
print("| optimizer | ranks | busy programs | samples/s unsharded | sharded | fused "
      "| sharded ÷ unsharded | fused ÷ unsharded | fused ÷ sharded "
      "| optimizer ms/step after backward, unsharded → sharded "
      "| state floats per rank, unsharded → sharded |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
fmt = lambda v, spec: format(v, spec) if v is not None else "failed"
ratio = lambda x, y: f"{x / y:.2f}×" if x and y else "—"
for (o, n, load) in sorted({k[:3] for k in runs}, key=lambda k: (k[2], k[0], k[1])):
    rate = {v: med((o, n, load, v), 0) for v in ("replicated", "sharded", "fused")}
    ta, tb = med((o, n, load, "replicated"), 1), med((o, n, load, "sharded"), 1)
    fa, fb = med((o, n, load, "replicated"), 2), med((o, n, load, "sharded"), 2)
    a, b, c = rate["replicated"], rate["sharded"], rate["fused"]
    print(f"| {o} | {n} | {load} | {fmt(a, ',.0f')} | {fmt(b, ',.0f')} | {fmt(c, ',.0f')} | "
          f"{ratio(b, a)} | {ratio(c, a)} | {ratio(c, b)} | "
          f"{fmt(ta, '.3f')} → {fmt(tb, '.3f')} | {fmt(fa, ',.0f')} → {fmt(fb, ',.0f')} |")
PY
