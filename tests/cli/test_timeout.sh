# A rank that stops answering (here: SIGSTOP mid-training) must not hang the job: the others
# give up after distributed.timeout_s naming the collective, and the whole job ends non-zero
# within timeout_s + 10 s.
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"
checks=$((checks + 1))
timeout_s=3
"$DDP_MPIEXEC" -n 2 --oversubscribe "$DDP_TRAIN" --config "$seed" --set "output.dir=$WORK/out" \
  --set training.epochs=1000000 --set training.log_every=0 --set distributed.timeout_s=$timeout_s \
  >"$WORK/log" 2>&1 &
launcher=$!
# The rank-1 process, once training has started.
victim=""
for _ in $(seq 1 100); do
  for pid in $(pgrep -f "ddp-train --config $seed" || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
      victim=$pid
    fi
  done
  [[ -n "$victim" ]] && grep -q '^model:' "$WORK/log" && break
  sleep 0.2
done
if [[ -z "$victim" ]]; then
  fail "stalled rank: rank 1 never started"; kill "$launcher" 2>/dev/null; finish; exit
fi
sleep 1
kill -STOP "$victim"
start=$SECONDS
# Wait for the job, at most timeout_s + 10 s.
for _ in $(seq 1 $(((timeout_s + 10) * 10))); do
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$launcher" 2>/dev/null; then
  fail "stalled rank: the job still runs $((SECONDS - start)) s after rank 1 stopped"
  kill -CONT "$victim"; kill "$launcher"; wait "$launcher" 2>/dev/null
else
  wait "$launcher"; rc=$?
  elapsed=$((SECONDS - start))
  if ((rc == 0)); then
    fail "stalled rank: the job exited 0"
  elif ! grep -q "did not complete within $timeout_s s" "$WORK/log"; then
    fail "stalled rank: no timeout message"; tail -5 "$WORK/log"
  else
    pass "stalled rank: job ended (code $rc) ${elapsed}s after rank 1 stopped: $(grep -m1 -o 'rank 0: .*did not complete within [0-9]* s' "$WORK/log")"
  fi
fi
kill -CONT "$victim" 2>/dev/null
finish
