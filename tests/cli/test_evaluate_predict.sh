# ddp-train evaluate and predict end to end: a trained model's evaluation prints what training's
# last evaluation printed (on 1, 2 and 3 ranks), its confusion matrix adds up, its predictions
# agree with the evaluation and with the model computed independently, each misfit between
# model, config and data is refused naming both sides, and a NaN in the weights or the features
# is refused naming where it is.
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"
# Synthetic data with a test split, standardised; the model goes to $WORK/m.
synthetic=(--config "$seed" --set data.test.samples=700 --set data.normalize=standardize)

run_ranks 2 120 "${synthetic[@]}" --set "output.dir=$WORK/m" --set training.epochs=3
check "training exits 0" test "$rc" = 0
trained="$(grep -o 'test loss [0-9.]* acc [0-9.]*%' <<<"$out" | tail -1)"
check "training printed a final evaluation ($trained)" test -n "$trained"
check "model.safetensors carries the normalisation" \
  bash -c "head -c 4000 '$WORK/m/model.safetensors' | grep -a -q 'ddp.normalize.mean'"

for n in 1 2 3; do
  run_ranks "$n" 60 evaluate "${synthetic[@]}" --model "$WORK/m/model.safetensors"
  evaluated="$(grep -o 'test loss [0-9.]* acc [0-9.]*%' <<<"$out")"
  check "evaluate on $n rank(s) exits 0 on every rank" test "$rc $rank_codes" = "0 $(printf '0 %.0s' $(seq "$n"))"
  check "evaluate on $n rank(s) prints training's numbers ($evaluated)" test "$evaluated" = "$trained"
  check "evaluate on $n rank(s) counts all 700 samples" grep -qF "(700 samples)" <<<"$out"
done
# The matrix's cells add up to the samples and its diagonal to the accuracy.
matrix="$(sed -n '/^confusion matrix/,$p' <<<"$out" | tail -n +3)"
check "the confusion matrix has a row per class" test "$(wc -l <<<"$matrix")" = 3
total="$(awk '{for (i = 2; i <= 4; ++i) s += $i} END {print s}' <<<"$matrix")"
diagonal="$(awk '{s += $($1 + 2)} END {print s}' <<<"$matrix")"
check "its cells add up to 700 ($total)" test "$total" = 700
accuracy="$(awk -v d="$diagonal" 'BEGIN {printf "%.1f%%", 100 * d / 700}')"
check "its diagonal is the accuracy ($diagonal = $accuracy)" grep -qF "acc $accuracy" <<<"$out"

# predict on a CSV with labels: the model of the CSV example, trained standardised.
csv="$DDP_SOURCE_DIR/tests/data/tiny.csv"
csv_example=(--config "$DDP_SOURCE_DIR/configs/csv_example.yaml" --set "data.train.path=$csv"
  --set "data.test.path=$csv" --set data.normalize=standardize)
run_ranks 2 60 "${csv_example[@]}" --set "output.dir=$WORK/c" --set training.epochs=5
check "the CSV example trains" test "$rc" = 0
run_ranks 2 60 evaluate "${csv_example[@]}" --model "$WORK/c/model.safetensors"
correct="$(sed -n '/^confusion matrix/,$p' <<<"$out" | tail -n +3 | awk '{s += $($1 + 2)} END {print s}')"
out="$("$DDP_TRAIN" predict --model "$WORK/c/model.safetensors" --data "$csv" --csv-header \
  --out "$WORK/p.csv" 2>&1)"
check "predict exits 0 and says what it wrote" grep -qF "predict: 12 predictions" <<<"$out"
check "one row per sample after the header" test "$(wc -l <"$WORK/p.csv")" = 13
check "header: index, predicted, a probability per class, the label" \
  test "$(head -1 "$WORK/p.csv")" = "index,predicted,p0,p1,p2,label"
check "predicted is each row's most probable class; probabilities sum to 1" awk -F, 'NR > 1 {
    best = 3; s = 0
    for (c = 3; c <= 5; ++c) { s += $c; if ($c > $best) best = c }
    if (best - 3 != $2 || s < 0.99999 || s > 1.00001) bad = 1 } END { exit bad }' "$WORK/p.csv"
hits="$(awk -F, 'NR > 1 && $2 == $6 {n++} END {print n + 0}' "$WORK/p.csv")"
check "predict's correct count is evaluate's ($hits = $correct)" test "$hits" = "$correct"
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  check "predictions equal the model computed in numpy from the file (weights, normalisation)" \
    /usr/bin/python3 - "$WORK/c/model.safetensors" "$csv" "$WORK/p.csv" <<'PY'
