#!/usr/bin/env bash
# Compiler launcher for nvcc (CMAKE_CUDA_COMPILER_LAUNCHER): runs the compile with
# --resource-usage and keeps ptxas's per-kernel report (registers, shared memory, stack for each
# kernel and architecture) in <object>.resources, where the launch audit and the emulation read
# it (emu/launch_limits.h). Everything else the compiler says passes through.
set -uo pipefail
out=""
prev=""
for arg in "$@"; do
  [[ "$prev" == "-o" ]] && out="$arg"
  prev="$arg"
done
# Not an object compile (dependency scan, linking): nothing to report.
[[ -z "$out" || "$out" != *.o ]] && exec "$@"
report="$out.resources"
"$@" --resource-usage 2>"$report.tmp"
status=$?
grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' "$report.tmp" >&2
mv -f "$report.tmp" "$report"
exit "$status"
