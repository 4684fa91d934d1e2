# training.bitwise_across_world_sizes through the real binary: the seed config's 20-10-3 MLP
# with a global batch of 96 (12 chunks of 8) trained on 1, 2, 3 and 4 ranks writes the same
# model.safetensors, byte for byte, for SGD with momentum (two seeds) and for AdamW with clipping
# and a cosine schedule; a run stopped on 4 ranks and resumed on 2 ends with the
# uninterrupted run's file; a batch that is not whole chunks is refused on every rank by name.
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"
bitwise=(--config "$seed" --set training.log_every=0 --set training.print_shapes=false
         --set training.bitwise_across_world_sizes=true --set training.bitwise_chunk_size=8
         --set data.drop_last=true --set training.epochs=3)
sgd=(--set optimizer.lr=0.05 --set optimizer.momentum=0.9 --set optimizer.weight_decay=0.01)
adamw=(--set optimizer.name=adamw --set optimizer.lr=0.01 --set scheduler.name=cosine
       --set scheduler.warmup_steps=5 --set scheduler.total_steps=60
       --set training.clip_grad_norm=0.5)

# train DIR N ARGS...: the bitwise config on N ranks with the global batch of 96, into DIR.
train() {
  local dir="$1" n="$2"; shift 2
  run_ranks "$n" 120 "${bitwise[@]}" --set "training.batch_size=$((96 / n))" \
    --set "output.dir=$dir" "$@"
  if ((rc != 0)); then fail "$dir on $n ranks exited $rc"; echo "$out" | tail -5; return 1; fi
}

# (tests/mpi/test_bitwise_world_sizes.cpp takes more seeds and optimizers, in one process.)
for run in "sgd 0" "sgd 1" "adamw 0"; do
  read -r optimizer training_seed <<<"$run"
  name="$optimizer, seed $training_seed"
  declare -n args="$optimizer"
  for n in 1 2 3 4; do
    train "$WORK/$optimizer$training_seed-$n" "$n" "${args[@]}" \
      --set "training.seed=$training_seed" || continue
  done
  checks=$((checks + 1))
  ref="$WORK/$optimizer$training_seed-1/model.safetensors" differ=""
  for n in 2 3 4; do
    cmp -s "$ref" "$WORK/$optimizer$training_seed-$n/model.safetensors" || differ+="$n "
  done
  if [[ -z "$differ" && -s "$ref" ]]; then
    pass "$name: model.safetensors the same on 1, 2, 3 and 4 ranks"
  else
    fail "$name: model.safetensors differs from 1 rank's on ${differ:-(no file)} ranks"
  fi
done
checks=$((checks + 1))
if cmp -s "$WORK/sgd0-1/model.safetensors" "$WORK/sgd1-1/model.safetensors"; then
  fail "the two seeds trained the same weights: the comparison above proves nothing"
else
  pass "the seeds train different weights"
fi
check "the startup log says which world sizes keep the bits" grep -qF \
  "gradients: summed exactly over 12 chunks of 8 samples per batch" <<<"$out"

# --- stopped on 4 ranks, resumed on 2 -------------------------------------------------------
stopped="$WORK/stopped"
if train "$stopped" 4 "${adamw[@]}" --set training.max_steps=25 --set checkpoint.every_steps=25 &&
  train "$stopped" 2 "${adamw[@]}" --set training.resume=auto; then
  checks=$((checks + 1))
  if cmp -s "$stopped/model.safetensors" "$WORK/adamw0-4/model.safetensors"; then
    pass "stopped at step 25 on 4 ranks, resumed on 2: the uninterrupted run's file"
  else
    fail "stopped on 4 ranks and resumed on 2: the weights differ from the uninterrupted run's"
  fi
  check "the resume says the global batch stays" grep -qF \
    "4 rank(s) in the checkpoint, 2 now; the global batch stays 96" <<<"$out"
fi

# --- refused ---------------------------------------------------------------------------------
expect_error "a batch of 12 per rank (not whole chunks of 8)" 2 \
  "training.bitwise_chunk_size: 8 does not divide training.batch_size 12" \
  "${bitwise[@]}" --set training.batch_size=12 --set "output.dir=$WORK/refused"

finish
