#!/usr/bin/env bash
# precision_bench.sh: training samples/s of ddp-train in fp32 and bf16 (training.precision) beside
# PyTorch DDP (bench/torch_ddp.py, gloo) in fp32 and under bf16 autocast, on the Fashion-MNIST MLP
# of bench/fashion_mnist_bench.yaml at batch 256 per rank; interleaved repeats, medians, the
# bf16 ÷ fp32 ratio of each; prints one markdown table.
#   bench/precision_bench.sh [--ddp-train PATH] [--baseline PATH] [--repeats N] [--steps N]
#                            [--ranks "1 2"] [--run-timeout S]
# --baseline adds an older ddp-train (e.g. the previous main's) in fp32 as its own column.
# ddp-train's default: $DDP_TRAIN, else build/ddp-train. Python: $TORCH_PYTHON (default Debian's
# /usr/bin/python3). A ddp-train without training.precision gets "—" in its bf16 column.
set -euo pipefail

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
train="${DDP_TRAIN:-$root/build/ddp-train}"
baseline=""; repeats=3; steps=1000; ranks_list="1 2"; run_timeout=300; batch=256
while (($#)); do
  case "$1" in
    --ddp-train) train="${2:?--ddp-train needs a ddp-train binary}"; shift 2 ;;
    --baseline) baseline="${2:?--baseline needs a ddp-train binary}"; shift 2 ;;
    --repeats) repeats="${2:?--repeats needs a number}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
    --ranks) ranks_list="${2:?--ranks needs a list like \"1 2\"}"; shift 2 ;;
    --run-timeout) run_timeout="${2:?--run-timeout needs seconds}"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "precision_bench.sh: unknown argument $1" >&2; usage ;;
  esac
done
for v in "$repeats" "$steps" "$run_timeout" $ranks_list; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "precision_bench.sh: expected a positive integer, got '$v'" >&2; exit 2; }
done

python="${TORCH_PYTHON:-/usr/bin/python3}"
config="$here/fashion_mnist_bench.yaml"
[[ -x "$train" ]] || { echo "precision_bench.sh: ddp-train not found at $train (build it, or --ddp-train)" >&2; exit 2; }
[[ -z "$baseline" || -x "$baseline" ]] || { echo "precision_bench.sh: --baseline $baseline is not an executable" >&2; exit 2; }
"$python" -c "import torch" 2>/dev/null || { echo "precision_bench.sh: $python cannot import torch (set TORCH_PYTHON)" >&2; exit 2; }
if [[ "$(id -u)" == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Read whole first: grep -q would stop at the match and the SIGPIPE fail the pipeline.
keys="$("$train" --list-config-keys)"
has_bf16=0
grep -q '^training\.precision ' <<<"$keys" && has_bf16=1

# As in compare_ddp.sh: OpenBLAS 0.3.21 (Debian 12) falls back to its SSE3 "Prescott" kernels on
# CPUs it predates; torch's fp32 GEMMs then get the AVX-512 or AVX2 kernels the CPU has. (torch's
# bf16 GEMMs go to oneDNN, which picks its own ISA; the header names it.)
blas_note="as detected"
if [[ -z "${OPENBLAS_CORETYPE:-}" ]]; then
  detected="$("$python" "$here/torch_ddp.py" --openblas-core)"
  if [[ "$detected" == Prescott ]]; then
    if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
    [[ -n "${OPENBLAS_CORETYPE:-}" ]] &&
      blas_note="OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE (OpenBLAS detected $detected, its SSE3 fallback)"
  else
    blas_note="OpenBLAS core $detected as detected"
  fi
else
  blas_note="OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE from the environment"
fi
# The oneDNN kernel torch's bf16 Linear runs on this CPU, from oneDNN's own log of one call.
onednn="$(ONEDNN_VERBOSE=1 DNNL_VERBOSE=1 OMP_NUM_THREADS=1 "$python" -c '
import torch
with torch.autocast("cpu", dtype=torch.bfloat16):
    torch.nn.functional.linear(torch.randn(256, 784), torch.randn(256, 784))' 2>&1 |
  awk -F, '/,info,cpu,isa:/ {isa = $4} /,exec,cpu,matmul|,exec,cpu,inner_product/ && !impl {impl = $5}
           END {sub(/^isa:/, "", isa); print (impl ? impl : "no oneDNN call seen") " (" (isa ? isa : "ISA not reported") ")"}')"

# How busy the CPUs are with other work, in percent over 3 s (as compare_ddp.sh measures it).
cpu_busy_percent() {
  local a b
  a=($(head -1 /proc/stat)); sleep 3; b=($(head -1 /proc/stat))
  local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) ))
  local total=$(( (b[1] + b[2] + b[3] + b[4] + b[5] + b[6] + b[7] + b[8]) - (a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7] + a[8]) ))
  echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}
busy="$(cpu_busy_percent)"
((busy <= 10)) || echo "precision_bench.sh: warning: the CPUs are ${busy}% busy with other work; the numbers will be low and noisy" >&2

work="$(mktemp -d "${TMPDIR:-/tmp}/precision_bench.XXXXXX")"
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
results="$work/results.txt"  # impl ranks repeat samples_per_sec|timeout|failed
: > "$results"

