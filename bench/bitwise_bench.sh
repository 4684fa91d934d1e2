#!/usr/bin/env bash
# What training.bitwise_across_world_sizes costs: training samples/s of the default path and of
# the exact chunk sums (one row per chunk size) at each world size, on the same config with the
# same per-rank batch, runs interleaved (default, chunk sizes..., default, ...) so drift on a
# shared machine hits all alike, idle or beside --load busy programs. Prints every run's rate,
# the medians and each median against the default's at that world size.
#   bench/bitwise_bench.sh [--bin ddp-train] [--ranks "1 2 4"] [--chunks "8 16 32"] [--runs 5]
#                          [--steps 600] [--load 0] [-- ddp-train args...]
# Default args: configs/fashion_mnist.yaml (784-256-256-10, batch 64 per rank, SGD momentum).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
source "$here/background_load.sh"
bin="$root/build/ddp-train" ranks="1 2 4" chunks="8 16 32" runs=5 steps=600 load=0 args=()
while (($#)); do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --load) load="$2"; shift 2 ;;
    --) shift; args=("$@"); break ;;
    *) echo "bitwise_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
((${#args[@]})) || args=(--config "$root/configs/fashion_mnist.yaml")
[[ -x "$bin" ]] || { echo "bitwise_bench.sh: no $bin (build ddp-train first)" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d "${TMPDIR:-/tmp}/bitwise_bench.XXXXXX")"
trap 'stop_load; rm -rf "$work"' EXIT

# rate RANKS CHUNK: one run's samples/s from its summary line (CHUNK 0: the default path).
rate() {
  local dir="$work/run$RANDOM$RANDOM" mode=()
  (($2)) && mode=(--set training.bitwise_across_world_sizes=true --set "training.bitwise_chunk_size=$2")
  mpirun -n "$1" --oversubscribe --bind-to none "$bin" "${args[@]}" "${mode[@]}" \
    --set data.drop_last=true --set "training.max_steps=$steps" --set training.log_every=0 \
    --set "output.dir=$dir" --set output.save_model=false 2>&1 |
    grep -o '([0-9]* samples/s' | tr -dc '0-9' || true
  rm -rf "$dir"
}

median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

start_load "$load"
printf '| ranks | path | runs (samples/s, sorted) | median | vs default |\n|---:|---|---|---:|---:|\n'
for n in $ranks; do
  declare -A seen=()
  modes="0 $chunks"
  for ((i = 0; i < runs; ++i)); do
    for c in $modes; do seen[$c]+="$(rate "$n" "$c") "; done
  done
  base=""
  for c in $modes; do
    sorted="$(tr ' ' '\n' <<<"${seen[$c]}" | grep . | sort -n | tr '\n' ' ' || true)"
    [[ -n "$sorted" ]] || { echo "bitwise_bench.sh: no rate for $n ranks, chunk $c" >&2; exit 1; }
    med="$(tr ' ' '\n' <<<"$sorted" | grep . | median)"
    [[ -n "$base" ]] || base="$med"
    name="default"; ((c)) && name="bitwise, chunk $c"
    printf '| %s | %s | %s | %s | %s |\n' "$n" "$name" "$sorted" "$med" \
      "$(awk -v m="$med" -v b="$base" 'BEGIN {printf "%.2fx", m / b}')"
  done
  unset seen
done
