#!/usr/bin/env bash
# Slurm, for real: a controller and two nodes on this machine. (a) srun -N 2 -n 4 ddp-train and
# (b) sbatch launch/slurm/train.sbatch must train to the same weights as mpirun -n 4 on one node
# (to float rounding: one node sums through shared memory, two nodes through MPI_Allreduce),
# print the two-node layout, and (b) must end COMPLETED with its metrics file written. (c) A task
# killed with SIGKILL under srun: the step ends on every node within distributed.timeout_s +
# 10 s, non-zero, naming the task (Slurm's PMIx plugin sees the death first; a stalled rank,
# which nothing sees, is tests/cli/test_timeout.sh). (d) SIGTERM to a batch job: the
# ranks checkpoint and exit 75, the script requeues the job, and the job continues from the
# checkpoint to the end. (e) DDP_MAX_RESTARTS=1 and a task SIGKILLed in a batch job: the script
# probes both nodes, runs the step again with --resume auto, and the job completes.
# shellcheck source=tests/cluster/lib.sh
source "$(dirname "$0")/lib.sh"
require_tools slurmctld slurmd srun sbatch scontrol sinfo munge unmunge unshare
reference_runs
start_munge
start_slurm
# Open MPI leaves 127.0.0.0/8 alone unless told: both "nodes" talk over loopback here.
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo

# (a) srun inside an interactive-style allocation.
if timeout 120 srun -N 2 -n 4 --mpi=pmix "$DDP_TRAIN" "${TRAIN_ARGS[@]}" \
  --set output.dir="$WORK/srun" >"$WORK/srun.log" 2>&1; then
  pass "srun -N 2 -n 4 ddp-train exited 0"
else
  cat "$WORK/srun.log"; fail "srun -N 2 -n 4 ddp-train failed"
fi
if grep -q "n1: ranks 0 1" "$WORK/srun.log" && grep -q "n2: ranks 2 3" "$WORK/srun.log"; then
  pass "srun: rank 0 printed the layout of 2 nodes x 2 ranks"
else
  grep -i "ranks" "$WORK/srun.log"; fail "srun: layout n1: ranks 0 1 / n2: ranks 2 3 not printed"
fi
compare "srun 2 nodes x 2 ranks vs 1 node x 4 ranks" "$WORK/ref4/model.safetensors" \
  "$WORK/srun/model.safetensors"

# (b) the job script, as a user submits it (from the source tree, relative config path).
jid="$(cd "$DDP_SOURCE_DIR" && DDP_TRAIN="$DDP_TRAIN" sbatch --parsable -N 2 --ntasks-per-node=2 \
  --output="$WORK/sbatch-%j.out" launch/slurm/train.sbatch configs/seed.yaml \
  --set optimizer.lr=0.05 --set optimizer.momentum=0.9 --set training.epochs=3 \
  --set training.print_shapes=false --set output.dir="$WORK/sbatch")"
if [[ -z "$jid" ]]; then
  fail "sbatch did not submit"
else
  wait_job "$jid" 120
  if [[ "$job_state" == COMPLETED ]]; then pass "sbatch job $jid COMPLETED"; else
    cat "$WORK/sbatch-$jid.out"; fail "sbatch job $jid ended $job_state"
  fi
  if grep -q '"type":"summary"' "$WORK/sbatch/metrics.jsonl" 2>/dev/null; then
    pass "sbatch: metrics.jsonl has the final summary"
  else
    fail "sbatch: no summary in $WORK/sbatch/metrics.jsonl"
  fi
  grep -q "n2: ranks 2 3" "$WORK/sbatch-$jid.out" && pass "sbatch: layout of 2 nodes" ||
    fail "sbatch: layout of 2 nodes not printed"
  compare "sbatch 2 nodes x 2 ranks vs 1 node x 4 ranks" "$WORK/ref4/model.safetensors" \
    "$WORK/sbatch/model.safetensors"
fi

