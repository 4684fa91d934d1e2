#!/usr/bin/env bash
# What periodic checkpoints cost a run, written in line and in the background (checkpoint.async),
# idle and beside one busy program. The wide MLP (784-1024-1024-10, 1.86 M parameters) with AdamW
# on synthetic data: a checkpoint holds the weights and two state arrays, 21.3 MiB. Runs are
# interleaved (none, in line, async, none, ...) so drift on a shared machine hits all alike.
# Prints ms per step (median of the runs) and what a checkpoint cost the training thread and,
# in the background, the writer (medians over the runs' checkpoint records: the first copy's
# fresh memory and the run's last wait are their own).
#   bench/checkpoint_cost.sh [--runs N] [--ranks N] [--steps N] [--every "N ..."] [--dir DIR]
#     [--loads "0 1"] [--binary PATH]
# DIR holds the checkpoints (default: a folder under TMPDIR); its file system is in the table.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
source "$here/background_load.sh"
runs=3 ranks=2 steps=600 every="100 20" dir="" loads="0 1" binary="$root/build/ddp-train"
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --every) every="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --loads) loads="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    *) sed -n '8,10p' "$0" | sed 's/^# //'; exit 2 ;;
  esac
done
[[ -x "$binary" ]] || { echo "checkpoint_cost.sh: no ddp-train at $binary (build first)" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d "${dir:-${TMPDIR:-/tmp}}/checkpoint_cost.XXXXXX")"
trap 'stop_load; rm -rf "$work"' EXIT

model=(--config "$root/configs/seed.yaml" --set 'model.layers=[784,1024,1024,10]'
  --set data.train.samples=16384 --set training.batch_size=64 --set optimizer.name=adamw
  --set training.epochs=100 --set "training.max_steps=$steps" --set training.log_every=0
  --set training.print_shapes=false --set output.save_model=false --set checkpoint.keep_last=2)

# run MODE EVERY: one run; prints its ms per step on the first line, then "blocked_s write_s"
# for each of its checkpoints.
run() {
  local out="$work/run$RANDOM$RANDOM" extra=()
  case "$1" in
    inline) extra=(--set "checkpoint.every_steps=$2") ;;
    async) extra=(--set "checkpoint.every_steps=$2" --set checkpoint.async=true) ;;
  esac
  mpirun -n "$ranks" --oversubscribe --bind-to none "$binary" "${model[@]}" "${extra[@]}" \
    --set "output.dir=$out" >/dev/null 2>&1
  jq -r --argjson steps "$steps" 'select(.type == "summary") | .seconds * 1000 / $steps' \
    "$out/metrics.jsonl"
  jq -r 'select(.type == "checkpoint") | "\(.seconds) \(.write_seconds // .seconds)"' \
    "$out/metrics.jsonl"
  rm -rf "$out"
}

median() {
  sort -g | awk '{v[NR] = $1} END {if (!NR) print "-"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
# ms COLUMN: the median of column COLUMN (seconds) of stdin's lines, in ms.
ms_of() { awk -v c="$1" 'NF {print $c * 1000}' | median | awk '{print ($1 == "-") ? "-" : sprintf("%.1f", $1)}'; }

fs="$(df -T "$work" | awk 'NR == 2 {print $2}')"
echo "$(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $ranks ranks," \
  "$steps steps of 64 samples per rank, checkpoints on $fs"
echo
printf '| load | checkpoints | ms/step (median of %s) | vs none | training thread per checkpoint (ms, median) | writer per checkpoint (ms, median) |\n' "$runs"
printf '|---|---|---:|---:|---:|---:|\n'
for load in $loads; do
  start_load "$load"
  declare -A ms=() records=()
  cases=(none)
  for n in $every; do cases+=("inline:$n" "async:$n"); done
  for ((i = 0; i < runs; ++i)); do
    for c in "${cases[@]}"; do
      result="$(run "${c%%:*}" "${c#*:}")"
      ms[$c]+="$(head -1 <<<"$result") "
      records[$c]+="$(tail -n +2 <<<"$result")"$'\n'
    done
  done
  stop_load
  base="$(tr ' ' '\n' <<<"${ms[none]}" | grep . | median)"
  for c in "${cases[@]}"; do
    med="$(tr ' ' '\n' <<<"${ms[$c]}" | grep . | median)"
    label="none"
    [[ $c == none ]] || label="${c%%:*} every ${c#*:} steps"
    printf '| %s busy | %s | %.2f | %+.1f%% | %s | %s |\n' "$load" "$label" "$med" \
      "$(awk -v a="$med" -v b="$base" 'BEGIN {print (a / b - 1) * 100}')" \
      "$(ms_of 1 <<<"${records[$c]}")" "$(ms_of 2 <<<"${records[$c]}")"
  done
  unset ms records
done
