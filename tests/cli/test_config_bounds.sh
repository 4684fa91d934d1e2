# Values past a key's bound, and products of keys past 64 bits or the machine's memory, through
# the real binary on 2 ranks: each is refused before anything is allocated, naming the key, with
# exit code 1 on every rank (before, these timed out at once, crashed or died in the allocator).
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"
quick=(--config "$seed" --set "output.dir=$WORK/out" --set training.epochs=1)

# 1e10 s is 1e19 ns: the deadline overflowed int64 and every collective timed out at once.
expect_error "timeout beyond int64 nanoseconds" 2 \
  "--set distributed.timeout_s: must be <= 1e+09, got 1e+10" \
  "${quick[@]}" --set distributed.timeout_s=1e10
# 2^62 x 4 weights wrapped to 0: a SIGSEGV writing the model.
expect_error "layer width whose products wrap" 2 \
  "--set model.layers: model.layers[0]: must be <= 1000000000, got 4611686018427387904" \
  "${quick[@]}" --set 'model.layers=[4611686018427387904,4,3]'
# std::bad_alloc / vector::_M_default_append, naming nothing.
expect_error "prefetch past its bound" 2 \
  "--set data.prefetch: must be <= 65536, got 4611686018427387904" \
  "${quick[@]}" --set data.prefetch=4611686018427387904
expect_error "accumulate_steps past its bound" 2 \
  "--set training.accumulate_steps: must be <= 1000000, got 9223372036854775807" \
  "${quick[@]}" --set training.accumulate_steps=9223372036854775807
# Within each key's bound, but 4e15 bytes of activations for one micro-batch.
expect_error "activations beyond the machine's memory" 2 \
  "--set training.batch_size: the activations of one micro-batch need 4000000000000000 bytes" \
  "${quick[@]}" --set 'model.layers=[20,1000000,3]' --set training.batch_size=1000000000
expect_error "synthetic data beyond the machine's memory" 2 \
  "--set data.train.samples: the generated train samples need 84000000000000 bytes" \
  "${quick[@]}" --set data.train.samples=1000000000000
expect_error "parameters beyond int64" 2 \
  "--set model.layers: the parameters overflow 64-bit integers" \
  "${quick[@]}" --set 'model.layers=[1,1000000000,1000000000,1000000000]'
# A cap under one byte was 0 bytes: "bucket caps must be positive", naming no key.
expect_error "bucket cap under one byte" 2 \
  "--set distributed.bucket_cap_mb: must be >= 9.5367431640625e-07 (one byte), got 1e-300" \
  "${quick[@]}" --set distributed.bucket_cap_mb=1e-300
# 1e-320 is 0 in float32: every feature divided by zero.
expect_error "normalize std that is 0 in float32" 2 \
  "--set data.normalize: data.normalize[1]: std must be a normal float32" \
  "${quick[@]}" --set 'data.normalize=[0, 1e-320]'

checks=$((checks + 1))
listing="$("$DDP_TRAIN" --list-config-keys 2>&1)"
if grep -qE '^distributed\.timeout_s +number +.* in \(0, 1e\+09\] ' <<<"$listing" &&
  grep -qE '^model\.layers +list of integers +.* each in \[1, 1000000000\] ' <<<"$listing"; then
  pass "--list-config-keys shows the bounds"
else
  fail "--list-config-keys shows no bounds:"; grep -E '^(distributed\.timeout_s|model\.layers) ' <<<"$listing"
fi

finish
