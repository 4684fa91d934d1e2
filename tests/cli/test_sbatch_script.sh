#!/usr/bin/env bash
# launch/slurm/train.sbatch refuses bad use before it reaches srun: no config, an unreadable
# config, no ddp-train to run, bad DDP_MAX_RESTARTS. Its restart loop (DDP_MAX_RESTARTS) runs
# against an srun on PATH that records its calls and exits with given codes, and answers the
# node probes but for the nodes in $DOWN. (Running it under a real Slurm is
# tests/cluster/test_slurm.sh.)
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"
script="$DDP_SOURCE_DIR/launch/slurm/train.sbatch"

expect_script_error() {  # NAME MESSAGE ARGS...
  local name="$1" message="$2"; shift 2
  checks=$((checks + 1))
  out="$("$@" 2>&1)"; rc=$?
  if ((rc != 2)); then fail "$name: exit $rc, expected 2 ($out)";
  elif [[ "$out" != *"$message"* ]]; then fail "$name: message '$out' lacks '$message'";
  else pass "$name"; fi
}

expect_script_error "no config" "usage: sbatch launch/slurm/train.sbatch CONFIG" bash "$script"
expect_script_error "unreadable config" "config '$WORK/none.yaml' is not readable" \
  bash "$script" "$WORK/none.yaml"
expect_script_error "no binary" "ddp-train not found" \
  env DDP_TRAIN="$WORK/missing" bash "$script" "$DDP_SOURCE_DIR/configs/seed.yaml"
expect_script_error "bad DDP_MAX_RESTARTS" "DDP_MAX_RESTARTS (x) must be a number >= 0" \
  env DDP_TRAIN="$DDP_TRAIN" DDP_MAX_RESTARTS=x bash "$script" "$DDP_SOURCE_DIR/configs/seed.yaml"

# An srun and a scontrol for the loop: a step exits with the next code of $WORK/codes.
mkdir -p "$WORK/bin"
cat >"$WORK/bin/srun" <<FAKE
#!/bin/bash
echo "\$*" >>$(printf '%q' "$WORK")/srun.calls
if [[ "\${@: -1}" == true ]]; then  # a node probe: srun -N 1 -n 1 -w NODE --mpi=none true
  [[ " \$DOWN " == *" \$6 "* ]] && exit 1
  exit 0
fi
code=\$(head -1 $(printf '%q' "$WORK")/codes); sed -i 1d $(printf '%q' "$WORK")/codes
exit "\$code"
FAKE
printf '#!/bin/bash\necho n1; echo n2\n' >"$WORK/bin/scontrol"
chmod +x "$WORK/bin/srun" "$WORK/bin/scontrol"

# loop NAME CODES EXPECTED_EXIT [VAR=VALUE...]: the script on 2 nodes x 2 tasks (seed config)
# whose steps exit CODES in turn; sets $out and $steps (the step calls, one a line).
loop() {
  local name="$1" codes="$2" expected="$3"; shift 3
  checks=$((checks + 1))
  tr ' ' '\n' <<<"$codes" >"$WORK/codes"
  rm -f "$WORK/srun.calls"
  out="$(env PATH="$WORK/bin:$PATH" DDP_TRAIN="$DDP_TRAIN" SLURM_JOB_NODELIST='n[1-2]' \
    SLURM_JOB_NUM_NODES=2 SLURM_NTASKS=4 SLURM_NTASKS_PER_NODE=2 "$@" \
    bash "$script" "$DDP_SOURCE_DIR/configs/seed.yaml" --set training.epochs=3 2>&1)"
  rc=$?
  steps="$(grep -- '--config' "$WORK/srun.calls")"
  if ((rc != expected)); then fail "$name: exit $rc, expected $expected"; echo "$out"; return 1; fi
}
nth_step() { sed -n "$1p" <<<"$steps"; }

if loop "killed, restarted" "137 0" 0 DDP_MAX_RESTARTS=2; then
  if [[ "$out" != *"train.sbatch: attempt 2 of 3 after a rank killed by SIGKILL (exit 137): resuming from the newest checkpoint"* ]] ||
      [[ "$(wc -l <<<"$steps")" != 2 || "$(nth_step 2)" != *" -N 2 -n 4 -w n1,n2 $DDP_TRAIN --config "*"--resume auto --set training.epochs=3" ]]; then
    fail "killed, restarted: not restarted on both nodes with --resume auto"; echo "$out"; echo "$steps"
  else
    pass "DDP_MAX_RESTARTS=2, a rank killed (137): attempt 2 on n1,n2 with --resume auto, exit 0"
  fi
fi
if loop "a node lost" "76 0" 0 DDP_MAX_RESTARTS=1 DOWN=n2; then
  if [[ "$out" != *"node n2 does not answer"* || "$out" != *"2 of 4 ranks: --set training.accumulate_steps=2 keeps the global batch of 200 samples"* ]] ||
      [[ "$(nth_step 2)" != *" -N 1 -n 2 -w n1 $DDP_TRAIN --config "*"--resume auto --set training.epochs=3 --set training.accumulate_steps=2" ]]; then
    fail "a node lost: not restarted on n1 alone at the same global batch"; echo "$out"; echo "$steps"
  else
    pass "a peer lost (76), n2 not answering: attempt 2 on n1's 2 tasks with accumulate_steps=2"
  fi
fi
if loop "fewer than DDP_MIN_RANKS" "76" 76 DDP_MAX_RESTARTS=1 DOWN=n2 DDP_MIN_RANKS=3; then
  if [[ "$out" != *"not restarting after a lost peer (a collective timed out) (exit 76): 2 rank(s) left on the nodes that answer, fewer than DDP_MIN_RANKS=3"* ]] ||
      [[ "$(wc -l <<<"$steps")" != 1 ]]; then
    fail "fewer than DDP_MIN_RANKS: no refusal"; echo "$out"
  else
    pass "DDP_MIN_RANKS=3 with 2 ranks left: exit 76, not restarted"
  fi
fi
if loop "config error" "1" 1 DDP_MAX_RESTARTS=2; then
  if [[ "$(wc -l <<<"$steps")" != 1 || "$out" == *"attempt 2"* ]]; then
    fail "config error: restarted"; echo "$out"
  else
    pass "an agreed error (1): one step, exit 1"
  fi
fi
if loop "restarts spent" "137 137" 137 DDP_MAX_RESTARTS=1; then
  if [[ "$out" != *"train.sbatch: giving up: attempt 2 of 2 ended with a rank killed by SIGKILL (exit 137)"* ]]; then
    fail "restarts spent: no 'giving up'"; echo "$out"
  else
    pass "two kills, DDP_MAX_RESTARTS=1: exit 137, giving up"
  fi
fi
if loop "no DDP_MAX_RESTARTS" "137" 137; then
  if [[ "$(wc -l <<<"$steps")" != 1 || "$(nth_step 1)" != "--mpi=pmix --kill-on-bad-exit=0 --wait=30 $DDP_TRAIN --config "* ]]; then
    fail "no DDP_MAX_RESTARTS: not the plain step"; echo "$steps"
  else
    pass "without DDP_MAX_RESTARTS: one plain step, exit 137"
  fi
fi
finish
