# Bad data files through the real binary on 2 ranks: each error names the file and says what is
# wrong with it, ends every rank with a non-zero code, and never hangs. (YAML errors, unknown
# keys, CSV labels >= classes and width mismatches are in test_errors.sh.)
source "$(dirname "$0")/lib.sh"

# be32 V: V as 4 big-endian bytes (printf escapes; bash's printf writes \x00 as a NUL byte).
be32() {
  printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) \
    $(($1 & 255))
}
# idx_images FILE N ROWS COLS [MAGIC]: an IDX images file with N*ROWS*COLS pixel bytes.
idx_images() {
  local file="$1" n="$2" rows="$3" cols="$4" magic="${5:-0x803}" i
  printf "$(be32 "$magic")$(be32 "$n")$(be32 "$rows")$(be32 "$cols")" >"$file"
  for ((i = 0; i < n * rows * cols; ++i)); do
    printf "\\x$(printf %02x $((i * 37 % 256)))"
  done >>"$file"
}
# idx_labels FILE LABEL...: an IDX labels file.
idx_labels() {
  local file="$1" l; shift
  printf "$(be32 0x801)$(be32 $#)" >"$file"
  for l in "$@"; do printf "\\x$(printf %02x "$l")"; done >>"$file"
}
# idx_config IMAGES LABELS [CLASSES]: a config training on that IDX pair (2x3-pixel images).
idx_config() {
  cat <<YAML
model: {layers: [6, 8, ${3:-10}]}
data: {format: idx, train: {images: $1, labels: $2}}
training: {batch_size: 1, log_every: 0}
output: {dir: $WORK/out}
YAML
}

idx_images "$WORK/img" 4 2 3
idx_labels "$WORK/lbl" 7 0 9 1
idx_config "$WORK/img" "$WORK/lbl" >"$WORK/good-idx.yaml"
# The baseline: the same files train, so each failure below comes from the one defect it adds.
checks=$((checks + 1))
run_ranks 2 60 --config "$WORK/good-idx.yaml" --set training.epochs=1
if ((rc == 0)); then
  pass "valid IDX pair trains"
else
  fail "valid IDX pair: rc $rc"; echo "$out" | tail -5
fi

idx_images "$WORK/magic" 4 2 3 0x12345678
idx_config "$WORK/magic" "$WORK/lbl" >"$WORK/c.yaml"
expect_error "IDX wrong magic" 2 "$WORK/magic: wrong magic number 0x12345678, expected 0x00000803" \
  --config "$WORK/c.yaml"

idx_config "$WORK/lbl" "$WORK/img" >"$WORK/c.yaml"
expect_error "IDX images and labels swapped" 2 "$WORK/lbl: wrong magic number 0x00000801" \
  --config "$WORK/c.yaml"

head -c 30 "$WORK/img" >"$WORK/short"  # 16-byte header, then 14 of the 24 pixels
idx_config "$WORK/short" "$WORK/lbl" >"$WORK/c.yaml"
expect_error "IDX truncated data" 2 \
  "$WORK/short: truncated data: expected 24 bytes after the 16-byte header, got 14" \
  --config "$WORK/c.yaml"

head -c 10 "$WORK/img" >"$WORK/short-header"
idx_config "$WORK/short-header" "$WORK/lbl" >"$WORK/c.yaml"
expect_error "IDX truncated header" 2 \
  "$WORK/short-header: truncated header: expected 16 bytes, got 10" --config "$WORK/c.yaml"

gzip -c "$WORK/img" | head -c 20 >"$WORK/cut.gz"
idx_config "$WORK/cut.gz" "$WORK/lbl" >"$WORK/c.yaml"
expect_error "IDX gzip stream cut short" 2 "$WORK/cut.gz: truncated" --config "$WORK/c.yaml"

idx_labels "$WORK/lbl3" 7 0 9
idx_config "$WORK/img" "$WORK/lbl3" >"$WORK/c.yaml"
expect_error "IDX image/label count mismatch" 2 \
  "image/label count mismatch: $WORK/img has 4 images but $WORK/lbl3 has 3 labels" \
  --config "$WORK/c.yaml"

