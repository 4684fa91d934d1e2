# A rank that stops answering (here: SIGSTOP mid-training) must not hang the job: the others
# give up after distributed.timeout_s naming the collective, the lowest rank that can names the
# stopped rank (the hang analysis of the flight records), they end with code 76 (a lost peer:
# launch/ddp-run --max-restarts retries it) by themselves,
# and the launcher ends the stalled rank: the whole job is over within seconds of the timeout.
# A rank killed outright is named from the records the others write on the launcher's SIGTERM.
source "$(dirname "$0")/lib.sh"

stalled_rank_check "stalled rank" 3 "$WORK/out"
stalled_rank_check "stalled rank of three" 3 "$WORK/out3" 3 2
stalled_rank_check "stalled rank 0" 3 "$WORK/out0" 3 0

# SIGUSR2 to the launcher (which passes it on to every rank): each rank writes its flight
# record while training goes on; then SIGTERM to a rank ends the job as usual (75).
dump_on_signal_check() {
  local dir="$WORK/usr2" record
  checks=$((checks + 1))
  start_ranks 2 "$dir.log" --config "$DDP_SOURCE_DIR/configs/seed.yaml" --set "output.dir=$dir" \
    --set training.epochs=1000000 --set training.log_every=0
  wait_until 30 grep -q '^model:' "$dir.log"
  sleep 1
  kill -USR2 "$launcher"
  both_written() { [[ -f "$dir/flight/rank-0.json" && -f "$dir/flight/rank-1.json" ]]; }
  if ! wait_until 10 both_written; then
    fail "SIGUSR2: no flight records within 10 s"; kill "$launcher"; wait "$launcher"; return
  fi
  kill -0 "$launcher" 2>/dev/null || { fail "SIGUSR2 ended the job"; return; }
  kill -TERM "$(rank_pid "output.dir=$dir" 1)"  # a stop request: every rank checkpoints, 75
  wait "$launcher"; local rc=$?
  record="$(cat "$dir/flight/rank-1.json")"
  if ((rc != 75)); then
    fail "SIGUSR2: the job then ended with $rc, not 75 (SIGTERM)"; tail -5 "$dir.log"
  elif ! grep -q '"reason": "signal"' <<<"$record" || ! grep -q '"issued":' <<<"$record"; then
    fail "SIGUSR2: the record is not the signal's: ${record:0:300}"
  elif ! grep -q 'flight record written to .*rank-1.json (SIGUSR2)' "$dir.log"; then
    fail "SIGUSR2: rank 1 did not say where it wrote its record"; tail -5 "$dir.log"
  elif ! "$DDP_TRAIN" analyze "$dir" | grep -q '2 of 2 ranks left a flight record'; then
    fail "SIGUSR2: ddp-train analyze cannot read the records"; "$DDP_TRAIN" analyze "$dir"
  else
    pass "SIGUSR2: both ranks wrote their flight record and training went on"
  fi
}
# A rank SIGKILLed mid-training: mpirun ends the job at once, SIGTERMing the survivors; each
# writes its flight record on that signal, and `ddp-train analyze` names the killed rank as the
# one that left none.
killed_rank_check() {
  local dir="$WORK/killed" victim="" rc verdict
  checks=$((checks + 1))
  start_ranks 2 "$dir.log" --config "$DDP_SOURCE_DIR/configs/seed.yaml" --set "output.dir=$dir" \
    --set training.epochs=1000000 --set training.log_every=0
  for _ in $(seq 1 150); do
    victim="$(rank_pid "output.dir=$dir" 1)"
    [[ -n "$victim" ]] && grep -q '^model:' "$dir.log" && break
    sleep 0.2
  done
  [[ -n "$victim" ]] || { fail "killed rank: rank 1 never started"; kill "$launcher"; return; }
  sleep 1
  kill -KILL "$victim"
  launcher_done() { ! kill -0 "$launcher" 2>/dev/null; }
  if ! wait_until 30 launcher_done; then
    fail "killed rank: the job still runs 30 s after rank 1 was killed"; kill "$launcher"; return
  fi
  wait "$launcher"; rc=$?
  verdict="$("$DDP_TRAIN" analyze "$dir" 2>&1)"
  if ((rc == 0)); then
    fail "killed rank: the job exited 0"
  elif [[ ! -f "$dir/flight/rank-0.json" ]] || ! grep -q '"reason": "signal"' "$dir/flight/rank-0.json"; then
    fail "killed rank: rank 0 left no record of the launcher's SIGTERM"; ls -la "$dir/flight" 2>&1
  elif [[ -e "$dir/flight/rank-1.json" ]]; then
    fail "killed rank: the killed rank has a record"
  elif ! grep -qx "culprit: rank 1" <<<"$verdict" || ! grep -q "rank 1 left no flight record" <<<"$verdict"; then
    fail "killed rank: ddp-train analyze does not name rank 1:"; echo "$verdict"
  else
    pass "killed rank: job ended (code $rc), analyze names rank 1: $(grep -m1 'did not complete' <<<"$verdict")"
  fi
}

dump_on_signal_check
killed_rank_check
finish