import json, struct, sys
import numpy as np
model, data, preds = sys.argv[1:]
raw = open(model, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
meta = header.pop("__metadata__")
t = {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                      dtype=np.float32).reshape(v["shape"]) for k, v in header.items()}
x = np.loadtxt(data, delimiter=",", skiprows=1, dtype=np.float32)[:, :4]
x = (x - np.array(json.loads(meta["ddp.normalize.mean"]), np.float32)) / \
    np.array(json.loads(meta["ddp.normalize.std"]), np.float32)
h = np.maximum(x @ t["layers.0.weight"].T + t["layers.0.bias"], 0)
logits = (h @ t["layers.1.weight"].T + t["layers.1.bias"]).astype(np.float64)
p = np.exp(logits - logits.max(1, keepdims=True))
p /= p.sum(1, keepdims=True)
ours = np.loadtxt(preds, delimiter=",", skiprows=1)
ok = (ours[:, 1] == logits.argmax(1)).all() and np.abs(ours[:, 2:5] - p).max() < 1e-5
print(f"numpy: argmax equal {bool((ours[:, 1] == logits.argmax(1)).all())}, "
      f"max |p - p_numpy| {np.abs(ours[:, 2:5] - p).max():.2g}")
sys.exit(0 if ok else 1)
PY
fi
# The same rows without the label column and without a header: the same predictions.
tail -n +2 "$csv" | cut -d, -f1-4 >"$WORK/features.csv"
"$DDP_TRAIN" predict --model "$WORK/c/model.safetensors" --data "$WORK/features.csv" \
  --out "$WORK/q.csv" >/dev/null 2>&1
check "features-only rows give the same predictions, no label column" \
  test "$(cut -d, -f1-5 "$WORK/p.csv")" = "$(cat "$WORK/q.csv")"
# IDX images of 2x2 pixels fit the 4-feature model.
printf '\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x02\x00\x00\x00\x02\x00\x40\x80\xff\xff\x80\x40\x00' >"$WORK/images-idx3-ubyte"
out="$("$DDP_TRAIN" predict --model "$WORK/c/model.safetensors" --data "$WORK/images-idx3-ubyte" \
  --out "$WORK/i.csv" 2>&1)"
check "predict reads IDX images" test "$(wc -l <"$WORK/i.csv")" = 3
# The CSV converted to .npy: the features file alone gives the features-only predictions.
"$DDP_TRAIN" convert --format csv --data "$csv" --csv-header --out "$WORK/npy" >/dev/null
"$DDP_TRAIN" predict --model "$WORK/c/model.safetensors" --data "$WORK/npy/features.npy" \
  --out "$WORK/n.csv" >/dev/null 2>&1
check "predict reads a features .npy: the same predictions" cmp "$WORK/q.csv" "$WORK/n.csv"

# Refusals, each naming both sides.
predict_error() {  # predict_error NAME MESSAGE ARGS...: exits 1 with MESSAGE
  local name="$1" message="$2"; shift 2
  checks=$((checks + 1))
  local got code
  got="$(timeout 60 "$DDP_TRAIN" predict "$@" 2>&1)"
  code=$?
  if ((code == 1)) && grep -qF -- "$message" <<<"$got"; then
    pass "$name"
  else
    fail "$name: exit $code, expected 1 with '$message':"; echo "$got" | tail -3
  fi
}
m="$WORK/c/model.safetensors"
printf '1,2,3,4,5,6,7\n' >"$WORK/seven.csv"
predict_error "feature count: names the data's columns and the model's features" \
  "has 7 columns per row; the model $m (layers [4, 8, 3]) takes 4 features" \
  --model "$m" --data "$WORK/seven.csv" --out "$WORK/x.csv"
printf '0.1,0.2,0.3,0.4,7\n' >"$WORK/label7.csv"
predict_error "a label outside the model's classes" "label 7" \
  --model "$m" --data "$WORK/label7.csv" --out "$WORK/x.csv"
printf '\x00\x00\x08\x03\x00\x00\x00\x01\x00\x00\x00\x03\x00\x00\x00\x03\x01\x02\x03\x04\x05\x06\x07\x08\x09' >"$WORK/nine-idx3-ubyte"
predict_error "IDX images of another size" \
  "has images of 9 pixels; the model $m (layers [4, 8, 3]) takes 4 features" \
  --model "$m" --data "$WORK/nine-idx3-ubyte" --out "$WORK/x.csv"
"$DDP_TRAIN" convert --format csv --data "$WORK/seven.csv" --out "$WORK/six" >/dev/null
predict_error ".npy samples of another size" \
  "has samples of 6 features; the model $m (layers [4, 8, 3]) takes 4 features" \
  --model "$m" --data "$WORK/six/features.npy" --out "$WORK/x.csv"
predict_error "an unwritable output" "--out $WORK/no/such/dir/x.csv: cannot write" \
  --model "$m" --data "$WORK/features.csv" --out "$WORK/no/such/dir/x.csv"
