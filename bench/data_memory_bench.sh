#!/usr/bin/env bash
# data_memory_bench.sh: the memory a training job's ranks hold, summed over the ranks, and its
# samples/s, for ddp-train and (optionally) another build of it in the same run: the peak over
# the run of the summed proportional set size (PSS: a page mapped by k ranks counts 1/k in each,
# so a node's shared copy of the data counts once) and of the summed RSS (which counts it in
# every rank). Fashion-MNIST (bench/fashion_mnist_bench.yaml), batch 64 per rank; interleaved
# repeats, medians; one markdown table.
#   bench/data_memory_bench.sh [--ranks "1 2 4"] [--steps N] [--repeats N] [--loads "0"]
#                              [--baseline BIN] [--baseline-set KEY=VALUE ...] [--set KEY=VALUE ...]
# --baseline: a ddp-train binary to measure beside this one (e.g. a build of the previous
# commit); --baseline-set: config overrides for the baseline only (without --baseline, the
# baseline is this binary: e.g. the same data converted to .npy); --set: extra config
# overrides for both (e.g. data.share_on_node=false).
set -euo pipefail

usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
ranks_list="1 2 4"; steps=600; repeats=3; loads_list="0"; baseline=""; extra=(); base_extra=()
while (($#)); do
  case "$1" in
    --ranks) ranks_list="${2:?--ranks needs a list like \"1 2 4\"}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
    --repeats) repeats="${2:?--repeats needs a number}"; shift 2 ;;
    --loads) loads_list="${2:?--loads needs a list like \"0 1\"}"; shift 2 ;;
    --baseline) baseline="${2:?--baseline needs a ddp-train binary}"; shift 2 ;;
    --set) extra+=(--set "${2:?--set needs KEY=VALUE}"); shift 2 ;;
    --baseline-set) base_extra+=(--set "${2:?--baseline-set needs KEY=VALUE}"); shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "data_memory_bench.sh: unknown argument $1" >&2; usage ;;
  esac
done
for v in "$repeats" "$steps" $ranks_list; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "data_memory_bench.sh: expected a positive integer, got '$v'" >&2; exit 2; }
done
for v in $loads_list; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "data_memory_bench.sh: --loads takes counts like \"0 1\", got '$v'" >&2; exit 2; }
done
train="${DDP_TRAIN:-$root/build/ddp-train}"
python="${BENCH_PYTHON:-python3}"
[[ -x "$train" ]] || { echo "data_memory_bench.sh: ddp-train not found at $train (build it, or set DDP_TRAIN)" >&2; exit 2; }
[[ -z "$baseline" && ${#base_extra[@]} -gt 0 ]] && baseline="$train"
[[ -z "$baseline" || -x "$baseline" ]] || { echo "data_memory_bench.sh: --baseline $baseline is not executable" >&2; exit 2; }
if [[ "$(id -u)" == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
builds=(current)
[[ -n "$baseline" ]] && builds=(baseline current)

work="$(mktemp -d "${TMPDIR:-/tmp}/data_memory_bench.XXXXXX")"
# shellcheck source=bench/background_load.sh
source "$here/background_load.sh"
trap 'stop_load; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# Peak of the summed PSS and RSS (KiB) of the processes running `binary` with output dir `out`.
watch_memory() {  # out peak_file
  local out="$1" peak_pss=0 peak_rss=0 pss rss pid
  while [[ ! -f "$out.done" ]]; do
    pss=0; rss=0
    for pid in $(pgrep -f -- "output.dir=$out( |\$)" || true); do
      [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == *ddp-train* ]] || continue
      read -r p r < <(awk '/^Pss:/ {p=$2} /^Rss:/ {r=$2} END {print p+0, r+0}' \
        "/proc/$pid/smaps_rollup" 2>/dev/null || echo "0 0")
      pss=$((pss + p)); rss=$((rss + r))
    done
    ((pss > peak_pss)) && peak_pss=$pss
    ((rss > peak_rss)) && peak_rss=$rss
    sleep 0.1
  done
  echo "$peak_pss $peak_rss" > "$2"
}

results="$work/results.txt"  # build ranks load repeat peak_pss_kib peak_rss_kib samples/s | failed
: > "$results"
run() {  # build ranks load repeat
  local bin="$train" out="$work/$1_n$2_l$3_r$4" cmd rc=0 own=()
  [[ "$1" == baseline ]] && bin="$baseline" && own=("${base_extra[@]}")
  cmd="$(DDP_TRAIN="$bin" "$root/launch/ddp-run" --dry-run -n "$2" "$here/fashion_mnist_bench.yaml" \
    --set "training.max_steps=$steps" --set "output.dir=$out" "${extra[@]}" "${own[@]}")"
  watch_memory "$out" "$out.peak" &
  local watcher=$!
  start_load "$3"
  timeout --kill-after=5 600 bash -c "$cmd" > "$out.log" 2>&1 || rc=$?
  stop_load
  touch "$out.done"
  wait "$watcher"
  if ((rc != 0)); then
    echo "data_memory_bench.sh: $1 at $2 ranks, load $3 failed (exit $rc):" >&2
    tail -5 "$out.log" >&2
    echo "$1 $2 $3 $4 failed" >> "$results"
    return
  fi
  local rate
  rate="$("$python" -c 'import json, sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["samples_per_sec"])' "$out/metrics.jsonl")"
  echo "$1 $2 $3 $4 $(cat "$out.peak") $rate" >> "$results"
}

for ((r = 1; r <= repeats; r++)); do
  for load in $loads_list; do
    for n in $ranks_list; do
      for b in "${builds[@]}"; do
        echo "data_memory_bench.sh: repeat $r/$repeats, load $load, $n ranks, $b" >&2
        run "$b" "$n" "$load" "$r"
      done
    done
  done
done

"$python" - "$results" "$steps" <<'PY'
import statistics, subprocess, sys
path, steps = sys.argv[1:3]
runs = {}
for line in open(path):
    f = line.split()
    runs.setdefault((f[0], int(f[1]), int(f[2])), []).append(f[4:])
def med(key, i):
    vals = runs.get(key, [])
    if not vals or any(v[0] == "failed" for v in vals):
        return None
    return statistics.median(float(v[i]) for v in vals)
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p' | head -1"],
                     capture_output=True, text=True).stdout.strip()
reps = len(next(iter(runs.values())))
print(f"{cpu}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores; "
      f"Fashion-MNIST 784-256-256-10, batch 64 per rank, {steps} steps; median of {reps} interleaved runs")
print()
print("| ranks | busy programs | build | peak PSS, all ranks (MiB) | peak RSS, all ranks (MiB) | samples/s |")
print("|---:|---:|---|---:|---:|---:|")
fmt = lambda v, spec: format(v, spec) if v is not None else "failed"
for (b, n, load) in sorted(runs, key=lambda k: (k[2], k[1], k[0])):
    pss, rss, rate = (med((b, n, load), i) for i in range(3))
    print(f"| {n} | {load} | {b} | {fmt(pss and pss / 1024, ',.0f')} | "
          f"{fmt(rss and rss / 1024, ',.0f')} | {fmt(rate, ',.0f')} |")
PY
