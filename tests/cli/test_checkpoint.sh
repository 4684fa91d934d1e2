# Checkpoints through the real binary: a rank killed (SIGKILL) mid-run ends the whole job
# quickly and the newest checkpoint resumes to bitwise the uninterrupted weights (2 and 4
# ranks); SIGTERM on one rank, and Ctrl-C on launch/ddp-run, checkpoint and end every rank with
# code 75; truncated, bit-flipped and mismatched checkpoints are refused; a full disk keeps the
# previous checkpoint; another world size resumes with a warning about the global batch.
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"
timeout_s=5
common=(--config "$seed" --set training.log_every=0 --set "distributed.timeout_s=$timeout_s")

# The ranks writing to output dir $1, and rank $2 among them.
ranks_in() { ranks_of "output.dir=$1( |$)"; }
rank_in() { rank_pid "output.dir=$1( |$)" "$2"; }
has_checkpoint() { compgen -G "$1/checkpoints/step-*.safetensors" >/dev/null; }
running() { kill -0 "$launcher" 2>/dev/null || [[ -n "$(ranks_in "$1")" ]]; }
stopped() { ! running "$1"; }
same_weights() { cmp -s "$1/model.safetensors" "$2/model.safetensors"; }

# --- SIGKILL of one rank, mid-run, with 2 and 4 ranks --------------------------------------
kill_and_resume() {
  local n="$1" victim_rank="$2" epochs="$3"
  local ref="$WORK/ref$n" dir="$WORK/kill$n" name="SIGKILL rank $2 of $1"
  checks=$((checks + 1))
  run_ranks "$n" 300 "${common[@]}" --set "output.dir=$ref" --set "training.epochs=$epochs"
  if ((rc != 0)); then fail "$name: the reference run failed ($rc)"; echo "$out" | tail -5; return; fi
  start_ranks "$n" "$dir.log" "${common[@]}" --set "output.dir=$dir" \
    --set "training.epochs=$epochs" --set checkpoint.every_steps=500
  if ! wait_until 120 has_checkpoint "$dir"; then
    fail "$name: no checkpoint appeared"; kill "$launcher"; wait "$launcher"; return
  fi
  local victim
  victim="$(rank_in "$dir" "$victim_rank")"
  if [[ -z "$victim" ]] || [[ -e "$dir/model.safetensors" ]]; then
    fail "$name: the run ended before it could be killed"; wait "$launcher"; return
  fi
  kill -9 "$victim"
  local start=$SECONDS
  if ! wait_until $((timeout_s + 10)) stopped "$dir"; then
    fail "$name: ranks still run $((SECONDS - start)) s after the kill (limit timeout_s + 10)"
    kill -9 $(ranks_in "$dir") 2>/dev/null; wait "$launcher"; return
  fi
  wait "$launcher"; local job_rc=$? ended_after=$((SECONDS - start))
  # The launcher ends the other ranks (SIGTERM, then SIGKILL to their process groups: their
  # own codes are the launcher's), names the killed rank and returns its signal.
  if ((job_rc != 137)); then fail "$name: the job exited $job_rc, expected 137 (SIGKILL)"; return; fi
  local named
  named="$(grep -m1 -o "process rank $victim_rank with PID [0-9]* on node [^ ]* exited on signal 9" "$dir.log")"
  if [[ -z "$named" ]]; then fail "$name: the killed rank is not named"; tail -8 "$dir.log"; return; fi
  # The newest complete checkpoint: a write the kill interrupted leaves a .tmp file beside it.
  local newest
  newest="$(cd "$dir/checkpoints" && ls step-*.safetensors | tail -1)"
  run_ranks "$n" 300 "${common[@]}" --set "output.dir=$dir" --set "training.epochs=$epochs" \
    --resume auto
  if ((rc != 0)); then fail "$name: resume failed ($rc)"; echo "$out" | tail -5; return; fi
  if ! grep -q "resume: .*$newest" <<<"$out"; then
    fail "$name: did not resume from the newest checkpoint $newest"; echo "$out" | grep resume; return
  fi
  if ! same_weights "$ref" "$dir"; then fail "$name: resumed weights differ from the uninterrupted run"; return; fi
  pass "$name: job ended ${ended_after}s after the kill (code $job_rc, \"$named\"), resumed from $newest, weights bitwise the uninterrupted run's"
}
kill_and_resume 2 1 2000
kill_and_resume 4 0 600