# The pids of the ddp-train processes writing to output dir $1.
ranks_of() {
  local pid
  for pid in $(pgrep -f -- "output.dir=$1( |$)" || true); do
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == ddp-train ]] && echo "$pid"
  done
}
task_pid() {  # task_pid DIR RANK
  local pid
  for pid in $(ranks_of "$1"); do
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_PROCID=$2" && echo "$pid"
  done
}

# (c) SIGKILL of one task under srun.
timeout_s=5
timeout 120 srun -N 2 -n 4 --mpi=pmix "$DDP_TRAIN" "${TRAIN_ARGS[@]}" --set training.epochs=1000000 \
  --set training.log_every=0 --set distributed.timeout_s=$timeout_s \
  --set output.dir="$WORK/killed" >"$WORK/killed.log" 2>&1 &
step=$!
victim=""
for ((i = 0; i < 300; ++i)); do
  victim="$(task_pid "$WORK/killed" 3)"
  [[ -n "$victim" ]] && grep -q '^epoch 3/' "$WORK/killed.log" && break
  sleep 0.1
done
if [[ -z "$victim" ]]; then
  cat "$WORK/killed.log" | tail -5; fail "srun + SIGKILL: task 3 never started training"; kill "$step"
else
  kill -9 "$victim"
  start=$SECONDS
  for ((i = 0; i < (timeout_s + 10) * 10; ++i)); do
    kill -0 "$step" 2>/dev/null || [[ -n "$(ranks_of "$WORK/killed")" ]] || break
    sleep 0.1
  done
  left="$(ranks_of "$WORK/killed")"
  if [[ -n "$left" ]]; then
    fail "srun + SIGKILL: tasks still run $((SECONDS - start)) s after task 3 was killed"
    kill -9 $left 2>/dev/null
  fi
  wait "$step"; code=$?
  if [[ -z "$left" ]] && ((code != 0)) && grep -q "task 3: Killed" "$WORK/killed.log"; then
    pass "srun + SIGKILL of task 3: every task ended $((SECONDS - start)) s later (srun $code, 'task 3: Killed')"
  elif [[ -z "$left" ]]; then
    tail -8 "$WORK/killed.log"; fail "srun + SIGKILL: srun exited $code without naming task 3"
  fi
fi

# (d) SIGTERM to a batch job: checkpoint, exit 75, requeue, resume, completion.
long=(--set training.epochs=60 --set training.log_every=0)
timeout 300 "${DDP_MPIEXEC:-mpiexec}" -n 4 --oversubscribe "$DDP_TRAIN" "${TRAIN_ARGS[@]}" "${long[@]}" \
  --set output.dir="$WORK/longref" >"$WORK/longref.log" 2>&1 || fail "reference run (60 epochs) failed"
jid="$(cd "$DDP_SOURCE_DIR" && DDP_TRAIN="$DDP_TRAIN" sbatch --parsable -N 2 --ntasks-per-node=2 \
  --open-mode=append --output="$WORK/requeue-%j.out" launch/slurm/train.sbatch configs/seed.yaml \
  --set optimizer.lr=0.05 --set optimizer.momentum=0.9 --set training.print_shapes=false "${long[@]}" \
  --set output.dir="$WORK/requeue")"
if [[ -z "$jid" ]]; then
  fail "sbatch (requeue) did not submit"
