# A rank that stops answering (here: SIGSTOP mid-training) must not hang the job: the others
# give up after distributed.timeout_s naming the collective, the lowest rank that can names the
# stopped rank (the hang analysis of the flight records), they end with code 76 (a lost peer:
# launch/ddp-run --max-restarts retries it) by themselves,
# and the launcher ends the stalled rank: the whole job is over within seconds of the timeout.
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
dump_on_signal_check
finish