# --- SIGTERM on one rank: every rank checkpoints and exits 75 ------------------------------
checks=$((checks + 1))
dir="$WORK/term"
start_ranks 2 "$WORK/term.log" "${common[@]}" --set "output.dir=$dir" --set training.epochs=2000
if ! wait_until 60 grep -qs '^epoch 20/' "$WORK/term.log"; then
  fail "SIGTERM: training did not start"; kill "$launcher"
else
  kill -TERM "$(rank_in "$dir" 1)"
  wait_until $((timeout_s + 10)) stopped "$dir"
  wait "$launcher"; job_rc=$?
  read_rank_codes 2
  if [[ "$rank_codes" != "75 75 " ]] || ((job_rc != 75)); then
    fail "SIGTERM: rank codes '$rank_codes', job $job_rc (expected 75 everywhere)"; tail -5 "$WORK/term.log"
  elif ! has_checkpoint "$dir"; then
    fail "SIGTERM: no checkpoint written"
  else
    run_ranks 2 300 "${common[@]}" --set "output.dir=$dir" --set training.epochs=2000 --resume auto
    if ((rc != 0)); then
      fail "SIGTERM: resume failed ($rc)"; echo "$out" | tail -5
    elif ! same_weights "$WORK/ref2" "$dir"; then
      fail "SIGTERM: resumed weights differ from the uninterrupted run"
    else
      pass "SIGTERM: every rank exited 75 after $(grep -m1 -o 'checkpoint: [^ ]*' "$WORK/term.log"); resume matches bitwise"
    fi
  fi
fi

# --- Ctrl-C on launch/ddp-run: mpirun would abort; ddp-run passes it on, every rank exits 75 --
# (A run that never ends by itself: bound to cores, the seed model trains 2000 epochs in ~1 s.)
checks=$((checks + 1))
ctrlc="$WORK/ctrlc"
rm -f "$WORK"/rc.*
# SIGINT at its default disposition, as in a terminal (a background job of a script ignores it).
DDP_TRAIN="$rank_wrapper" env --default-signal=INT "$DDP_SOURCE_DIR/launch/ddp-run" -n 2 "$seed" \
  --set training.log_every=0 --set "distributed.timeout_s=$timeout_s" --set "output.dir=$ctrlc" \
  --set training.epochs=100000000 >"$WORK/ctrlc.log" 2>&1 &
runner=$!
runner_done() { ! kill -0 "$runner" 2>/dev/null; }
if ! wait_until 60 grep -qs '^epoch 20/' "$WORK/ctrlc.log"; then
  fail "Ctrl-C on ddp-run: training did not start"; tail -5 "$WORK/ctrlc.log"; kill "$runner"
else
  kill -INT "$runner"
  if ! wait_until 30 runner_done; then
    fail "Ctrl-C on ddp-run: still running 30 s later"; kill -TERM "$runner"; kill -TERM "$runner"
  fi
  wait "$runner"; job_rc=$?
  read_rank_codes 2
  if [[ "$rank_codes" != "75 75 " ]] || ((job_rc != 75)); then
    fail "Ctrl-C on ddp-run: rank codes '$rank_codes', ddp-run $job_rc (expected 75 everywhere)"
    tail -5 "$WORK/ctrlc.log"
  elif ! has_checkpoint "$ctrlc"; then
    fail "Ctrl-C on ddp-run: no checkpoint written"
  else
    pass "Ctrl-C on ddp-run: every rank exited 75 after $(grep -m1 -o 'checkpoint: [^ ]*' "$WORK/ctrlc.log"), so did ddp-run"
  fi
fi

