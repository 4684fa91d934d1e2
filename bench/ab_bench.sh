#!/usr/bin/env bash
# Two ddp-train binaries side by side: training samples/s of each on the same config, runs
# interleaved (old, new, old, new, ...) so drift on a shared machine hits both alike, idle and
# beside one busy program. Prints every run, sorted, and the medians.
#   bench/ab_bench.sh BASELINE CURRENT [--runs N] [--ranks N] [-- ddp-train args...]
# Default args: configs/fashion_mnist.yaml for 1,500 optimizer steps (800 under load).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
source "$here/background_load.sh"
trap stop_load EXIT
(($# >= 2)) || { sed -n '5,6p' "$0" | sed 's/^# //'; exit 2; }
baseline="$1" current="$2"; shift 2
runs=5 ranks=2 args=()
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --) shift; args=("$@"); break ;;
    *) echo "ab_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$(id -u)" == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d "${TMPDIR:-/tmp}/ab_bench.XXXXXX")"
trap 'stop_load; rm -rf "$work"' EXIT

# rate BINARY STEPS: one run's samples/s from its summary line.
rate() {
  local dir="$work/run$RANDOM$RANDOM" a=("${args[@]}")
  ((${#a[@]})) || a=(--config "$root/configs/fashion_mnist.yaml" --set "training.max_steps=$2")
  mpirun -n "$ranks" --oversubscribe --bind-to none "$1" "${a[@]}" --set training.log_every=0 \
    --set "output.dir=$dir" --set output.save_model=false 2>&1 |
    grep -o '([0-9]* samples/s' | tr -dc '0-9'
  rm -rf "$dir"
}

median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

printf '| %s | binary | runs (samples/s, sorted) | median |\n|---|---|---|---:|\n' "$ranks ranks"
for mode in idle loaded; do
  steps=1500
  if [[ $mode == loaded ]]; then start_load 1; steps=800; fi
  declare -A seen=([baseline]="" [current]="")
  for ((i = 0; i < runs; ++i)); do
    seen[baseline]+="$(rate "$baseline" "$steps") "
    seen[current]+="$(rate "$current" "$steps") "
  done
  for side in baseline current; do
    sorted="$(tr ' ' '\n' <<<"${seen[$side]}" | grep . | sort -n | tr '\n' ' ')"
    printf '| %s | %s | %s | %s |\n' "$mode" "$side" "$sorted" "$(tr ' ' '\n' <<<"$sorted" | grep . | median)"
  done
  stop_load
done
