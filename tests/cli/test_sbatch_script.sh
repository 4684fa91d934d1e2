#!/usr/bin/env bash
# launch/slurm/train.sbatch refuses bad use before it reaches srun: no config, an unreadable
# config, no ddp-train to run. (Running it under a real Slurm is tests/cluster/test_slurm.sh.)
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
finish