# --- Damaged and mismatched checkpoints are refused on every rank --------------------------
good="$(ls "$dir"/checkpoints/step-*.safetensors 2>/dev/null | tail -1)"
if [[ -n "$good" ]]; then
  size=$(stat -c %s "$good")
  head -c $((size / 2)) "$good" >"$WORK/truncated.safetensors"
  cp "$good" "$WORK/flipped.safetensors"
  # One bit of the last weight's bytes (the file ends with the tensor data).
  last=$(od -An -tu1 -j $((size - 3)) -N1 "$good" | tr -d ' ')
  printf "$(printf '\\%03o' $((last ^ 16)))" |
    dd of="$WORK/flipped.safetensors" bs=1 seek=$((size - 3)) conv=notrunc status=none
  quick=("${common[@]}" --set "output.dir=$WORK/refused")
  expect_error "truncated checkpoint" 2 "unreadable or corrupt" "${quick[@]}" --resume "$WORK/truncated.safetensors"
  expect_error "bit-flipped checkpoint" 2 "checksum mismatch" "${quick[@]}" --resume "$WORK/flipped.safetensors"
  expect_error "wrong-shape checkpoint" 2 "has shape [10, 20], the model's is [11, 20]" "${quick[@]}" \
    --resume "$good" --set 'model.layers=[20, 11, 3]'
  expect_error "other optimizer settings" 2 "optimizer.lr: the checkpoint was written with" "${quick[@]}" \
    --resume "$good" --set optimizer.lr=0.5
  expect_error "model file instead of a checkpoint" 2 "not a training checkpoint" "${quick[@]}" \
    --resume "$WORK/ref2/model.safetensors"
  expect_error "missing checkpoint" 2 "training.resume: checkpoint file not found" "${quick[@]}" \
    --resume "$WORK/nothing.safetensors"

  # --- Another world size: the global batch changes (warned) or is kept -------------------
  good_step=$((10#$(basename "$good" .safetensors | cut -d- -f2)))
  more=(--set training.epochs=2000 --set "training.max_steps=$((good_step + 40))")
  checks=$((checks + 1))
  run_ranks 4 300 "${common[@]}" --set "output.dir=$WORK/w4" "${more[@]}" --resume "$good"
  if ((rc != 0)) || ! grep -q "the global batch changes from 100 samples per step (2 rank(s)" <<<"$out"; then
    fail "4 ranks from a 2-rank checkpoint: rc $rc"; echo "$out" | grep -E "resume|warning|error" | head -5
  else
    pass "4 ranks from a 2-rank checkpoint: $(grep -m1 -o 'warning: the global batch changes from [0-9]* samples per step ([0-9] rank(s) in the checkpoint) to [0-9]*' <<<"$out")"
  fi
  checks=$((checks + 1))
  run_ranks 4 300 "${common[@]}" --set "output.dir=$WORK/w4b" "${more[@]}" \
    --set training.batch_size=25 --resume "$good"
  if ((rc != 0)) || ! grep -q "the global batch stays 100" <<<"$out"; then
    fail "4 ranks x 25 from a 2-rank x 50 checkpoint: rc $rc"; echo "$out" | grep -E "resume|warning|error" | head -5
  else
    pass "4 ranks x 25 from a 2 x 50 checkpoint: global batch kept, no warning"
  fi
else
  fail "no checkpoint from the SIGTERM run to damage"
fi

# --- A full disk during a checkpoint keeps the previous one -------------------------------
small="$WORK/small"
mkdir -p "$small"
if [[ "$(id -u)" == 0 ]] && mount -t tmpfs -o size=8k tmpfs "$small" 2>/dev/null; then
  # Two pages: the directory's lock file (who holds it) takes one; one checkpoint of the seed
  # model (~3 KB) fits in the other, a second one beside it not.
  expect_error "full disk during a checkpoint" 2 "No space left on device" "${common[@]}" \
    --set "output.dir=$WORK/full" --set "checkpoint.dir=$small" --set checkpoint.every_steps=20 \
    --set checkpoint.keep_last=1
  checks=$((checks + 1))
  kept="$(ls "$small")"
  if [[ "$kept" != "step-000000020.safetensors" ]]; then
    fail "full disk: the directory holds '$kept', expected only step-000000020.safetensors"
  else
    run_ranks 2 120 "${common[@]}" --set "output.dir=$WORK/afterfull" --resume "$small/$kept"
    run_ranks_rc=$rc
    run_ranks 2 120 "${common[@]}" --set "output.dir=$WORK/nofull"
    if ((run_ranks_rc != 0 || rc != 0)) || ! same_weights "$WORK/nofull" "$WORK/afterfull"; then
      fail "full disk: the kept checkpoint does not resume to the uninterrupted weights"
    else
      pass "full disk: the previous checkpoint ($kept) is intact and resumes to the uninterrupted weights"
    fi
  fi
  umount "$small"
else
  echo "skipped: full disk on a tmpfs (needs root and mount); tests/unit covers it with a file size limit"
fi

finish
