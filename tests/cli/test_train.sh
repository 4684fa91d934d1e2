# End to end: the seed config on 2 ranks through ddp-run, its outputs (progress, replica shapes,
# metrics.jsonl, model.safetensors), starting from saved weights, and the launcher's choices.
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"
ddp_run="$DDP_SOURCE_DIR/launch/ddp-run"


out="$(timeout 120 "$ddp_run" -n 2 "$seed" --set "output.dir=$WORK/a" --set training.epochs=2 2>&1)"
rc=$?
echo "$out" | tail -12
check "seed run exits 0" test "$rc" = 0
check "progress lines with lr, gradient norm and throughput" grep -qE '^epoch 1/2 step [0-9]+/20 loss [0-9.]+ acc [0-9.]+% lr 1.00e-03 grad norm [0-9.e+-]+ [0-9]+ samples/s' <<<"$out"
check "replica shapes: each rank gets half of the global batch" grep -qF 'rank 1 replica: input [50, 20] -> output [50, 3]' <<<"$out"
check "global batch shape" grep -qF 'global batch: input [100, 20] -> output [100, 3]' <<<"$out"
check "run summary with overlap" grep -qE '^done: 2 epoch\(s\), 40 steps, 4000 samples .* hidden behind backward' <<<"$out"
check "metrics.jsonl: train, epoch, summary records" bash -c "
  grep -c '\"type\":\"train\"' '$WORK/a/metrics.jsonl' | grep -qx 4 &&
  grep -c '\"type\":\"epoch\"' '$WORK/a/metrics.jsonl' | grep -qx 2 &&
  grep -q '\"type\":\"summary\".*\"world_size\":2' '$WORK/a/metrics.jsonl'"
check "metrics.jsonl: each train record has the step's lr and gradient norm" bash -c "
  grep '\"type\":\"train\"' '$WORK/a/metrics.jsonl' | grep '\"lr\":0.001' | grep -c '\"grad_norm\":' | grep -qx 4"
check "model.safetensors holds layers.{i}.weight [out,in] and bias [out]" bash -c "
  head -c 600 '$WORK/a/model.safetensors' | grep -a -q '\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":\[10,20\]' &&
  head -c 600 '$WORK/a/model.safetensors' | grep -a -q '\"layers.1.bias\":{\"dtype\":\"F32\",\"shape\":\[3\]'"

# The timeline: output.trace writes one Chrome trace with a process per rank and the spans a
# user looks for (per-layer forward/backward, bucket allreduces, optimizer), nested properly.
run_ranks 2 120 --config "$seed" --set "output.dir=$WORK/t" --set output.trace=true \
  --set output.trace_steps=5 --set training.epochs=1 --set device=auto
check "traced run exits 0" test "$rc" = 0
check "device auto without a GPU runs on the CPU" grep -qF 'rank 1: cpu' <<<"$out"
check "trace.json is a valid trace with every rank's spans" python3 "$DDP_SOURCE_DIR/tests/support/check_trace.py" \
  "$WORK/t/trace.json" --ranks 2 --require-track 'training thread' --require-track 'comm thread' \
  --require-span 'forward layers.0+relu.0' --require-span 'backward layers.1+relu.0' \
  --require-span 'backward layers.0' --require-span 'allreduce bucket 0' \
  --require-span 'optimizer (sgd)' --require-span 'step 5' --require-span 'next batch'
check "trace_steps bounds the traced steps" bash -c "! grep -q '\"step 6\"' '$WORK/t/trace.json'"

# training.precision bf16: the startup log says what runs the bf16 GEMMs; on a CPU without
# native bf16 (oneDNN told to use AVX-512 without BF16) it says that is slower than fp32, and why.
run_ranks 2 120 --config "$seed" --set "output.dir=$WORK/bf16" --set training.precision=bf16 \
  --set training.epochs=1
check "bf16 run exits 0" test "$rc" = 0
check "bf16: the precision line" grep -qE '^precision: bf16 GEMM operands on (oneDNN \(|Eigen over operands widened)' <<<"$out"
ONEDNN_MAX_CPU_ISA=AVX512_CORE run_ranks 2 120 --config "$seed" --set "output.dir=$WORK/bf16_slow" \
  --set training.precision=bf16 --set training.epochs=1
