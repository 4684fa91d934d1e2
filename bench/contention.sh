#!/usr/bin/env bash
# contention.sh: ddp-train's samples/s on the Fashion-MNIST bench config at 1, 2 and 4 ranks while
# 0, 1 and 2 other CPU-bound programs run at normal priority, beside PyTorch DDP (bench/torch_ddp.py,
# gloo) at 2 ranks under the same loads; interleaved repeats, medians; prints one markdown table.
#   bench/contention.sh [--repeats N] [--steps N] [--torch-steps N] [--ranks "1 2 4"]
#                       [--loads "0 1 2"] [--baseline BIN] [--no-torch] [--run-timeout S]
#                       [--torch-coretype T] [--baseline-loads "0 1 2"]
# --baseline runs a second ddp-train binary (e.g. the previous main's) in the same repeats, under
# the loads of --baseline-loads (default: all of --loads).
# The load runs in this script's session, as do the ranks (mpirun with ddp-run's binding, but not
# ddp-run's own session): with autogroup scheduling a session of its own would shield the job
# from the load, which a shared cgroup or a kernel without autogroup does not.
set -euo pipefail

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
repeats=3; steps=1500; torch_steps=1500; ranks_list="1 2 4"; loads_list="0 1 2"
baseline=""; with_torch=1; run_timeout=180; torch_coretype=""; baseline_loads=""
while (($#)); do
  case "$1" in
    --repeats) repeats="${2:?--repeats needs a number}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
    --torch-steps) torch_steps="${2:?--torch-steps needs a number}"; shift 2 ;;
    --ranks) ranks_list="${2:?--ranks needs a list like \"1 2 4\"}"; shift 2 ;;
    --loads) loads_list="${2:?--loads needs a list like \"0 1 2\"}"; shift 2 ;;
    --baseline) baseline="${2:?--baseline needs a ddp-train binary}"; shift 2 ;;
    --baseline-loads) baseline_loads="${2:?--baseline-loads needs a list like \"0\"}"; shift 2 ;;
    --no-torch) with_torch=0; shift ;;
    --run-timeout) run_timeout="${2:?--run-timeout needs seconds}"; shift 2 ;;
    --torch-coretype) torch_coretype="${2:?--torch-coretype needs an OpenBLAS core name}"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "contention.sh: unknown argument $1" >&2; usage ;;
  esac
done
for v in "$repeats" "$steps" "$torch_steps" "$run_timeout" $ranks_list; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "contention.sh: expected a positive integer, got '$v'" >&2; exit 2; }
done
for v in $loads_list; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "contention.sh: --loads takes counts like \"0 1 2\", got '$v'" >&2; exit 2; }
done

train="${DDP_TRAIN:-$root/build/ddp-train}"
python="${TORCH_PYTHON:-/usr/bin/python3}"
config="$here/fashion_mnist_bench.yaml"
[[ -x "$train" ]] || { echo "contention.sh: ddp-train not found at $train (build it, or set DDP_TRAIN)" >&2; exit 2; }
[[ -z "$baseline" || -x "$baseline" ]] || { echo "contention.sh: --baseline $baseline is not an executable" >&2; exit 2; }
if ((with_torch)) && ! "$python" -c "import torch" 2>/dev/null; then
  echo "contention.sh: $python cannot import torch (set TORCH_PYTHON, or --no-torch)" >&2; exit 2
