# launch/ddp-run --max-restarts: a rank killed mid-run (SIGKILL: mpirun exits 137) or stopped
# (SIGSTOP: its peers time out and exit 76) is followed by a restart with --resume auto that
# finishes the run, bitwise as a run resumed by hand from the same checkpoint; errors a restart
# cannot fix (a bad config, a usage error) are not retried; --max-restarts 0 is the plain
# launcher; more failures than restarts end with the last one's code. (Lost hosts and
# --min-ranks: tests/cluster/test_restart_hosts.sh.)
source "$(dirname "$0")/lib.sh"

ddp_run="$DDP_SOURCE_DIR/launch/ddp-run"
seed="$DDP_SOURCE_DIR/configs/seed.yaml"
# ~400,000 steps: 10-30 s on 2 ranks; a checkpoint every 20,000 steps, all kept.
sets=(--set training.log_every=0 --set distributed.timeout_s=5 --set training.epochs=20000
      --set checkpoint.every_steps=20000 --set checkpoint.keep_last=0)

has_checkpoint() { compgen -G "$1/checkpoints/step-*.safetensors" >/dev/null; }
rank_in() { rank_pid "output.dir=$1( |$)" "$2"; }
restarts_in() { grep -c "^ddp-run: attempt [0-9]* of" "$1"; }
resumes_in() { grep -c "^resume: .*safetensors: epoch" "$1"; }

# start_run DIR ARGS...: ddp-run on 2 ranks with ARGS, output in DIR and DIR.log; sets $runner.
start_run() {
  local dir="$1"; shift
  DDP_TRAIN="$DDP_TRAIN" "$ddp_run" -n 2 "$@" "$seed" "${sets[@]}" --set "output.dir=$dir" \
    >"$dir.log" 2>&1 &
  runner=$!
}

# signal_rank DIR SIGNAL RESUMES: once DIR has a checkpoint and rank 1 of the attempt after
# RESUMES resumes runs (0: the first attempt), sends it SIGNAL; fails when it never does.
signal_rank() {
  local dir="$1" signal="$2" resumes="$3" victim="" i
  wait_until 120 has_checkpoint "$dir" || return 1
  for ((i = 0; i < 600; ++i)); do
    if (($(resumes_in "$dir.log") >= resumes)); then
      victim="$(rank_in "$dir" 1)"
      [[ -n "$victim" ]] && break
    fi
    sleep 0.1
  done
  [[ -n "$victim" ]] || return 1
  kill "-$signal" "$victim"
}

# --- A rank SIGKILLed: attempt 2 resumes and finishes, bitwise as a resume by hand ----------
checks=$((checks + 1))
dir="$WORK/killed"
start_run "$dir" --max-restarts 2
if ! signal_rank "$dir" KILL 0; then
  fail "SIGKILL: no checkpoint or no rank 1 to kill"; kill "$runner"; wait "$runner"
else
  wait "$runner"; rc=$?
  used="$(grep -m1 -o '^resume: [^ ]*\.safetensors' "$dir.log" | cut -c9-)"
  if ((rc != 0)); then
    fail "SIGKILL: ddp-run exited $rc, expected 0"; tail -8 "$dir.log"
  elif ! grep -q '^ddp-run: attempt 2 of 3 after a rank killed by SIGKILL (exit 137): resuming from the newest checkpoint$' "$dir.log"; then
    fail "SIGKILL: no 'attempt 2 of 3' line"; grep '^ddp-run' "$dir.log"
  elif (($(restarts_in "$dir.log") != 1)) || [[ -z "$used" || ! -f "$used" ]]; then
    fail "SIGKILL: $(restarts_in "$dir.log") restarts, resumed from '$used'"; grep '^ddp-run\|^resume' "$dir.log"
  else
    # The same checkpoint, resumed by hand in another directory, on 2 ranks again.
    cp "$used" "$WORK/used.safetensors"
    run_ranks 2 300 --config "$seed" "${sets[@]}" --set "output.dir=$WORK/by_hand" \
      --resume "$WORK/used.safetensors"
    if ((rc != 0)); then
      fail "SIGKILL: the resume by hand failed ($rc)"; echo "$out" | tail -5
    elif ! cmp -s "$dir/model.safetensors" "$WORK/by_hand/model.safetensors"; then
      fail "SIGKILL: the restarted run's weights differ from the resume by hand of $used"
    else
      pass "SIGKILL of rank 1: $(grep -m1 '^ddp-run: attempt' "$dir.log" | cut -c10-); resumed from $(basename "$used"), weights bitwise a resume by hand"
    fi
  fi
