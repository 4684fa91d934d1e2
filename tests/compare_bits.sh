#!/usr/bin/env bash
# Same config, same seed, same world size => the same weights, bit for bit, before and after a
# change that must not alter training (a refactor, a new layout). Runs two ddp-train binaries
# through the same cases and compares every model.safetensors with cmp.
#   tests/compare_bits.sh [--ref GITREF | --baseline BIN] [--current BIN] [--cases "a b ..."]
#                         [--keep]
# --ref builds ddp-train of GITREF (default: HEAD, i.e. the last commit, against the working
# tree) in a temporary worktree, CPU only; --baseline takes an existing binary instead.
# --current defaults to $DDP_TRAIN, then build/ddp-train. Prints one line per case and exits 1
# when any case differs or fails. Needs the Fashion-MNIST data (launch/install-deps).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
ref="HEAD" baseline="" current="${DDP_TRAIN:-$root/build/ddp-train}" keep=0
all_cases="fashion_n1 fashion_n2 fashion_n4 fashion_accum_n2 fashion_nesterov_n4 seed_n2 \
csv_n2 synthetic_skip_n2 shard_fused_n2 shard_riders_n2 shard_clip_n4 bf16_n2 fp16_shard_n4 \
resume_n2 resume_n2_to_n4 resume_baseline_n2 resume_shard_n2"
cases="$all_cases"
while (($#)); do
  case "$1" in
    --ref) ref="${2:?--ref needs a git revision}"; shift 2 ;;
    --baseline) baseline="${2:?--baseline needs a ddp-train binary}"; shift 2 ;;
    --current) current="${2:?--current needs a ddp-train binary}"; shift 2 ;;
    --cases) cases="${2:?--cases needs a list}"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare_bits.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for c in $cases; do
  [[ " $all_cases " == *" $c "* ]] || { echo "compare_bits.sh: unknown case $c (known: $all_cases)" >&2; exit 2; }
done
[[ -x "$current" ]] || { echo "compare_bits.sh: no ddp-train at $current (build it, or --current)" >&2; exit 2; }
fashion=/usr/share/datasets/fashion-mnist
[[ -f "$fashion/train-images-idx3-ubyte.gz" ]] ||
  { echo "compare_bits.sh: Fashion-MNIST not found in $fashion (launch/install-deps)" >&2; exit 2; }
if [[ "$(id -u)" == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/compare_bits.XXXXXX")"
status=0
cleanup() {
  if [[ -d "$work/tree" ]]; then git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; fi
  if ((keep || status)); then echo "compare_bits.sh: runs and logs kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

if [[ -z "$baseline" ]]; then
  echo "compare_bits.sh: building ddp-train of $ref ($(git -C "$root" rev-parse --short "$ref"))" >&2
  git -C "$root" worktree add --detach "$work/tree" "$ref" >/dev/null 2>&1
  cmake -S "$work/tree" -B "$work/tree/build" -DCMAKE_BUILD_TYPE=Release -DDDP_CUDA=OFF \
    -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_BENCH=OFF > "$work/cmake.log" 2>&1 ||
    { tail -20 "$work/cmake.log" >&2; exit 2; }
  cmake --build "$work/tree/build" -j "$(nproc)" --target ddp-train > "$work/build.log" 2>&1 ||
    { tail -20 "$work/build.log" >&2; exit 2; }
  baseline="$work/tree/build/ddp-train"
fi
[[ -x "$baseline" ]] || { echo "compare_bits.sh: no baseline binary at $baseline" >&2; exit 2; }

# A small CSV data set: 3 classes of 6 features, deterministic.
awk 'BEGIN { for (i = 0; i < 600; i++) { row = ""; for (j = 0; j < 6; j++) row = row sprintf("%.4f,", sin(i * 0.37 + j * 1.3)); print row (i % 3) } }' > "$work/data.csv"

# case NAME -> "RANKS CONFIG ARGS..." (fashion: the shipped config, shortened; every case keeps
# momentum, weight decay or accumulation where the trainer has a code path for it).
fashion_args=(--set training.max_steps=150 --set training.log_every=25
              --set optimizer.weight_decay=0.0005 --set distributed.bucket_cap_mb=0.2
              --set distributed.first_bucket_mb=0.05)
case_args() {
  case "$1" in
    fashion_n1) echo 1 "$root/configs/fashion_mnist.yaml" "${fashion_args[@]}" ;;
    fashion_n2) echo 2 "$root/configs/fashion_mnist.yaml" "${fashion_args[@]}" ;;
    fashion_n4) echo 4 "$root/configs/fashion_mnist.yaml" "${fashion_args[@]}" ;;
    fashion_accum_n2)
      echo 2 "$root/configs/fashion_mnist.yaml" "${fashion_args[@]}" \
        --set training.accumulate_steps=3 --set data.drop_last=true ;;
    fashion_nesterov_n4)
      echo 4 "$root/configs/fashion_mnist.yaml" "${fashion_args[@]}" \
        --set optimizer.nesterov=true --set training.batch_size=17 ;;
    seed_n2) echo 2 "$root/configs/seed.yaml" --set training.print_shapes=false ;;
    csv_n2)
      echo 2 "$root/configs/csv_example.yaml" --set data.dir= --set "data.train.path=$work/data.csv" \
        --set data.test.path= --set data.csv_header=false --set model.layers=[6,8,3] --set training.epochs=3 ;;
    synthetic_skip_n2)
      echo 2 "$root/configs/seed.yaml" --set training.print_shapes=false \
        --set training.nan_policy=skip_step --set optimizer.momentum=0.5 --set optimizer.lr=0.05 ;;
    # The gradient paths: the sharded update fused into the reduce-scatters, its totals riding
    # on the allgather, travelling first (clipping); 16-bit buckets, sharded or not.
    shard_fused_n2)
      echo 2 "$root/configs/fashion_mnist.yaml" "${fashion_args[@]}" \
        --set distributed.shard_optimizer=true --set distributed.overlap_optimizer=true ;;
    shard_riders_n2)
      echo 2 "$root/configs/fashion_mnist.yaml" "${fashion_args[@]}" \
        --set distributed.shard_optimizer=true --set distributed.overlap_optimizer=false ;;
    shard_clip_n4)
      echo 4 "$root/configs/fashion_mnist.yaml" "${fashion_args[@]}" \
        --set distributed.shard_optimizer=true --set training.clip_grad_norm=0.5 ;;
    bf16_n2)
      echo 2 "$root/configs/fashion_mnist.yaml" "${fashion_args[@]}" \
        --set distributed.compression=bf16 --set distributed.compression_on_node=true ;;
    fp16_shard_n4)
      echo 4 "$root/configs/fashion_mnist.yaml" "${fashion_args[@]}" \
        --set distributed.compression=fp16 --set distributed.compression_on_node=true \
        --set distributed.shard_optimizer=true ;;
    *) return 1 ;;
  esac
}