idx_images "$WORK/img0" 0 2 3
idx_labels "$WORK/lbl0"
idx_config "$WORK/img0" "$WORK/lbl0" >"$WORK/c.yaml"
expect_error "IDX zero samples" 2 "$WORK/img0: zero samples" --config "$WORK/c.yaml"

printf "$(be32 0x803)$(be32 0xffffffff)$(be32 0xffffffff)$(be32 0xffffffff)" >"$WORK/huge"
printf "$(be32 0x801)$(be32 0xffffffff)" >"$WORK/huge-lbl"
idx_config "$WORK/huge" "$WORK/huge-lbl" >"$WORK/c.yaml"
expect_error "IDX header sizes overflow" 2 "$WORK/huge: header claims 4294967295 images" \
  --config "$WORK/c.yaml"

idx_config "$WORK/img" "$WORK/lbl" 3 >"$WORK/c.yaml"
expect_error "IDX label outside [0, classes)" 2 \
  "$WORK/img (labels $WORK/lbl): label 7 at sample 0 is outside [0, 3)" --config "$WORK/c.yaml"

csv_config() {
  cat <<YAML
model: {layers: [4, 8, 3]}
data: {format: csv, train: {path: $1}}
training: {batch_size: 1, log_every: 0}
output: {dir: $WORK/out}
YAML
}
printf '0.1,0.2,0.3,0.4,1\n0.5,0.6,0.7,0.8,2\n0.9,1.0,1.1,1\n1.3,1.4,1.5,1.6,1\n' >"$WORK/ragged.csv"
csv_config "$WORK/ragged.csv" >"$WORK/c.yaml"
expect_error "CSV ragged row" 2 "$WORK/ragged.csv:3: expected 5 fields (as in the first row), got 4" \
  --config "$WORK/c.yaml"

printf '0.1,0.2,0.3,0.4,1\n0.5,abc,0.7,0.8,2\n' >"$WORK/text.csv"
csv_config "$WORK/text.csv" >"$WORK/c.yaml"
expect_error "CSV non-numeric field" 2 "$WORK/text.csv:2, column 2: 'abc' is not a number" \
  --config "$WORK/c.yaml"

printf '0.1,0.2,0.3,0.4,1\n0.5,inf,0.7,0.8,2\n' >"$WORK/inf.csv"
csv_config "$WORK/inf.csv" >"$WORK/c.yaml"
expect_error "CSV non-finite field" 2 "$WORK/inf.csv:2, column 2: 'inf' is not a finite number" \
  --config "$WORK/c.yaml"

printf '0.1,0.2,0.3,0.4,one\n' >"$WORK/label.csv"
csv_config "$WORK/label.csv" >"$WORK/c.yaml"
expect_error "CSV non-integer label" 2 \
  "$WORK/label.csv:1, column 5 (label): 'one' is not a non-negative integer" --config "$WORK/c.yaml"

: >"$WORK/empty.csv"
csv_config "$WORK/empty.csv" >"$WORK/c.yaml"
expect_error "CSV empty file" 2 "$WORK/empty.csv: no data rows" --config "$WORK/c.yaml"

printf 'a,b,c,d,label\n' >"$WORK/header.csv"
csv_config "$WORK/header.csv" >"$WORK/c.yaml"
expect_error "CSV header only" 2 "$WORK/header.csv: no data rows after the header" \
  --config "$WORK/c.yaml" --set data.csv_header=true

