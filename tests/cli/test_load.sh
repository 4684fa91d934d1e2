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

# The stalled rank of test_timeout.sh, with two busy programs beside the job.
start_busy
stalled_rank_check "stalled rank under load" 3 "$WORK/stall"
stop_busy
finish
