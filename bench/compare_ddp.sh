#!/usr/bin/env bash
# compare_ddp.sh: ddp-train against PyTorch DDP (bench/torch_ddp.py, gloo on CPU) on the
# Fashion-MNIST MLP at 1 and 2 ranks, same model, per-rank batch and optimizer; prints one
# markdown table (paste it into docs/performance.md as is). Builds nothing.
#   bench/compare_ddp.sh [--repeats N] [--ddp-steps N] [--torch-steps N] [--ranks "1 2"]
#                        [--only ddp|torch] [--blas-as-detected] [--set key.path=value ...]
#                        [-- MPIRUN_ARGS...]   (--set and MPIRUN_ARGS go to ddp-train's runs)
# Binaries: $DDP_TRAIN (default build/ddp-train) and $DDP_BENCH_GEMM (default bench/ddp_bench_gemm
# next to ddp-train). Python: $TORCH_PYTHON (default /usr/bin/python3, Debian's, with torch).
# If OpenBLAS does not know the CPU it falls back to SSE3 kernels ("Prescott"); unless
# OPENBLAS_CORETYPE is set or --blas-as-detected is given, torch then runs with the AVX-512
# (SkylakeX) or AVX2 (Haswell) kernels, so ddp-train is compared with a fairly configured PyTorch.
set -euo pipefail

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
repeats=3; ddp_steps=5000; torch_steps=6000; ranks_list="1 2"; blas_as_detected=0; only=""
ddp_sets=(); mpi_extra=()
while (($#)); do
  case "$1" in
    --repeats) repeats="${2:?--repeats needs a number}"; shift 2 ;;
    --ddp-steps) ddp_steps="${2:?--ddp-steps needs a number}"; shift 2 ;;
    --torch-steps) torch_steps="${2:?--torch-steps needs a number}"; shift 2 ;;
    --ranks) ranks_list="${2:?--ranks needs a list like \"1 2\"}"; shift 2 ;;
    --blas-as-detected) blas_as_detected=1; shift ;;
    --only) only="${2:?--only needs ddp or torch}"; shift 2 ;;
    --set) ddp_sets+=(--set "${2:?--set needs key.path=value}"); shift 2 ;;
    --) shift; mpi_extra=(-- "$@"); break ;;
    -h|--help) usage 0 ;;
    *) echo "compare_ddp.sh: unknown argument $1" >&2; usage ;;
  esac
done
[[ -z "$only" || "$only" == ddp || "$only" == torch ]] || { echo "compare_ddp.sh: --only takes ddp or torch, got '$only'" >&2; exit 2; }
for n in "$repeats" "$ddp_steps" "$torch_steps"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "compare_ddp.sh: expected a positive integer, got '$n'" >&2; exit 2; }
done

train="${DDP_TRAIN:-$root/build/ddp-train}"
gemm="${DDP_BENCH_GEMM:-$(dirname "$train")/bench/ddp_bench_gemm}"
python="${TORCH_PYTHON:-/usr/bin/python3}"
config="$here/fashion_mnist_bench.yaml"
[[ -x "$train" ]] || { echo "compare_ddp.sh: ddp-train not found at $train (build it, or set DDP_TRAIN)" >&2; exit 2; }
[[ -x "$gemm" ]] || { echo "compare_ddp.sh: ddp_bench_gemm not found at $gemm (build target ddp_bench_gemm, or set DDP_BENCH_GEMM)" >&2; exit 2; }
"$python" -c "import torch" 2>/dev/null || { echo "compare_ddp.sh: $python cannot import torch (set TORCH_PYTHON)" >&2; exit 2; }
export DDP_TRAIN="$train"
if [[ "$(id -u)" == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# OpenBLAS 0.3.21 (Debian 12) predates some CPUs (e.g. Emerald Rapids) and then uses its SSE3
# "Prescott" kernels, several times slower than what the CPU can do.
env_given=""
for var in OPENBLAS_CORETYPE OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS OMP_NUM_THREADS; do
  if [[ -n "${!var:-}" ]]; then env_given+="env_$var=${!var}"$'\n'; fi
done
blas_note="as detected"
if [[ -z "${OPENBLAS_CORETYPE:-}" ]] && ((!blas_as_detected)); then
  detected="$("$python" "$here/torch_ddp.py" --openblas-core)"
  if [[ "$detected" == Prescott ]]; then
    if grep -qw avx512f /proc/cpuinfo; then
      export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then
      export OPENBLAS_CORETYPE=Haswell
    fi
    if [[ -n "${OPENBLAS_CORETYPE:-}" ]]; then
      blas_note="OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE set by compare_ddp.sh: OpenBLAS detected $detected, its SSE3 fallback for an unknown CPU"
    fi
  fi
elif [[ -n "${OPENBLAS_CORETYPE:-}" ]]; then
  blas_note="OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE from the environment"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/compare_ddp.XXXXXX")"
trap 'rm -rf "$work"' EXIT
results="$work/results.jsonl"
: > "$results"

# How busy the CPUs are with other work right now, in percent over 3 s (the load average lags by
# minutes and also counts this script's own previous runs).
cpu_busy_percent() {
  local a b
  a=($(head -1 /proc/stat)); sleep 3; b=($(head -1 /proc/stat))
  local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) ))
  local total=$(( (b[1] + b[2] + b[3] + b[4] + b[5] + b[6] + b[7] + b[8]) - (a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7] + a[8]) ))
  echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}