# --- .npy: ddp-train convert, and what data.format npy refuses ---------------------------------
# npy FILE DESCR SHAPE DATA_BYTES: a .npy file (version 1.0, header padded to 64 bytes as numpy
# writes it) of DATA_BYTES bytes of data (each i * 37 % 256).
npy() {
  local file="$1" descr="$2" shape="$3" bytes="$4" i
  local dict="{'descr': '$descr', 'fortran_order': False, 'shape': $shape, }"
  while (((10 + ${#dict} + 1) % 64 != 0)); do dict+=" "; done
  local len=$((${#dict} + 1))
  printf "\\x93NUMPY\\x01\\x00\\x$(printf %02x $((len & 255)))\\x$(printf %02x $((len >> 8)))" >"$file"
  printf '%s\n' "$dict" >>"$file"
  for ((i = 0; i < bytes; ++i)); do printf "\\x$(printf %02x $((i * 37 % 256)))"; done >>"$file"
}
# npy_config FEATURES LABELS [CLASSES]: the IDX config's model and batches on a .npy pair.
npy_config() {
  cat <<YAML
model: {layers: [6, 8, ${3:-10}]}
data: {format: npy, train: {features: $1, labels: $2}}
training: {batch_size: 1, log_every: 0}
output: {dir: $WORK/out}
YAML
}
# convert_expect NAME MESSAGE ARGS...: ddp-train convert ARGS fails with exit 1 and MESSAGE.
convert_expect() {
  local name="$1" message="$2"; shift 2
  checks=$((checks + 1))
  local got code=0
  got="$(timeout 60 "$DDP_TRAIN" convert "$@" 2>&1)" || code=$?
  if ((code == 1)) && grep -qF -- "$message" <<<"$got"; then
    pass "convert: $name"
  else
    fail "convert: $name: exit $code, output:"; echo "$got" | tail -5
  fi
}

# The user's path: convert the IDX pair, train on both, the same weights.
checks=$((checks + 1))
if "$DDP_TRAIN" convert --format idx --images "$WORK/img" --labels "$WORK/lbl" --out "$WORK/npy" \
     >"$WORK/convert.log" 2>&1 && grep -qF "data: {format: npy, train: {features: $WORK/npy/features.npy" "$WORK/convert.log"; then
  pass "convert writes the pair and says how to train on it"
else
  fail "convert of a valid IDX pair:"; cat "$WORK/convert.log"
fi
npy_config "$WORK/npy/features.npy" "$WORK/npy/labels.npy" >"$WORK/good-npy.yaml"
checks=$((checks + 1))
run_ranks 2 60 --config "$WORK/good-idx.yaml" --set training.epochs=2 --set "output.dir=$WORK/from-idx"
rc_idx=$rc
run_ranks 2 60 --config "$WORK/good-npy.yaml" --set training.epochs=2 --set "output.dir=$WORK/from-npy"
if ((rc_idx == 0 && rc == 0)) && cmp -s "$WORK/from-idx/model.safetensors" "$WORK/from-npy/model.safetensors"; then
  pass "the converted .npy pair trains to the IDX pair's weights, bitwise"
else
  fail "IDX rc $rc_idx, npy rc $rc, or their weights differ"; echo "$out" | tail -5
fi

convert_expect "on a missing file, naming it" "$WORK/nope" --format idx --images "$WORK/nope" \
  --labels "$WORK/lbl" --out "$WORK/npy2"
convert_expect "without --labels" "convert: --format idx needs --images and --labels" \
  --format idx --images "$WORK/img" --out "$WORK/npy2"
printf '0.1,0.2,0.3,0.4,1\n' >"$WORK/ok.csv"
printf 'a file\n' >"$WORK/a-file"
convert_expect "into a file" "convert: --out $WORK/a-file: cannot create the directory" \
  --format csv --data "$WORK/ok.csv" --out "$WORK/a-file"
checks=$((checks + 1))
run_ranks 2 60 convert --format idx --images "$WORK/img" --labels "$WORK/lbl" --out "$WORK/npy3"
if ((rc == 1)) && grep -qF "convert runs in one process (it was launched on 2 ranks)" <<<"$out" &&
   [[ "$rank_codes" == "1 1 " ]]; then
  pass "convert on 2 ranks: refused on both"
else
  fail "convert on 2 ranks: rc $rc, rank codes '$rank_codes'"; echo "$out" | tail -5
fi

npy "$WORK/f8.npy" '<f8' '(4, 6)' 192
npy_config "$WORK/f8.npy" "$WORK/npy/labels.npy" >"$WORK/c.yaml"
expect_error "npy float64 features" 2 \
  "npy file '$WORK/f8.npy': descr '<f8': features must be uint8 (read as v/255), float16 or float32" \
  --config "$WORK/c.yaml"

npy "$WORK/short.npy" '|u1' '(4, 2, 3)' 20
npy_config "$WORK/short.npy" "$WORK/npy/labels.npy" >"$WORK/c.yaml"
expect_error "npy truncated features" 2 "npy file '$WORK/short.npy': truncated data" \
  --config "$WORK/c.yaml"

npy "$WORK/y2d.npy" '|u1' '(4, 1)' 4
npy_config "$WORK/npy/features.npy" "$WORK/y2d.npy" >"$WORK/c.yaml"
expect_error "npy labels of 2 dimensions" 2 \
  "npy file '$WORK/y2d.npy': shape (4, 1): labels need (samples,)" --config "$WORK/c.yaml"

npy "$WORK/y3.npy" '|u1' '(3,)' 3
npy_config "$WORK/npy/features.npy" "$WORK/y3.npy" >"$WORK/c.yaml"
expect_error "npy count mismatch" 2 "has 4 samples (shape (4, 6)) but npy file '$WORK/y3.npy' has 3 labels" \
  --config "$WORK/c.yaml"

npy "$WORK/ybig.npy" '|u1' '(4,)' 4  # labels 0, 37, 74, 111
npy_config "$WORK/npy/features.npy" "$WORK/ybig.npy" >"$WORK/c.yaml"
expect_error "npy label outside the classes" 2 "label 37 at sample 1 is outside [0, 10)" \
  --config "$WORK/c.yaml"

# --- non-finite features: float32 .npy (a CSV's floats, converted) with a NaN --------------------
# expect_abort NAME N MESSAGE ARGS...: an error that one rank sees inside training (the others
# wait in the step's allreduce) ends the job at once, long before distributed.timeout_s (600 s):
# MESSAGE from that rank, which exits 1, and mpiexec returns 1.
expect_abort() {
  local name="$1"
  run_for_message "$@" || return
  if ((rc != 1 || elapsed > 30)) || [[ " $rank_codes" != *" 1 "* ]]; then
    fail "$name: mpiexec $rc after ${elapsed}s, rank codes '$rank_codes'"; echo "$out" | tail -8
    return
  fi
  pass "$name (${elapsed}s, rank codes: $rank_codes)"
}
printf '0.1,0.2,0.3,0.4,1\n0.5,0.6,0.7,0.8,2\n0.9,1.0,1.1,1.2,1\n1.3,1.4,1.5,1.6,0\n' >"$WORK/floats.csv"
"$DDP_TRAIN" convert --format csv --data "$WORK/floats.csv" --out "$WORK/f32" >/dev/null
npy_config "$WORK/f32/features.npy" "$WORK/f32/labels.npy" 3 >"$WORK/f32.yaml"
four=(--set "model.layers=[4, 8, 3]" --set training.epochs=1)
checks=$((checks + 1))
run_ranks 2 60 --config "$WORK/f32.yaml" "${four[@]}"
if ((rc == 0)); then pass "the float32 .npy pair trains"; else fail "float32 .npy: rc $rc"; fi
# The 64 data bytes end the file; sample 2, feature 3 becomes a NaN.
cp "$WORK/f32/features.npy" "$WORK/nan.npy"
printf '\x00\x00\xc0\x7f' | dd of="$WORK/nan.npy" bs=1 conv=notrunc status=none \
  seek=$(($(stat -c %s "$WORK/nan.npy") - 64 + (2 * 4 + 3) * 4))
npy_config "$WORK/nan.npy" "$WORK/f32/labels.npy" 3 >"$WORK/c.yaml"
expect_abort "npy NaN feature: the batch's rank names file, sample and feature at once" 2 \
  "$WORK/nan.npy (labels $WORK/f32/labels.npy): sample 2, feature 3 is nan (features must be finite)" \
  --config "$WORK/c.yaml" "${four[@]}"
expect_error "npy NaN feature, standardised: every rank names it before training" 2 \
  "$WORK/nan.npy (labels $WORK/f32/labels.npy): sample 2, feature 3 is nan (features must be finite)" \
  --config "$WORK/c.yaml" "${four[@]}" --set data.normalize=standardize

# The output directory cannot be written: the tests run as root, which permission bits do not
# stop, so use an existing regular file, and a directory of /proc that exists but takes no files.
printf 'not a directory\n' >"$WORK/out-file"
expect_error "output.dir is a regular file" 2 "output.dir: cannot create $WORK/out-file" \
  --config "$WORK/good-idx.yaml" --set "output.dir=$WORK/out-file"
expect_error "output.dir exists but takes no files" 2 "output.dir: cannot open the lock file '/proc/self/fdinfo/.ddp-lock'" \
  --config "$WORK/good-idx.yaml" --set output.dir=/proc/self/fdinfo

finish