# record "IMPL RANKS REPEAT" RC LOG JSONL: one line of $results, from a run's exit code and the
# samples_per_sec of the last line of its JSON lines.
record() {
  if (($2 == 124 || $2 == 137)); then
    echo "$1 timeout" >> "$results"
  elif (($2 != 0)); then
    echo "precision_bench.sh: $1 (impl ranks repeat) failed (exit $2):" >&2; tail -5 "$3" >&2
    echo "$1 failed" >> "$results"
  else
    echo "$1 $("$python" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["samples_per_sec"])' "$4")" >> "$results"
  fi
}

run_ddp() {  # impl binary precision ranks repeat; launched as ddp-run launches it (binding)
  local out="$work/$1_n$4_r$5" cmd rc=0 sets=()
  [[ "$3" == fp32 ]] || sets=(--set "training.precision=$3")
  cmd="$(DDP_TRAIN="$2" "$root/launch/ddp-run" --dry-run -n "$4" "$config" \
    --set "training.max_steps=$steps" --set "training.batch_size=$batch" \
    --set "output.dir=$out" "${sets[@]}")"
  timeout --kill-after=5 "$run_timeout" bash -c "$cmd" > "$out.log" 2>&1 || rc=$?
  record "$1 $4 $5" "$rc" "$out.log" "$out/metrics.jsonl"
}

run_torch() {  # impl autocast ranks repeat
  local out="$work/$1_n$3_r$4" rc=0
  timeout --kill-after=5 "$run_timeout" "$python" "$here/torch_ddp.py" --world-size "$3" \
    --steps "$steps" --batch-size "$batch" --autocast "$2" > "$out.json" 2> "$out.log" || rc=$?
  record "$1 $3 $4" "$rc" "$out.log" "$out.json"
}

# Interleaved: each repeat runs every configuration once, so a drift of the machine's own load
# hits all of them alike.
for ((r = 1; r <= repeats; r++)); do
  for n in $ranks_list; do
    echo "precision_bench.sh: repeat $r/$repeats, $n rank(s)" >&2
    run_ddp ddp_fp32 "$train" fp32 "$n" "$r"
    ((has_bf16)) && run_ddp ddp_bf16 "$train" bf16 "$n" "$r"
    [[ -n "$baseline" ]] && run_ddp baseline_fp32 "$baseline" fp32 "$n" "$r"
    run_torch torch_fp32 off "$n" "$r"
    run_torch torch_bf16 bf16 "$n" "$r"
  done
done

"$python" - "$results" "$steps" "$batch" "$train" "$baseline" "$has_bf16" "$blas_note" "$onednn" \
  "$busy" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import statistics, subprocess, sys
import torch
path, steps, batch, train, baseline, has_bf16, blas_note, onednn, busy, load = sys.argv[1:11]
runs = {}
for line in open(path):
    impl, n, _, value = line.split()
    runs.setdefault((impl, int(n)), []).append(value)

def median(impl, n):
    values = runs.get((impl, n), [])
    nums = [float(v) for v in values if v not in ("timeout", "failed")]
    return statistics.median(nums) if values and len(nums) == len(values) else None

def cell(impl, n):
    if (impl, n) not in runs:
        return "—"
    m = median(impl, n)
    if m is None:
        bad = [v for v in runs[(impl, n)] if v in ("timeout", "failed")]
        return f"{len(bad)} of {len(runs[(impl, n)])} {bad[0]}"
    return f"{m:,.0f}"

def ratio(a, b, n):
    x, y = median(a, n), median(b, n)
    return f"{x / y:.2f}×" if x and y else "—"

cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p' | head -1"],
                     capture_output=True, text=True).stdout.strip()
flags = set()
for line in open("/proc/cpuinfo"):
    if line.startswith("flags"):
        flags = set(line.split(":", 1)[1].split())
        break
have = lambda f: f"{f} {'yes' if f in flags else 'no'}"
cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
repeats = max(len(v) for v in runs.values())
print(f"{cpu}, {cores} cores; {have('avx512_bf16')}, {have('amx_bf16')}, {have('avx512f')}; "
      f"CPUs {busy}% busy with other work before the runs, load average {load} after")
print(f"Fashion-MNIST 784-256-256-10, SGD with momentum, batch {batch} per rank, {steps} steps; "
      f"samples/s, median of {repeats} interleaved runs")
print(f"ddp-train: {train}" + ("" if has_bf16 == "1" else " (no training.precision: no bf16 runs)")
      + (f"; previous main: {baseline}" if baseline else ""))
print(f"PyTorch {torch.__version__} DDP (gloo, 1 thread per rank): fp32 GEMMs in OpenBLAS, "
      f"{blas_note}; bf16 autocast GEMMs in oneDNN: {onednn}")
print()
cols = ["ddp-train fp32", "ddp-train bf16", "ddp-train bf16 ÷ fp32"]
if baseline:
    cols.append("previous main fp32")
cols += ["PyTorch DDP fp32", "PyTorch DDP autocast bf16", "PyTorch bf16 ÷ fp32"]
print("| ranks | " + " | ".join(cols) + " |")
print("|---:|" + "---:|" * len(cols))
for n in sorted({k[1] for k in runs}):
    row = [cell("ddp_fp32", n), cell("ddp_bf16", n), ratio("ddp_bf16", "ddp_fp32", n)]
    if baseline:
        row.append(cell("baseline_fp32", n))
    row += [cell("torch_fp32", n), cell("torch_bf16", n), ratio("torch_bf16", "torch_fp32", n)]
    print(f"| {n} | " + " | ".join(row) + " |")
EOF