# A checkpoint holds the optimizer's state beside the weights: not a model file.
"$DDP_TRAIN" "${csv_example[@]}" --set "output.dir=$WORK/k" --set training.max_steps=1 \
  --set checkpoint.every_steps=1 --set optimizer.name=adam >/dev/null 2>&1
predict_error "a checkpoint instead of a model" "a checkpoint? evaluate and predict take" \
  --model "$WORK/k/checkpoints/step-000000001.safetensors" --data "$WORK/features.csv" \
  --out "$WORK/x.csv"
printf 'not a model' >"$WORK/junk.safetensors"
predict_error "a file that is not safetensors" "$WORK/junk.safetensors" \
  --model "$WORK/junk.safetensors" --data "$WORK/features.csv" --out "$WORK/x.csv"
expect_error "predict on more than one rank" 2 "predict runs in one process" \
  predict --model "$m" --data "$WORK/features.csv" --out "$WORK/x.csv"
expect_error "evaluate: a model of other widths than model.layers" 2 \
  "$m (layers [4, 8, 3]) does not fit the config's model.layers [4, 16, 3]" \
  evaluate "${csv_example[@]}" --set "model.layers=[4, 16, 3]" --model "$m"
expect_error "evaluate: normalisation differs from the config's" 2 \
  "has an input normalisation, but data.normalize is none" \
  evaluate "${csv_example[@]}" --set data.normalize=none --model "$m"
expect_error "evaluate: no test split" 2 "has no test split (data.test) to evaluate on" \
  evaluate --config "$seed" --set data.normalize=standardize --model "$WORK/m/model.safetensors"
expect_error "evaluate: missing model file" 2 "$WORK/none.safetensors" \
  evaluate "${csv_example[@]}" --model "$WORK/none.safetensors"

# A NaN in the weights or in the features: refused naming the file and where it is, never nan
# probabilities. nan_at FILE OFFSET writes a float32 NaN over the 4 bytes at OFFSET.
nan_at() { printf '\x00\x00\xc0\x7f' | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
# tensor_start FILE NAME: the byte offset of tensor NAME's first value in safetensors FILE.
tensor_start() {
  local n begin
  n="$(od -An -t u8 -N8 "$1" | tr -d ' ')"
  begin="$(head -c $((8 + n)) "$1" | grep -ao "\"$2\":{[^}]*}" |
    sed 's/.*"data_offsets":\[\([0-9]*\),.*/\1/')"
  echo $((8 + n + begin))
}
w="$WORK/nan-model.safetensors"
cp "$m" "$w"
nan_at "$w" $(($(tensor_start "$w" layers.0.weight) + 17 * 4))  # [8, 4]: row 4, column 1
where="tensor 'layers.0.weight' holds nan at index 17 (row 4, column 1)"
predict_error "a NaN in the model's weights" "model '$w': $where" \
  --model "$w" --data "$WORK/features.csv" --out "$WORK/x.csv"
expect_error "evaluate: a NaN in the model's weights" 2 "model '$w': $where" \
  evaluate "${csv_example[@]}" --model "$w"
expect_error "model.init_from: a NaN in the weights" 2 "model.init_from '$w': $where" \
  "${csv_example[@]}" --set "model.init_from=$w" --set "output.dir=$WORK/i"
# The converted CSV: 12 samples of 4 float32 features end the file; sample 5, feature 2 is NaN.
x="$WORK/nan-features.npy"
cp "$WORK/npy/features.npy" "$x"
nan_at "$x" $(($(stat -c %s "$x") - 12 * 4 * 4 + (5 * 4 + 2) * 4))
predict_error "a NaN in a features .npy" "$x: sample 5, feature 2 is nan (features must be finite)" \
  --model "$m" --data "$x" --out "$WORK/x.csv"
npy_eval() {  # npy_eval TEST_FEATURES: the CSV example's model on the converted pair
  cat <<YAML
model: {layers: [4, 8, 3]}
data: {format: npy, normalize: standardize,
       train: {features: $WORK/npy/features.npy, labels: $WORK/npy/labels.npy},
       test: {features: $1, labels: $WORK/npy/labels.npy}}
YAML
}
npy_eval "$WORK/npy/features.npy" >"$WORK/npy-eval.yaml"
run_ranks 2 60 evaluate --config "$WORK/npy-eval.yaml" --model "$m"
check "evaluate reads the converted pair" test "$rc $rank_codes" = "0 0 0 "
npy_eval "$x" >"$WORK/npy-eval.yaml"
expect_error "evaluate: a NaN in the test features, every rank agrees" 2 \
  "$x (labels $WORK/npy/labels.npy): sample 5, feature 2 is nan (features must be finite)" \
  evaluate --config "$WORK/npy-eval.yaml" --model "$m"

finish
