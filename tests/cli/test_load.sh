# Training under load: two busy programs at normal priority beside a 2-rank run, in the job's own
# session (so the scheduler weighs them against the ranks' threads, as in a shared cgroup or
# without autogroup). The run must finish within 120 s (it used to stall for many minutes) with
# bitwise the weights of the same run on a quiet machine; and a stalled rank must still end the
# loaded job within distributed.timeout_s + 10 s, naming the collective.
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"
args=(--config "$seed" --set training.epochs=15 --set training.log_every=0 --set distributed.timeout_s=60)
busy=()
start_busy() { for _ in 1 2; do sh -c 'while :; do :; done' & busy+=("$!"); done; }
stop_busy() { ((${#busy[@]})) && kill "${busy[@]}" 2>/dev/null; wait "${busy[@]}" 2>/dev/null; busy=(); }
trap stop_busy EXIT

checks=$((checks + 1))
run_ranks 2 120 "${args[@]}" --set "output.dir=$WORK/quiet"
quiet_s=$elapsed
start_busy
run_ranks 2 120 "${args[@]}" --set "output.dir=$WORK/loaded"
stop_busy
if ((rc != 0)); then
  fail "two busy programs: the 2-rank run ended with $rc (rank codes $rank_codes) after ${elapsed}s (124: did not finish in 120 s)"
  echo "$out" | tail -5
elif ! cmp -s "$WORK/quiet/model.safetensors" "$WORK/loaded/model.safetensors"; then
  fail "two busy programs: the weights differ from the quiet run's"
else
  pass "two busy programs: 300 steps in ${elapsed}s (quiet: ${quiet_s}s), weights bitwise those of the quiet run"
fi

# The stalled rank of test_timeout.sh, with one busy program beside the job.
checks=$((checks + 1))
timeout_s=3
start_busy
start_ranks 2 "$WORK/log" --config "$seed" --set "output.dir=$WORK/stall" \
  --set training.epochs=1000000 --set training.log_every=0 --set distributed.timeout_s=$timeout_s
victim=""
for _ in $(seq 1 150); do
  victim="$(rank_pid "output.dir=$WORK/stall" 1)"
  [[ -n "$victim" ]] && grep -q '^model:' "$WORK/log" && break
  sleep 0.2
done
if [[ -z "$victim" ]]; then
  fail "stalled rank under load: rank 1 never started"; kill "$launcher" 2>/dev/null
else
  sleep 1
  kill -STOP "$victim"
  start=$SECONDS
  launcher_done() { ! kill -0 "$launcher" 2>/dev/null; }
  if ! wait_until $((timeout_s + 10)) launcher_done; then
    fail "stalled rank under load: the job still runs $((SECONDS - start)) s after rank 1 stopped"
    kill -CONT "$victim"; kill "$launcher"; wait "$launcher" 2>/dev/null
  else
    wait "$launcher"; rc=$?
    read_rank_codes 2
    if ((rc == 0)); then
      fail "stalled rank under load: the job exited 0"
    elif ! grep -q "did not complete within $timeout_s s" "$WORK/log"; then
      fail "stalled rank under load: no timeout message"; tail -5 "$WORK/log"
    else
      pass "stalled rank under load: job ended (code $rc, rank codes $rank_codes) $((SECONDS - start))s after rank 1 stopped: $(grep -m1 -o 'rank 0: .*did not complete within [0-9]* s' "$WORK/log")"
    fi
  fi
  kill -CONT "$victim" 2>/dev/null
fi
stop_busy
finish
