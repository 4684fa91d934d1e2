# Our training against PyTorch on the same model, data, initial weights and batches (2 and 4
# ranks; and a wider model at 2). Skipped (exit 77) where Debian's python3-torch is not installed.
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
python=/usr/bin/python3
[[ -x "$python" ]] || { echo "SKIP: $python not found"; exit 77; }
rc=0
for n in 2 4; do
  "$python" "$DDP_SOURCE_DIR/tests/torch/reference.py" --ddp-train "$DDP_TRAIN" \
    --mpiexec "${DDP_MPIEXEC:-mpiexec}" --ranks "$n"
  code=$?
  ((code == 77)) && exit 77
  ((code == 0)) || rc=1
done
# Products large enough for the CPU backend's oneDNN GEMMs (the narrow model's take Eigen's).
# SGD only: on this wider model Adam's normalised update turns the last-bit differences of
# near-zero gradients into lr-sized steps (any GEMM's summation order, Eigen's included, lands
# ~3e-2 from torch there), while SGD's stay at rounding level.
"$python" "$DDP_SOURCE_DIR/tests/torch/reference.py" --ddp-train "$DDP_TRAIN" \
  --mpiexec "${DDP_MPIEXEC:-mpiexec}" --ranks 2 --layers 64,256,128,10 --batch 64 \
  --case sgd --case sgd_step_clip
(($? == 0)) || rc=1
exit $rc
