# Our bf16 training (training.precision: bf16) against PyTorch's autocast, loss by loss, on the
# same model, data, initial weights and batches (1 and 2 ranks). Skipped (exit 77) where Debian's
# python3-torch is not installed.
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
python=/usr/bin/python3
[[ -x "$python" ]] || { echo "SKIP: $python not found"; exit 77; }
rc=0
for n in 1 2; do
  "$python" "$DDP_SOURCE_DIR/tests/torch/autocast_reference.py" --ddp-train "$DDP_TRAIN" \
    --mpiexec "${DDP_MPIEXEC:-mpiexec}" --ranks "$n"
  code=$?
  ((code == 77)) && exit 77
  ((code == 0)) || rc=1
done
exit $rc