else
  for ((i = 0; i < 600; ++i)); do
    grep -q '^epoch 5/' "$WORK/requeue-$jid.out" 2>/dev/null && break
    sleep 0.1
  done
  scancel --signal=TERM --batch "$jid"
  # Slurm holds a requeued job for two minutes (Reason=BeginTime: until the credentials the
  # nodes revoked for the first attempt expire). Let it start sooner, once the interrupted
  # attempt's step daemons are gone (a new step of the same id would collide with them) and the
  # nodes have finished with it, in a later second than that: a node refuses a credential issued
  # in the second it revoked the job's ("Job credential revoked").
  for ((i = 0; i < 600; ++i)); do
    if scontrol show job "$jid" 2>/dev/null | grep -q "JobState=PENDING" &&
      ! pgrep -f "slurmstepd: \[$jid\." >/dev/null && ! sinfo -h -N -o %T | grep -q comp; then
      sleep 1.1
      scontrol update JobId="$jid" StartTime=now
      break
    fi
    sleep 0.1
  done
  wait_job "$jid" 240
  out="$WORK/requeue-$jid.out"
  restarts="$(scontrol show job "$jid" 2>/dev/null | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')"
  if [[ "$job_state" != COMPLETED ]]; then
    tail -40 "$out"; fail "sbatch requeue: job $jid ended $job_state"
  elif ! grep -q "exited with status 75" "$out" || ! grep -q "requeueing job $jid" "$out"; then
    grep train.sbatch "$out"; fail "sbatch requeue: no interruption (exit 75) and requeue in the job output"
  elif ! grep -q '^resume: .*step-' "$out"; then
    grep -v "^epoch" "$out" | tail -20; fail "sbatch requeue: the requeued job did not resume from the checkpoint"
  else
    pass "sbatch requeue: SIGTERM -> $(grep -m1 -o 'step-[0-9]*.safetensors' "$out") -> exit 75 -> requeued (restarts $restarts) -> $(grep -m1 -o '^resume: .*)' "$out" | sed 's/.*: epoch/epoch/') -> COMPLETED"
    compare "sbatch requeued 2 nodes x 2 ranks vs uninterrupted 1 node x 4 ranks" \
      "$WORK/longref/model.safetensors" "$WORK/requeue/model.safetensors"
  fi
fi

# (e) DDP_MAX_RESTARTS: a task SIGKILLed in a batch job; the step runs again and the job completes.
jid="$(cd "$DDP_SOURCE_DIR" && DDP_TRAIN="$DDP_TRAIN" DDP_MAX_RESTARTS=1 sbatch --parsable -N 2 \
  --ntasks-per-node=2 --output="$WORK/restart-%j.out" launch/slurm/train.sbatch configs/seed.yaml \
  --set training.epochs=300 --set training.log_every=0 --set training.print_shapes=false \
  --set checkpoint.every_steps=50 --set distributed.timeout_s=10 --set output.dir="$WORK/restart")"
if [[ -z "$jid" ]]; then
  fail "sbatch (DDP_MAX_RESTARTS) did not submit"
else
  victim=""
  for ((i = 0; i < 1200; ++i)); do
    victim="$(task_pid "$WORK/restart" 3)"
    [[ -n "$victim" ]] && compgen -G "$WORK/restart/checkpoints/step-*" >/dev/null && break
    victim=""
    sleep 0.1
  done
  [[ -n "$victim" ]] && kill -9 "$victim"
  wait_job "$jid" 240
  out="$WORK/restart-$jid.out"
  if [[ -z "$victim" ]]; then
    tail -20 "$out"; fail "sbatch DDP_MAX_RESTARTS: task 3 never wrote a checkpoint"
  elif [[ "$job_state" != COMPLETED ]] ||
      ! grep -q "^train.sbatch: attempt 2 of 2 after a rank killed by SIGKILL (exit 137): resuming from the newest checkpoint$" "$out" ||
      ! grep -q "^resume: .*step-" "$out" || [[ ! -f "$WORK/restart/model.safetensors" ]]; then
    grep -v '^epoch' "$out" | tail -30; fail "sbatch DDP_MAX_RESTARTS: job $jid ended $job_state"
  else
    pass "sbatch DDP_MAX_RESTARTS=1, task 3 SIGKILLed: $(grep -m1 '^train.sbatch: attempt' "$out" | cut -c15-) -> $(grep -m1 -o '^resume: .*)' "$out" | sed 's/.*: epoch/epoch/') -> COMPLETED"
  fi
fi
finish