# run BINARY OUTDIR RANKS CONFIG ARGS...: one training run; its log beside OUTDIR.
run() {
  local bin="$1" out="$2" n="$3" config="$4"
  shift 4
  mpirun -n "$n" --oversubscribe --bind-to none "$bin" --config "$config" \
    --set "output.dir=$out" "$@" > "$out.log" 2>&1
}

# A resume case: stop after half the steps with a checkpoint, resume (on another world size in
# the _to_n4 case, with the same global batch) to the end.
# resume_baseline_n2: the first part always runs the baseline, so the current binary
# resumes a checkpoint the baseline wrote (a file format change must keep reading old ones).
# resume_shard_n2: sharded, the optimizer state gathered into the checkpoint and cut again.
run_resume() {  # BINARY OUTDIR CASE
  local bin="$1" out="$2" second=2 batch2=64 first_bin="$1"
  [[ "$3" == resume_n2_to_n4 ]] && second=4 batch2=32
  [[ "$3" == resume_baseline_n2 ]] && first_bin="$baseline"
  local common=("$root/configs/fashion_mnist.yaml" "${fashion_args[@]}"
                --set checkpoint.every_steps=40 --set checkpoint.keep_last=0)
  [[ "$3" == resume_shard_n2 ]] && common+=(--set distributed.shard_optimizer=true)
  run "$first_bin" "$out" 2 "${common[@]}" --set training.max_steps=80 || return 1
  mv "$out.log" "$out.first.log"
  run "$bin" "$out" "$second" "${common[@]}" --set training.batch_size="$batch2" \
    --set training.resume=auto || return 1
}

# same_checkpoint A B: the same tensors, bytes and metadata, but for ddp.run and ddp.crc32.
same_checkpoint() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def parts(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.get("__metadata__", {})
    for key in ("ddp.run", "ddp.crc32"):
        meta.pop(key, None)
    return header, data[8 + n:]
sys.exit(0 if parts(sys.argv[1]) == parts(sys.argv[2]) else 1)
PY
}

printf '%-22s %s\n' "case" "model.safetensors, baseline vs current"
for c in $cases; do
  for side in baseline current; do
    bin="$baseline"; [[ $side == current ]] && bin="$current"
    out="$work/$c.$side"
    if [[ $c == resume_* ]]; then
      run_resume "$bin" "$out" "$c" || { echo "$c: $side run failed: $(tail -3 "$out.log")" >&2; }
    else
      read -r -a args <<< "$(case_args "$c")"
      run "$bin" "$out" "${args[@]}" || { echo "$c: $side run failed: $(tail -3 "$out.log")" >&2; }
    fi
  done
  a="$work/$c.baseline/model.safetensors" b="$work/$c.current/model.safetensors"
  if [[ ! -f "$a" || ! -f "$b" ]]; then
    result="FAILED (no model.safetensors: see $work/$c.*.log)"; status=1
  elif cmp -s "$a" "$b"; then
    result="identical ($(stat -c %s "$b") bytes)"
    # The checkpoints a case wrote, file by file (their metadata too, but the run's random name
    # and the checksum that covers it).
    for ck in "$work/$c.baseline"/checkpoints/*.safetensors; do
      [[ -e "$ck" ]] || continue
      other="$work/$c.current/checkpoints/$(basename "$ck")"
      if same_checkpoint "$ck" "$other"; then
        result+=", $(basename "$ck") identical"
      else
        result="DIFFERENT: checkpoints/$(basename "$ck")"; status=1
      fi
    done
  else
    result="DIFFERENT"; status=1
  fi
  printf '%-22s %s\n' "$c" "$result"
done
exit "$status"
