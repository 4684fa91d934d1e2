#!/usr/bin/env bash
# Slurm, for real: a controller and two nodes on this machine. (a) srun -N 2 -n 4 ddp-train and
# (b) sbatch launch/slurm/train.sbatch must train to the same weights as mpirun -n 4 on one node
# (to float rounding: one node sums through shared memory, two nodes through MPI_Allreduce),
# print the two-node layout, and (b) must end COMPLETED with its metrics file written.
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
finish
