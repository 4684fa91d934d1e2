# checkpoint.async: every checkpoint written from a copy on rank 0's thread holds the same
# tensors and state as the one written in line (only the run's name and the checksum over it
# differ); a checkpoint is reported once it is durable, after training went on past it; a run
# resumed from one ends bitwise where the uninterrupted run ends; a stop request (SIGTERM)
# leaves a complete checkpoint; a full disk during a background write ends every rank with
# code 1, naming the error, and keeps the previous checkpoint; bench/checkpoint_cost.sh prints
# a row per setting.
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"
# AdamW: the checkpoints hold optimizer state too.
common=(--config "$seed" --set training.log_every=10 --set training.print_shapes=false
  --set distributed.timeout_s=10 --set optimizer.name=adamw --set checkpoint.keep_last=0)

if ! command -v python3 >/dev/null || ! command -v jq >/dev/null; then
  echo "skipped: needs python3 and jq"; exit 77
fi

# same_checkpoints DIR_A DIR_B: both hold the same checkpoint names, and each pair has the same
# tensors (bytes, shapes, dtypes) and metadata but for ddp.run and ddp.crc32.
same_checkpoints() {
  python3 - "$1" "$2" <<'PY'
import json, os, struct, sys
def content(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    for key in ("ddp.run", "ddp.crc32"):
        meta.pop(key)
    return header, meta, data[8 + n:]
a, b = (sorted(f for f in os.listdir(d) if f.endswith(".safetensors")) for d in sys.argv[1:])
if not a or a != b:
    sys.exit(f"checkpoints differ: {a} against {b}")
for name in a:
    if content(os.path.join(sys.argv[1], name)) != content(os.path.join(sys.argv[2], name)):
        sys.exit(f"{name} differs")
print(f"{len(a)} checkpoints alike")
PY
}
same_weights() { cmp -s "$1/model.safetensors" "$2/model.safetensors"; }

# --- In line and in the background: the same checkpoints and weights ----------------------
run_ranks 2 120 "${common[@]}" --set output.dir="$WORK/sync" --set checkpoint.every_steps=20
check "in line: exits 0" test "$rc" -eq 0
run_ranks 2 120 "${common[@]}" --set output.dir="$WORK/async" --set checkpoint.every_steps=20 \
  --set checkpoint.async=true
check "async: exits 0" test "$rc" -eq 0
check "async: each checkpoint holds what the in-line one holds" \
  same_checkpoints "$WORK/sync/checkpoints" "$WORK/async/checkpoints"
check "async: the final weights are the in-line run's" same_weights "$WORK/sync" "$WORK/async"
check "async: a line per checkpoint, once durable" \
  test "$(grep -c '^checkpoint: .* in the background, [0-9.]* s of training)$' <<<"$out")" -eq 10
# The record of step 20's checkpoint comes after step 30's progress record: training went on
# while it was written, and it was settled by the next checkpoint.
check "async: a checkpoint is settled after training went on past it" \
  jq -se 'map(select(.type == "checkpoint" or .type == "train")) | map(.type + ":" + (.global_step | tostring))
    | index("checkpoint:20") > index("train:30")' "$WORK/async/metrics.jsonl"
check "async: the records give the training thread's and the writer's seconds" \
  jq -se '[.[] | select(.type == "checkpoint")] | length == 10 and all(.seconds >= 0 and .write_seconds > 0)' \
  "$WORK/async/metrics.jsonl"

# --- Resumed from a checkpoint written in the background ------------------------------------
run_ranks 2 120 "${common[@]}" --set output.dir="$WORK/resumed" \
  --resume "$WORK/async/checkpoints/step-000000060.safetensors"
check "resumed from an async checkpoint: exits 0" test "$rc" -eq 0
check "resumed from an async checkpoint: the uninterrupted weights" same_weights "$WORK/sync" "$WORK/resumed"

# --- SIGTERM: the stop's checkpoint is complete before the ranks exit ------------------------
checks=$((checks + 1))
dir="$WORK/term"
start_ranks 2 "$WORK/term.log" "${common[@]}" --set "output.dir=$dir" --set training.epochs=2000 \
  --set checkpoint.every_steps=50 --set checkpoint.async=true
if ! wait_until 60 grep -qs '^epoch 20/' "$WORK/term.log"; then
  fail "SIGTERM: training did not start"; kill "$launcher"; wait "$launcher"
else
  kill -TERM "$(rank_pid "output.dir=$dir( |$)" 1)"
  wait "$launcher"; job_rc=$?
  read_rank_codes 2
  newest="$(cd "$dir/checkpoints" && ls step-*.safetensors | tail -1)"
  stop_step="$(sed -n 's/^stop requested .* step \([0-9]*\)$/\1/p' "$WORK/term.log")"
  if [[ "$rank_codes" != "75 75 " ]] || ((job_rc != 75)); then
    fail "SIGTERM: rank codes '$rank_codes', job $job_rc (expected 75 everywhere)"; tail -5 "$WORK/term.log"
  elif ! grep -q "^checkpoint: $dir/checkpoints/$newest .*background" "$WORK/term.log"; then
    fail "SIGTERM: the newest checkpoint $newest was not reported written"; tail -5 "$WORK/term.log"
  elif ls "$dir/checkpoints" | grep -q tmp; then
    fail "SIGTERM: a temporary file is left: $(ls "$dir/checkpoints")"
  else
    pass "SIGTERM: every rank exits 75 after $newest is durable (stopped at step $stop_step of its epoch)"
  fi
fi

# --- A full disk during a background write ---------------------------------------------------
small="$WORK/small"
mkdir -p "$small"
if [[ "$(id -u)" == 0 ]] && mount -t tmpfs -o size=16k tmpfs "$small" 2>/dev/null; then
  # Four pages: the directory's lock file takes one; one checkpoint of the seed model with
  # AdamW's state (~5 KB) takes two, a second one beside it does not fit.
  expect_error "async: a full disk ends every rank" 2 "No space left on device" "${common[@]}" \
    --set "output.dir=$WORK/full" --set "checkpoint.dir=$small" --set checkpoint.every_steps=20 \
    --set checkpoint.keep_last=1 --set checkpoint.async=true
  check "async: the full disk kept the first checkpoint only" \
    test "$(ls "$small")" == "step-000000020.safetensors"
  umount "$small"
else
  echo "skipped: full disk on a tmpfs (needs root and mount)"
fi

# --- bench/checkpoint_cost.sh: a row per setting, from a short series -------------------------
table="$(timeout 180 bash "$DDP_SOURCE_DIR/bench/checkpoint_cost.sh" --runs 1 --steps 40 --every 20 \
  --loads 0 --binary "$DDP_TRAIN" --dir "$WORK" 2>&1)"
row='^\| 0 busy \| (none|inline every 20 steps|async every 20 steps) \| [0-9.]+ \| [-+][0-9.]+% \| ([0-9.]+|-) \| ([0-9.]+|-) \|$'
if [[ "$(grep -cE "$row" <<<"$table")" -eq 3 ]]; then
  pass "bench/checkpoint_cost.sh: a row for none, in line and async"
else
  fail "bench/checkpoint_cost.sh: expected 3 rows:"; echo "$table"
fi
checks=$((checks + 1))

finish