fi

# --- A rank stopped: its peers time out and exit 76, the restart finishes the run -----------
checks=$((checks + 1))
dir="$WORK/stalled"
start_run "$dir" --max-restarts 1
if ! signal_rank "$dir" STOP 0; then
  fail "SIGSTOP: no checkpoint or no rank 1 to stop"; kill "$runner"; wait "$runner"
else
  wait "$runner"; rc=$?
  if ((rc != 0)); then
    fail "SIGSTOP: ddp-run exited $rc, expected 0"; grep -v '^epoch' "$dir.log" | tail -8
  elif ! grep -q '^ddp-run: attempt 2 of 2 after a lost peer (a collective timed out) (exit 76)' "$dir.log"; then
    fail "SIGSTOP: no restart after exit 76"; grep '^ddp-run\|error' "$dir.log"
  else
    pass "SIGSTOP of rank 1: $(grep -m1 '^ddp-run: attempt' "$dir.log" | cut -c10-), run finished"
  fi
fi

# --- A config error is not retried ----------------------------------------------------------
checks=$((checks + 1))
dir="$WORK/bad_config"
start_run "$dir" --max-restarts 2 --set optimizer.lr=-1
wait "$runner"; rc=$?
if ((rc != 1)) || (($(restarts_in "$dir.log") != 0)) || (($(grep -c "^ddp-train: 2 rank" "$dir.log") > 1)); then
  fail "config error: exit $rc, $(restarts_in "$dir.log") restarts (expected exit 1, none)"; tail -5 "$dir.log"
elif ! grep -q "optimizer.lr" "$dir.log"; then
  fail "config error: the error is not named"; tail -5 "$dir.log"
else
  pass "config error: exit 1, no restart: $(grep -m1 -o 'error: .*' "$dir.log" | cut -c1-90)"
fi

# --- Usage errors: exit 2 before anything starts ---------------------------------------------
usage_error() {  # NAME MESSAGE ARGS...
  local name="$1" message="$2"; shift 2
  checks=$((checks + 1))
  out="$(DDP_TRAIN="$DDP_TRAIN" "$ddp_run" "$@" 2>&1)"; rc=$?
  if ((rc != 2)) || [[ "$out" != *"$message"* ]]; then
    fail "$name: exit $rc, output: $out"
  else
    pass "$name: exit 2, \"$message\""
  fi
}
usage_error "--max-restarts -1" "--max-restarts must be a number >= 0, got '-1'" -n 2 --max-restarts -1 "$seed"
usage_error "--min-ranks above -n" "--min-ranks must be a number from 1 to -n (2), got '3'" -n 2 --min-ranks 3 "$seed"
usage_error "--shrink unknown" "--shrink must be keep-global-batch or keep-rank-batch, got 'half'" -n 2 --shrink half "$seed"

# --- --max-restarts 0: a kill ends the job with mpirun's code, as without the option --------
checks=$((checks + 1))
dir="$WORK/no_restart"
start_run "$dir" --max-restarts 0
if ! signal_rank "$dir" KILL 0; then
  fail "--max-restarts 0: no rank 1 to kill"; kill "$runner"; wait "$runner"
else
  wait "$runner"; rc=$?
  if ((rc != 137)) || grep -q '^ddp-run: \(attempt\|giving up\)' "$dir.log"; then
    fail "--max-restarts 0: exit $rc (expected 137, no ddp-run line)"; grep '^ddp-run' "$dir.log"
  else
    pass "--max-restarts 0: exit 137 after the kill, no restart"
  fi
fi

# --- More kills than restarts: the last failure's code --------------------------------------
checks=$((checks + 1))
dir="$WORK/two_kills"
start_run "$dir" --max-restarts 1
if ! signal_rank "$dir" KILL 0 || ! signal_rank "$dir" KILL 1; then
  fail "two kills: could not kill rank 1 twice"; kill "$runner"; wait "$runner"
else
  wait "$runner"; rc=$?
  if ((rc != 137)) || (($(restarts_in "$dir.log") != 1)) ||
      ! grep -q '^ddp-run: giving up: attempt 2 of 2 ended with a rank killed by SIGKILL (exit 137)$' "$dir.log"; then
    fail "two kills, one restart: exit $rc"; grep '^ddp-run' "$dir.log"
  else
    pass "two kills, --max-restarts 1: exit 137 after one restart, \"giving up: attempt 2 of 2\""
  fi
fi
finish
