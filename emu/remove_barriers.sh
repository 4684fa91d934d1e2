#!/usr/bin/env bash
# Proves the emulation's serial schedules catch a missing barrier: for every __syncthreads() and
# __syncwarp() in the kernel headers, in turn, builds the emulated kernel tests without it and
# runs them under each thread schedule (emu/cuda_emu.h). Prints one row per barrier:
# "caught" where a test failed, "passed" where the removal went unnoticed. Exits 1 if some
# removal passes every serial schedule.
#   emu/remove_barriers.sh [WORK_DIR]
# SCHEDULES="forward rotate" picks the schedules (default: all of them, parallel first).
# Works on a copy of the source tree (WORK_DIR, default a new temporary directory), so the
# checkout is never modified; needs only a C++ compiler (the emulation, no CUDA).
set -uo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d "${TMPDIR:-/tmp}/remove_barriers.XXXXXX")}"
read -r -a schedules <<<"${SCHEDULES:-parallel forward reverse random rotate}"
limit_s=900

mkdir -p "$work"
rm -rf "$work/tree" && mkdir -p "$work/tree"
tar -C "$src" --exclude=./build --exclude=./.git -cf - . | tar -C "$work/tree" -xf -
cmake -S "$work/tree" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DDDP_KERNELS_ONLY=ON \
  -DDDP_CUDA=OFF >"$work/configure.log" 2>&1 || { echo "configure failed: $work/configure.log"; exit 2; }

build() { cmake --build "$work/build" --target ddp_cuda_emu_tests -j "$(nproc)" >"$work/build.log" 2>&1; }
# run SCHEDULE: the kernel tests, stopping at the first failure; "caught" or "passed".
run() {
  if DDP_EMU_SCHEDULE="$1" timeout "$limit_s" "$work/build/tests/ddp_cuda_emu_tests" -a "[cuda]" \
    >"$work/run.log" 2>&1; then
    echo passed
  else
    echo caught
  fi
}

build || { echo "the unmodified tests do not build: $work/build.log"; exit 2; }
for s in "${schedules[@]}"; do
  [[ "$(run "$s")" == passed ]] || { echo "the unmodified tests fail with schedule $s"; exit 2; }
done

printf '%-46s' "barrier removed"
printf ' %-9s' "${schedules[@]}"
echo
status=0
cd "$work/tree"
while IFS=: read -r file line _; do
  cp "$file" "$work/saved"
  sed -i "${line}s/__sync\(threads\|warp\)([^)]*);/\/* removed *\//" "$file"
  printf '%-46s' "$file:$line"
  if ! build; then
    echo " does not build without it: $work/build.log"
    status=1
  else
    caught_serial=0
    for s in "${schedules[@]}"; do
      r="$(run "$s")"
      printf ' %-9s' "$r"
      [[ "$s" != parallel && "$r" == caught ]] && caught_serial=1
    done
    echo
    ((caught_serial)) || status=1
  fi
  cp "$work/saved" "$file"
done < <(grep -n -E '__sync(threads|warp)\(' src/kernels/cuda/*.cuh src/kernels/cuda/*.cu | grep -v -E '^[^:]+:[0-9]+:\s*//')
build
exit "$status"