fi
if [[ "$(id -u)" == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# PyTorch's BLAS gets the CPU's widest kernels (Debian's OpenBLAS may not detect newer CPUs).
if [[ -z "$torch_coretype" ]]; then
  if grep -qw avx512f /proc/cpuinfo; then torch_coretype=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then torch_coretype=Haswell
  else torch_coretype="${OPENBLAS_CORETYPE:-}"; fi
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/contention.XXXXXX")"
# shellcheck source=bench/background_load.sh
source "$here/background_load.sh"
trap 'stop_load; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

results="$work/results.txt"  # impl ranks load repeat samples_per_sec|timeout|failed steal%
: > "$results"

# The share of the machine's CPU time its host took away (steal, from /proc/stat) since the
# given reading; on a virtual machine that is what makes one run slower than its neighbours.
cpu_times() { awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
steal_since() {  # "STEAL TOTAL" from cpu_times
  echo "$1 $(cpu_times)" | awk '{d = $4 - $2; printf "%.1f", (d > 0 ? 100 * ($3 - $1) / d : 0)}'
}

# record "IMPL RANKS LOAD REPEAT" RC LOG JSONL STEAL: one line of $results, from a run's exit
# code and the samples_per_sec of the last line of its JSON lines.
record() {
  if (($2 == 124 || $2 == 137)); then
    echo "$1 timeout $5" >> "$results"
  elif (($2 != 0)); then
    echo "contention.sh: $1 (impl ranks load repeat) failed (exit $2):" >&2; tail -5 "$3" >&2
    echo "$1 failed $5" >> "$results"
  else
    echo "$1 $("$python" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["samples_per_sec"])' "$4") $5" >> "$results"
  fi
}

run_ddp() {  # impl binary ranks load repeat
  local out="$work/$1_n$3_l$4_r$5" cmd rc=0 t0
  cmd="$(DDP_TRAIN="$2" "$root/launch/ddp-run" --dry-run -n "$3" "$config" \
    --set "training.max_steps=$steps" --set "output.dir=$out")"
  t0="$(cpu_times)"
  timeout --kill-after=5 "$run_timeout" bash -c "$cmd" > "$out.log" 2>&1 || rc=$?
  record "$1 $3 $4 $5" "$rc" "$out.log" "$out/metrics.jsonl" "$(steal_since "$t0")"
}

run_torch() {  # load repeat
  local out="$work/torch_l$1_r$2" rc=0 t0
  t0="$(cpu_times)"
  OPENBLAS_CORETYPE="$torch_coretype" timeout --kill-after=5 "$run_timeout" \
    "$python" "$here/torch_ddp.py" --world-size 2 --steps "$torch_steps" > "$out.json" 2> "$out.log" || rc=$?
  record "torch 2 $1 $2" "$rc" "$out.log" "$out.json" "$(steal_since "$t0")"
}

# Interleaved: each repeat runs every configuration once, so a drift of the machine's own load
# hits all of them alike. The load starts before and stops after each run.
for ((r = 1; r <= repeats; r++)); do
  for load in $loads_list; do
    for n in $ranks_list; do
      echo "contention.sh: repeat $r/$repeats, load $load, ddp-train at $n rank(s)" >&2
      start_load "$load"; run_ddp ddp "$train" "$n" "$load" "$r"; stop_load
      if [[ -n "$baseline" && " ${baseline_loads:-$loads_list} " == *" $load "* ]]; then
        echo "contention.sh: repeat $r/$repeats, load $load, baseline at $n rank(s)" >&2
        start_load "$load"; run_ddp baseline "$baseline" "$n" "$load" "$r"; stop_load
      fi
    done
    if ((with_torch)); then
      echo "contention.sh: repeat $r/$repeats, load $load, PyTorch DDP at 2 ranks" >&2
      start_load "$load"; run_torch "$load" "$r"; stop_load
    fi
  done
done

"$python" - "$results" "$steps" "$torch_steps" "$run_timeout" "$train" "$baseline" "$torch_coretype" <<'EOF'
import statistics, subprocess, sys
path, steps, torch_steps, run_timeout, train, baseline, coretype = sys.argv[1:8]
runs = {}
steals = []
for line in open(path):
    impl, n, load, _, value, steal = line.split()
    runs.setdefault((impl, int(n), int(load)), []).append(value)
    steals.append(float(steal))
loads = sorted({k[2] for k in runs})

def median(values):
    nums = [float(v) for v in values if v not in ("timeout", "failed")]
    if len(nums) < len(values):
        return None, values
    return statistics.median(nums), values

def cell(impl, n, load):
    if (impl, n, load) not in runs:
        return "—"
    m, values = median(runs[(impl, n, load)])
    if m is None:
        bad = [v for v in values if v in ("timeout", "failed")]
        return f"{len(bad)} of {len(values)} runs {bad[0]}" + (f" (> {run_timeout} s)" if bad[0] == "timeout" else "")
    text = f"{m:,.0f}"
    idle, _ = median(runs.get((impl, n, 0), ["failed"]))
    if load > 0 and idle:
        text += f" ({m / idle:.2f}×)"
    return text

cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p' | head -1"],
                     capture_output=True, text=True).stdout.strip()
cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
with_torch = any(k[0] == "torch" for k in runs)
torch_text = (f", PyTorch DDP gloo {torch_steps} steps with OPENBLAS_CORETYPE="
              f"{coretype or 'as detected'}") if with_torch else ""
print(f"{cpu}, {cores} cores; samples/s, median of {len(next(iter(runs.values())))} interleaved runs "
      f"(× = of the same row's idle run); ddp-train {steps} steps ({train}){torch_text}; "
      f"background load: `sh -c 'while :; do :; done'` at nice 0 in the job's session")
print()
names = {"ddp": "ddp-train", "baseline": f"ddp-train, baseline ({baseline})", "torch": "PyTorch DDP"}
print("| | ranks | " + " | ".join(f"{l} busy" for l in loads) + " |")
print("|---|---:|" + "---:|" * len(loads))
for impl in ("ddp", "baseline", "torch"):
    for n in sorted({k[1] for k in runs if k[0] == impl}):
        print(f"| {names[impl]} | {n} | " + " | ".join(cell(impl, n, l) for l in loads) + " |")
if any(k[0] == "torch" for k in runs):
    row = []
    for l in loads:
        a, _ = median(runs.get(("ddp", 2, l), ["failed"]))
        b, _ = median(runs.get(("torch", 2, l), ["failed"]))
        row.append(f"{a / b:.2f}×" if a and b else "—")
    print("| ddp-train ÷ PyTorch | 2 | " + " | ".join(row) + " |")
print()
print(f"CPU time taken by the host (steal) during the runs: median {statistics.median(steals):.1f}%, "
      f"max {max(steals):.1f}% (a run with much steal is slower for reasons outside the job)")
EOF