busy="$(cpu_busy_percent)"
if ((busy > 10)); then
  echo "compare_ddp.sh: warning: the CPUs are ${busy}% busy with other work; the numbers will be low and noisy" >&2
fi

# The machine as the table header reports it; the load is read before and after the runs.
{
  echo "busy_before=$busy"
  echo "load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  echo "cores=$(nproc)"
  echo "blas_alternative=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo unknown)"
  printf '%s' "$env_given"
  echo "blas_note=$blas_note"
  echo "ddp_train=$train"
  echo "ddp_extra=${ddp_sets[*]:-} ${mpi_extra[*]:-}"
  echo "repeats=$repeats"
} > "$work/machine.txt"

echo "compare_ddp.sh: single-core GEMM ceiling ($gemm)" >&2
"$gemm" > "$work/gemm.txt"

run_ddp() {  # ranks repeat
  local out="$work/ddp_n$1_r$2"
  "$root/launch/ddp-run" -n "$1" "$config" --set "training.max_steps=$ddp_steps" \
    --set "output.dir=$out" "${ddp_sets[@]}" "${mpi_extra[@]}" > "$out.log" 2>&1 ||
    { echo "compare_ddp.sh: ddp-train failed, its output:" >&2; cat "$out.log" >&2; exit 1; }
  tail -n 1 "$out/metrics.jsonl" | "$python" -c \
    'import json,sys; d=json.load(sys.stdin); d["impl"]="ddp"; print(json.dumps(d))' >> "$results"
}

run_torch() {  # ranks repeat
  "$python" "$here/torch_ddp.py" --world-size "$1" --steps "$torch_steps" \
    > "$work/torch_n$1_r$2.json" 2> "$work/torch_n$1_r$2.log" ||
    { echo "compare_ddp.sh: torch_ddp.py failed, its output:" >&2; cat "$work/torch_n$1_r$2.log" >&2; exit 1; }
  tail -n 1 "$work/torch_n$1_r$2.json" >> "$results"
}

# Repeats are interleaved (every configuration once, then again) so that a change in the
# machine's load during the script hits all configurations alike.
for ((r = 1; r <= repeats; r++)); do
  for n in $ranks_list; do
    if [[ "$only" != torch ]]; then
      echo "compare_ddp.sh: repeat $r/$repeats, $n rank(s): ddp-train, $ddp_steps steps" >&2
      run_ddp "$n" "$r"
    fi
    if [[ "$only" != ddp ]]; then
      echo "compare_ddp.sh: repeat $r/$repeats, $n rank(s): torch DDP, $torch_steps steps" >&2
      run_torch "$n" "$r"
    fi
  done
done
echo "load_after=$(cut -d' ' -f1-3 /proc/loadavg)" >> "$work/machine.txt"

"$python" "$here/compare_report.py" --machine "$work/machine.txt" --gemm "$work/gemm.txt" --results "$results"
