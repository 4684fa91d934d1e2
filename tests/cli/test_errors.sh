# Bad input through the real binary on 2 ranks: every error names the file, key or rank, ends
# every rank with a non-zero code, and never hangs.
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"
quick=(--set "output.dir=$WORK/out" --set training.epochs=1)

expect_error "missing config file" 2 "$WORK/nope.yaml" --config "$WORK/nope.yaml"
expect_error "unknown key" 2 "training.bach_size" --config "$seed" "${quick[@]}" --set training.bach_size=3
expect_error "wrong type" 2 "training.batch_size" --config "$seed" "${quick[@]}" --set training.batch_size=abc
expect_error "out of range" 2 "optimizer.lr" --config "$seed" "${quick[@]}" --set optimizer.lr=-1
expect_error "malformed --set" 2 "expected key.path=value" --config "$seed" --set training.epochs

printf 'model: {layers: [4, 3]\n' >"$WORK/broken.yaml"
expect_error "invalid YAML" 2 "broken.yaml" --config "$WORK/broken.yaml"

cat >"$WORK/idx.yaml" <<YAML
model: {layers: [784, 10]}
data:
  format: idx
  train: {images: $WORK/missing-images.gz, labels: $WORK/missing-labels.gz}
output: {dir: $WORK/out}
YAML
expect_error "missing data file" 2 "missing-images.gz" --config "$WORK/idx.yaml"

printf '0.1,0.2,0.3,0.4,1\n0.5,0.6,0.7,0.8,2\n0.9,1.0,1.1,1.2,0\n1.3,1.4,1.5,1.6,1\n' >"$WORK/four.csv"
printf '0.1,0.2,0.3,0.4,1\n0.5,0.6,0.7,0.8,5\n0.9,1.0,1.1,1.2,0\n1.3,1.4,1.5,1.6,1\n' >"$WORK/badlabel.csv"
csv_config() {
  cat <<YAML
model: {layers: [$1, 8, 3]}
data: {format: csv, train: {path: $2}}
training: {batch_size: 1, log_every: 0}
output: {dir: $WORK/out}
YAML
}
csv_config 5 "$WORK/four.csv" >"$WORK/width.yaml"
expect_error "input width != first layer" 2 "model.layers[0]" --config "$WORK/width.yaml"
csv_config 4 "$WORK/badlabel.csv" >"$WORK/label.yaml"
expect_error "label >= classes" 2 "label 5" --config "$WORK/label.yaml"
csv_config 4 "$WORK/four.csv" >"$WORK/ok.yaml"
expect_error "batch larger than shard with drop_last" 2 "training.batch_size" --config "$WORK/ok.yaml" \
  --set training.batch_size=3 --set data.drop_last=true
expect_error "output dir not creatable" 2 "output.dir" --config "$WORK/ok.yaml" --set output.dir=/proc/ddp/out

# GPU requests that cannot be met (on a machine without a GPU, or a build without CUDA).
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_error "device cuda without a GPU" 2 "device: cuda" --config "$seed" "${quick[@]}" --set device=cuda
fi
expect_error "nccl on the CPU" 2 "distributed.backend: nccl" --config "$seed" "${quick[@]}" \
  --set distributed.backend=nccl --set device=cpu
expect_error "unknown device" 2 "device: must be one of cpu, cuda, auto" --config "$seed" "${quick[@]}" --set device=tpu
mkdir -p "$WORK/tdir/trace.json"  # a directory where the trace file should go
expect_error "trace file cannot be written" 2 "trace.json" --config "$seed" "${quick[@]}" \
  --set output.trace=true --set "output.dir=$WORK/tdir"
# Divergence mid-training: loss and gradients turn non-finite, the job stops naming the step
# and the rank whose loss went first.
expect_error "non-finite loss" 2 "non-finite gradient value(s) after the allreduce (the loss was non-finite on rank" \
  --config "$seed" "${quick[@]}" --set optimizer.lr=1e30

# A rank whose config differs (here: a hidden layer of 11 instead of 10) is refused on every rank.
checks=$((checks + 1))
rm -f "$WORK"/rc.*
start=$SECONDS
out="$(timeout 60 "$DDP_MPIEXEC" --oversubscribe \
  -n 1 "$DDP_TRAIN" --config "$seed" "${quick[@]}" : \
  -n 1 "$DDP_TRAIN" --config "$seed" "${quick[@]}" --set 'model.layers=[20, 11, 3]' 2>&1)"
rc=$?
if ((rc == 124)); then
  fail "startup mismatch: hung"
elif ((rc == 0)); then
  fail "startup mismatch: exited 0"
elif ! grep -q "differs from rank 0" <<<"$out" || ! grep -q "model.layers" <<<"$out"; then
  fail "startup mismatch: message missing:"; echo "$out" | tail -5
else
  pass "startup mismatch ($((SECONDS - start))s): $(grep -m1 'differs from rank 0' <<<"$out")"
fi

finish
