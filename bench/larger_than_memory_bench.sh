#!/usr/bin/env bash
# larger_than_memory_bench.sh: training from a .npy data set larger than the memory the job may
# use. Writes a synthetic uint8 data set (784 features, 10 classes: a class's template plus
# noise, so it can be learnt) of about --factor times --limit-mib, then:
#  1. ddp_bench_npy_access in a cgroup limited to --limit-mib: rows/s, major faults and bytes
#     read from the disk of each access pattern a loader could use (the file's cache dropped
#     before each);
#  2. ddp-train, data.format npy, one whole epoch at each of --ranks: in memory (the file in the
#     page cache, no limit) and in a fresh cgroup limited to --limit-mib for the job's every
#     process (the file's cache dropped first); interleaved repeats, medians of samples/s and
#     the cgroup's peak usage. Two markdown tables.
# Needs root and a cgroup memory controller (v1 /sys/fs/cgroup/memory, or v2 with "memory" in
# cgroup.controllers), a data directory on a disk (not tmpfs), and numpy in BENCH_PYTHON.
#   bench/larger_than_memory_bench.sh [--limit-mib 384] [--factor 2.2] [--ranks "1 2"]
#                                     [--repeats 3] [--loads "0"] [--dir DIR]
set -euo pipefail

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
limit_mib=384; factor=2.2; ranks_list="1 2"; repeats=3; loads_list="0"
dir="${TMPDIR:-/var/tmp}/ddp_larger_than_memory"
while (($#)); do
  case "$1" in
    --limit-mib) limit_mib="${2:?--limit-mib needs a number}"; shift 2 ;;
    --factor) factor="${2:?--factor needs a number}"; shift 2 ;;
    --ranks) ranks_list="${2:?--ranks needs a list like \"1 2\"}"; shift 2 ;;
    --repeats) repeats="${2:?--repeats needs a number}"; shift 2 ;;
    --loads) loads_list="${2:?--loads needs a list like \"0 1\"}"; shift 2 ;;
    --dir) dir="${2:?--dir needs a directory}"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "larger_than_memory_bench.sh: unknown argument $1" >&2; usage ;;
  esac