check "bf16 without native bf16 runs" test "$rc" = 0
check "bf16 without native bf16: slower than fp32, and why" grep -qE '^precision: bf16 .*slower than fp32 \(this (CPU has no AVX512-BF16 or AMX|build has no oneDNN)' <<<"$out"
check "bf16 weights are float32 in model.safetensors" bash -c "
  head -c 600 '$WORK/bf16/model.safetensors' | grep -a -q '\"layers.0.weight\":{\"dtype\":\"F32\"'"

# Starting from saved weights: with a learning rate too small to change any float, the saved
# weights come back bit for bit.
run_ranks 2 120 --config "$seed" --set "output.dir=$WORK/b" --set "model.init_from=$WORK/a/model.safetensors" \
  --set optimizer.lr=1e-30 --set training.max_steps=2
check "init_from run exits 0" test "$rc" = 0
check "init_from loads the weights exactly" cmp "$WORK/a/model.safetensors" "$WORK/b/model.safetensors"
expect_error "init_from with a different shape" 2 "layers.0.weight" --config "$seed" --set "output.dir=$WORK/c" \
  --set "model.init_from=$WORK/a/model.safetensors" --set 'model.layers=[20, 11, 3]'

# Fashion-MNIST converted to .npy (the commands of configs/fashion_mnist_npy.yaml) trains to the
# IDX config's weights, bitwise, where the dataset is installed.
fmnist=/usr/share/datasets/fashion-mnist
if [[ -d "$fmnist" ]]; then
  for split in train:train t10k:test; do
    "$DDP_TRAIN" convert --format idx --images "$fmnist/${split%%:*}-images-idx3-ubyte.gz" \
      --labels "$fmnist/${split%%:*}-labels-idx1-ubyte.gz" --out "$WORK/fm/${split##*:}" >/dev/null
  done
  run_ranks 2 120 --config "$DDP_SOURCE_DIR/configs/fashion_mnist.yaml" --set "output.dir=$WORK/fm-idx" \
    --set training.max_steps=50 --set training.log_every=0
  rc_idx=$rc
  run_ranks 2 120 --config "$DDP_SOURCE_DIR/configs/fashion_mnist_npy.yaml" --set "data.dir=$WORK/fm" \
    --set "output.dir=$WORK/fm-npy" --set training.max_steps=50 --set training.log_every=0
  check "fashion_mnist_npy.yaml on the converted files runs" test "$rc_idx$rc" = 00
  check "... and says the files are mapped" grep -qF "features read in place from the memory-mapped .npy files" <<<"$out"
  check "... to the IDX config's weights, bitwise" cmp "$WORK/fm-idx/model.safetensors" "$WORK/fm-npy/model.safetensors"
else
  echo "skipped: Fashion-MNIST .npy check ($fmnist not present)"
fi

# The launcher: binds one rank per core when they fit, oversubscribes unbound when not.
cores="$(nproc)"
dry="$(DDP_TRAIN=/bin/true "$ddp_run" -n 1 --dry-run "$seed" --set training.epochs=1 --resume auto)"
check "ddp-run binds ranks to cores when they fit" grep -q -- '--bind-to core' <<<"$dry"
check "ddp-run passes --set through" grep -q -- '--set training.epochs=1' <<<"$dry"
check "ddp-run passes --resume through" grep -q -- '--resume auto' <<<"$dry"
dry="$(DDP_TRAIN=/bin/true "$ddp_run" -n $((cores + 1)) --dry-run "$seed")"
check "ddp-run oversubscribes when ranks exceed cores" grep -q -- '--oversubscribe --bind-to none' <<<"$dry"
check "ddp-run uses DDP_TRAIN" grep -q -- '/bin/true --config' <<<"$dry"
checks=$((checks + 1))
if "$ddp_run" -n 2 "$WORK/missing.yaml" >/dev/null 2>&1; then fail "ddp-run accepted a missing config"; else pass "ddp-run refuses a missing config"; fi
check "ddp-train --help lists the options" bash -c "'$DDP_TRAIN' --help | grep -q -- '--set'"

finish
