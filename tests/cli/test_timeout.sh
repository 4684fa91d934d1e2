# A rank that stops answering (here: SIGSTOP mid-training) must not hang the job: the others
# give up after distributed.timeout_s naming the collective and end with code 1 by themselves,
# and the launcher ends the stalled rank: the whole job is over within timeout_s + 10 s.
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"
checks=$((checks + 1))
timeout_s=3
start_ranks 2 "$WORK/log" --config "$seed" --set "output.dir=$WORK/out" \
  --set training.epochs=1000000 --set training.log_every=0 --set distributed.timeout_s=$timeout_s
# The rank-1 process, once training has started.
victim=""
for _ in $(seq 1 100); do
  victim="$(rank_pid "output.dir=$WORK/out" 1)"
  [[ -n "$victim" ]] && grep -q '^model:' "$WORK/log" && break
  sleep 0.2
done
if [[ -z "$victim" ]]; then
  fail "stalled rank: rank 1 never started"; kill "$launcher" 2>/dev/null; finish; exit
fi
sleep 1
kill -STOP "$victim"
start=$SECONDS
launcher_done() { ! kill -0 "$launcher" 2>/dev/null; }
if ! wait_until $((timeout_s + 10)) launcher_done; then
  fail "stalled rank: the job still runs $((SECONDS - start)) s after rank 1 stopped"
  kill -CONT "$victim"; kill "$launcher"; wait "$launcher" 2>/dev/null
else
  wait "$launcher"; rc=$?
  elapsed=$((SECONDS - start))
  read_rank_codes 2
  if ((rc == 0)); then
    fail "stalled rank: the job exited 0"
  elif ! grep -q "did not complete within $timeout_s s" "$WORK/log"; then
    fail "stalled rank: no timeout message"; tail -5 "$WORK/log"
  elif [[ "${rank_codes%% *}" != 1 ]]; then
    fail "stalled rank: rank 0 exited '${rank_codes%% *}', expected 1 (codes: $rank_codes)"
  else
    pass "stalled rank: job ended (code $rc, rank codes $rank_codes) ${elapsed}s after rank 1 stopped: $(grep -m1 -o 'rank 0: .*did not complete within [0-9]* s' "$WORK/log")"
  fi
fi
kill -CONT "$victim" 2>/dev/null
finish