done
for v in "$limit_mib" "$repeats" $ranks_list; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "larger_than_memory_bench.sh: expected a positive integer, got '$v'" >&2; exit 2; }
done
[[ "$factor" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "larger_than_memory_bench.sh: --factor takes a number, got '$factor'" >&2; exit 2; }
train="${DDP_TRAIN:-$root/build/ddp-train}"
access="${DDP_BENCH_NPY_ACCESS:-$(dirname "$train")/bench/ddp_bench_npy_access}"
python="${BENCH_PYTHON:-python3}"
fail() { echo "larger_than_memory_bench.sh: $*" >&2; exit 2; }
[[ -x "$train" ]] || fail "ddp-train not found at $train (build it, or set DDP_TRAIN)"
[[ -x "$access" ]] || fail "ddp_bench_npy_access not found at $access (set DDP_BENCH_NPY_ACCESS)"
[[ "$(id -u)" == 0 ]] || fail "needs root to create a memory cgroup"
"$python" -c 'import numpy' 2>/dev/null || fail "$python has no numpy (set BENCH_PYTHON)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
limit=$((limit_mib * 1024 * 1024))

# --- the cgroup: v1 or v2, a fresh one per run so its peak is that run's ---------------------
if [[ -d /sys/fs/cgroup/memory && -f /sys/fs/cgroup/memory/cgroup.procs ]]; then
  cg_root=/sys/fs/cgroup/memory; cg_limit=memory.limit_in_bytes; cg_peak=memory.max_usage_in_bytes
elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  cg_root=/sys/fs/cgroup; cg_limit=memory.max; cg_peak=memory.peak
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory > /sys/fs/cgroup/cgroup.subtree_control
else
  fail "no cgroup memory controller (neither /sys/fs/cgroup/memory nor cgroup v2 with memory)"
fi
cg=""
new_cgroup() {
  cg="$cg_root/ddp_larger_than_memory_$$_$RANDOM"
  mkdir "$cg" || fail "cannot create the cgroup $cg"
  echo "$limit" > "$cg/$cg_limit"
  # No swap either: the limit holds the job's memory, page cache included.
  [[ -f "$cg/memory.memsw.limit_in_bytes" ]] && echo "$limit" > "$cg/memory.memsw.limit_in_bytes"
  [[ -f "$cg/memory.swap.max" ]] && echo 0 > "$cg/memory.swap.max"
  return 0
}
drop_cgroup() { [[ -n "$cg" ]] && rmdir "$cg" 2>/dev/null; cg=""; }
in_cgroup() { sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" "$@"; }

work="$(mktemp -d "${TMPDIR:-/tmp}/larger_than_memory_bench.XXXXXX")"
# shellcheck source=bench/background_load.sh
source "$here/background_load.sh"
trap 'stop_load; drop_cgroup; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# --- the data set --------------------------------------------------------------------------------
mkdir -p "$dir"
[[ "$(stat -f -c %T "$dir")" != tmpfs ]] || fail "$dir is on tmpfs, whose pages cannot be dropped: use --dir on a disk"
samples="$("$python" -c "print(int($factor * $limit / 784))")"
features="$dir/features.npy"; labels="$dir/labels.npy"
want_bytes=$((samples * 784))
# An earlier run's data set of the same size is used again.
if [[ ! -f "$features" || ! -f "$labels" ]] ||
   ! "$python" -c 'import numpy as np, sys; sys.exit(np.load(sys.argv[1], mmap_mode="r").shape != (int(sys.argv[2]), 784))' "$features" "$samples"; then
  echo "larger_than_memory_bench.sh: writing $samples samples ($((want_bytes / 1048576)) MiB) to $dir" >&2
  "$python" - "$samples" "$dir" <<'PY'
import sys
import numpy as np
n, out = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
templates = rng.integers(0, 256, size=(10, 784)).astype(np.int16)
y = rng.integers(0, 10, size=n).astype(np.uint8)
x = np.lib.format.open_memmap(out + "/features.npy", mode="w+", dtype=np.uint8, shape=(n, 784))
for s in range(0, n, 65536):
    e = min(n, s + 65536)
    noise = rng.integers(-96, 97, size=(e - s, 784), dtype=np.int16)
    x[s:e] = np.clip(templates[y[s:e]] + noise, 0, 255).astype(np.uint8)
x.flush()
del x
np.save(out + "/labels.npy", y)
PY
fi
drop_file_cache() {
  "$python" -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$features"
}
warm_file_cache() { cat "$features" > /dev/null; }
file_mib=$(( $(stat -c %s "$features") / 1048576 ))

cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
echo "$cpu, $(nproc) cores; features.npy $file_mib MiB (uint8 [$samples, 784]), memory limit $limit_mib MiB ($(awk "BEGIN {printf \"%.1f\", $file_mib / $limit_mib}")x smaller)"
echo

# --- 1. the access patterns ----------------------------------------------------------------------
echo "Reading rank 0's shard (of 2) in batches of 64, limited to $limit_mib MiB, cold cache:"
echo
for pattern in sequential shuffled shuffled+random shuffled+ahead; do
  drop_file_cache
  new_cgroup
  in_cgroup "$access" "$features" --world 2 --rows 200000 --seconds 20 --patterns "$pattern" |
    { [[ "$pattern" == sequential ]] && cat || tail -1; }
  drop_cgroup
done
echo

# --- 2. training, a whole epoch, in memory and limited -------------------------------------------
results="$work/results.txt"  # mode ranks load repeat samples/s peak_mib epochs_done | failed
: > "$results"
run() {  # mode ranks load repeat
  local out="$work/$1_n$2_l$3_r$4" cmd rc=0 peak=0
  cmd=("$train" --config "$here/fashion_mnist_bench.yaml"
       --set data.format=npy --set "data.dir=$dir" --set data.train.images=
       --set data.train.features=features.npy --set data.train.labels=labels.npy
       --set training.epochs=1 --set training.max_steps=0 --set "output.dir=$out")
  if [[ "$1" == limited ]]; then
    drop_file_cache
    new_cgroup
  else
    warm_file_cache
  fi
  start_load "$3"
  if [[ "$1" == limited ]]; then
    in_cgroup mpirun -n "$2" --oversubscribe "${cmd[@]}" > "$out.log" 2>&1 || rc=$?
    peak=$(( $(cat "$cg/$cg_peak") / 1048576 ))
    drop_cgroup
  else
    mpirun -n "$2" --oversubscribe "${cmd[@]}" > "$out.log" 2>&1 || rc=$?
  fi
  stop_load
  if ((rc != 0)) || ! grep -q "^done: 1 epoch" "$out.log"; then
    echo "larger_than_memory_bench.sh: $1 at $2 ranks failed (exit $rc):" >&2
    tail -5 "$out.log" >&2
    echo "$1 $2 $3 $4 failed" >> "$results"
    return
  fi
  local rate
  rate="$("$python" -c 'import json, sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["samples_per_sec"])' "$out/metrics.jsonl")"
  echo "$1 $2 $3 $4 $rate $peak" >> "$results"
}
for ((r = 1; r <= repeats; r++)); do
  for load in $loads_list; do
    for n in $ranks_list; do
      for mode in memory limited; do
        echo "larger_than_memory_bench.sh: repeat $r/$repeats, load $load, $n ranks, $mode" >&2
        run "$mode" "$n" "$load" "$r"
      done
    done
  done
done

"$python" - "$results" "$limit_mib" "$samples" <<'PY'
import statistics, sys
path, limit, samples = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = {}
for line in open(path):
    f = line.split()
    runs.setdefault((f[0], int(f[1]), int(f[2])), []).append(f[4:])
def med(key, i):
    vals = runs.get(key, [])
    if not vals or any(v[0] == "failed" for v in vals):
        return None
    return statistics.median(float(v[i]) for v in vals)
reps = len(next(iter(runs.values())))
print(f"ddp-train, one epoch of {samples:,} samples, 784-256-256-10, batch 64 per rank; "
      f"median of {reps} interleaved runs")
print()
print(f"| ranks | busy programs | in memory (samples/s) | limited to {limit} MiB (samples/s) | "
      "limited ÷ in memory | peak memory of the limited job (MiB) |")
print("|---:|---:|---:|---:|---:|---:|")
keys = sorted({(n, load) for (_, n, load) in runs}, key=lambda k: (k[1], k[0]))
for n, load in keys:
    mem, lim, peak = med(("memory", n, load), 0), med(("limited", n, load), 0), med(("limited", n, load), 1)
    f = lambda v, spec: format(v, spec) if v is not None else "failed"
    ratio = f"{lim / mem:.2f}" if mem and lim else "-"
    print(f"| {n} | {load} | {f(mem, ',.0f')} | {f(lim, ',.0f')} | {ratio} | {f(peak, ',.0f')} |")
PY
