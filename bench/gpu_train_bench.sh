#!/usr/bin/env bash
# gpu_train_bench.sh: training throughput on one GPU, ddp-train against PyTorch (DDP and plain)
# on the same model, batch, optimizer and fp32 arithmetic, on synthetic data; prints a markdown
# table and writes it with a CSV. bench/gpu_check.sh runs it on the GPU machine.
#
# usage: bench/gpu_train_bench.sh [--out DIR] [--cases "small64 small1024 wide1024"]
#                                 [--backends "nccl mpi"] [--only ddp|torch] [--samples N]
#   --out DIR     train_bench.md, train_bench.csv and raw/ (every run's log, config, metrics)
#                 go there (default runs/gpu-train-bench)
#   --cases       which of: small64 (784-256-256-10, batch 64), small1024 (the same, batch 1024),
#                 wide1024 (784-4096-4096-10, batch 1024)
#   --backends    ddp-train's distributed.backend values to run: nccl, mpi (staged through host
#                 memory); on 1 rank both only show what the backend costs without peers
#   --samples N   synthetic training samples (default 60000, Fashion-MNIST's count)
# Environment:
#   DDP_TRAIN        ddp-train (default: the packed runtime in $DDP_DEPS or ./.gpu-deps, with its
#                    Open MPI; else build/ddp-train and the system's mpirun)
#   DDP_MPIRUN       mpirun (default mpirun on PATH)
#   TORCH_PYTHON     python with torch (default: the first of python3, /opt/torch/.venv/bin/python3,
#                    /usr/bin/python3 that imports torch)
#   DDP_BENCH_DEVICE cuda (default) or cpu: a functional run on the CPU with a handful of steps
#   DDP_BENCH_BIND   1: bind ddp-train's rank and the PyTorch process to a core (default unbound)
#   DDP_BENCH_RUN_TIMEOUT_S  seconds per run (default 90)
# Method: both sides run W untimed warm-up steps, then N timed steps, on 1 rank, with SGD lr 0.01
# momentum 0.9 in fp32 (PyTorch with TF32 off), synthetic data (--samples per epoch, the last
# partial batch dropped). ddp-train runs with training.log_every = W and max_steps = W + N: its
# rate is the samples of the progress records after the first in metrics.jsonl over the time
# between the first and the last record, i.e. exactly the N timed steps (start-up, CUDA context
# and the warm-up are outside). PyTorch (bench/torch_ddp.py --synthetic) times its loop between
# torch.cuda.synchronize() calls; its data is made and indexed on the GPU, while ddp-train's
# loader assembles batches on the host and uploads them inside the timed steps.
# Exit status: 0 every run done, 1 a run failed, 2 bad usage or setup, 77 no GPU (cuda).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
die() {
  echo "gpu_train_bench.sh: $*" >&2
  exit 2
}
usage() {
  sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

OUTDIR=$REPO/runs/gpu-train-bench
CASES="small64 small1024 wide1024"
BACKENDS="nccl mpi"
ONLY=""
SAMPLES=60000
while (($#)); do
  case $1 in
    --out) OUTDIR=${2:?--out needs a folder}; shift 2 ;;
    --cases) CASES=${2:?--cases needs a list}; shift 2 ;;
    --backends) BACKENDS=${2:?--backends needs a list}; shift 2 ;;
    --only) ONLY=${2:?--only needs ddp or torch}; shift 2 ;;
    --samples) SAMPLES=${2:?--samples needs a number}; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "gpu_train_bench.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
DEVICE=${DDP_BENCH_DEVICE:-cuda}
RUN_TIMEOUT=${DDP_BENCH_RUN_TIMEOUT_S:-90}
[[ $DEVICE == cuda || $DEVICE == cpu ]] || die "DDP_BENCH_DEVICE must be cuda or cpu (got '$DEVICE')"
[[ -z $ONLY || $ONLY == ddp || $ONLY == torch ]] || die "--only takes ddp or torch (got '$ONLY')"
[[ $SAMPLES =~ ^[1-9][0-9]*$ ]] || die "--samples must be a positive integer (got '$SAMPLES')"
[[ $RUN_TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "DDP_BENCH_RUN_TIMEOUT_S must be a positive integer"
for b in $BACKENDS; do
  [[ $b == nccl || $b == mpi ]] || die "--backends takes nccl and/or mpi (got '$b')"
done
# NCCL moves GPU memory: on the CPU only the mpi backend exists.
[[ $DEVICE == cpu ]] && BACKENDS=mpi

# case -> "layers batch warmup steps". Warm-up steps are untimed; the timed steps run for
# roughly a second or more on an H200 (PyTorch's small-model steps are host-bound: ~0.3 ms).
declare -A CASE_SPEC=(
  [small64]="784,256,256,10 64 250 5000"
  [small1024]="784,256,256,10 1024 100 2000"
  [wide1024]="784,4096,4096,10 1024 25 500"
)
declare -A CASE_CPU_STEPS=([small64]="3 12" [small1024]="2 4" [wide1024]="1 2")
for c in $CASES; do
  [[ -n ${CASE_SPEC[$c]:-} ]] || die "unknown case '$c' (known: ${!CASE_SPEC[*]})"
done

if [[ $DEVICE == cuda ]]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "skipped: no GPU (nvidia-smi lists none); DDP_BENCH_DEVICE=cpu runs it on the CPU"
    exit 77
  fi
fi

# ddp-train and its mpirun: as given, else the packed runtime, else the build tree.
if [[ -z ${DDP_TRAIN:-} ]]; then
  DEPS=${DDP_DEPS:-$REPO/.gpu-deps}
  if [[ -n ${DDP_KIT_ACTIVE:-} ]]; then
    DDP_TRAIN=$DDP_KIT_ACTIVE/bin/ddp-train
  elif [[ -f $DEPS/runtime/KIT ]]; then
    # shellcheck source=bench/pack_runtime.sh
    source "$HERE/pack_runtime.sh"
    ddp_kit_env "$DEPS/runtime" || die "cannot use the packed runtime in $DEPS/runtime"
    trap 'rm -rf "$DDP_KIT_LINKS"' EXIT
    DDP_TRAIN=$DEPS/runtime/bin/ddp-train
  else
    DDP_TRAIN=$REPO/build/ddp-train
  fi
fi
[[ $ONLY == torch || -x $DDP_TRAIN ]] || die "ddp-train not found at $DDP_TRAIN (set DDP_TRAIN)"
MPIRUN=${DDP_MPIRUN:-mpirun}
[[ $ONLY == torch ]] || command -v "$MPIRUN" >/dev/null 2>&1 || die "$MPIRUN not found (set DDP_MPIRUN)"
if [[ $(id -u) == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

PY=${TORCH_PYTHON:-}
if [[ -z $PY ]]; then
  for p in python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1; then
      PY=$p
      break
    fi
  done
fi
if [[ -z $PY ]]; then
  [[ $ONLY == ddp ]] || die "no python with torch found (set TORCH_PYTHON)"
  PY=$(command -v python3) || die "python3 is needed to read ddp-train's metrics"
fi

RAW=$OUTDIR/raw
mkdir -p "$RAW" || die "cannot create $RAW"
RESULTS=$RAW/results.jsonl
: >"$RESULTS"
FAILED=0
BIND=${DDP_BENCH_BIND:-0}

# run_ddp CASE BACKEND LAYERS BATCH WARMUP STEPS: one ddp-train run on 1 rank; appends its
# steady-state rate (the progress records after the first, so the warm-up steps are excluded)
# to RESULTS.
run_ddp() {
  local c=$1 backend=$2 layers=$3 batch=$4 warmup=$5 steps=$6
  local name=ddp_${c}_$backend dir=$RAW/ddp_${c}_$backend
  mkdir -p "$dir"
  cat >"$dir/config.yaml" <<EOF
# gpu_train_bench.sh: $c, ddp-train, distributed.backend $backend
device: $DEVICE
model:
  layers: [$layers]
  activation: relu
data:
  format: synthetic
  train:
    samples: $SAMPLES
  seed: 0
  shuffle: true
  drop_last: true
optimizer:
  name: sgd
  lr: 0.01
  momentum: 0.9
training:
  epochs: 1000000
  batch_size: $batch
  seed: 0
  log_every: $warmup
  max_steps: $((warmup + steps))
distributed:
  backend: $backend
output:
  dir: $dir/out
  save_model: false
EOF
  local bind=(--bind-to none)
  ((BIND)) && bind=(--bind-to core)
  echo "gpu_train_bench.sh: $c: ddp-train ($backend), $warmup + $steps steps" >&2
  local rc=0
  timeout --kill-after=10 "$RUN_TIMEOUT" "$MPIRUN" -n 1 "${bind[@]}" "$DDP_TRAIN" \
    --config "$dir/config.yaml" >"$dir/log.txt" 2>&1 || rc=$?
  if ((rc != 0)); then
    echo "gpu_train_bench.sh: $name failed (exit $rc); the end of its log:" >&2
    tail -n 15 "$dir/log.txt" >&2
    FAILED=1
    echo "{\"case\": \"$c\", \"impl\": \"ddp-$backend\", \"failed\": true, \"warmup\": $warmup, \"steps\": $steps}" >>"$RESULTS"
    return
  fi
  "$PY" - "$dir/out/metrics.jsonl" "$c" "ddp-$backend" "$warmup" "$steps" >>"$RESULTS" <<'EOF' ||
import json, sys
path, case, impl, warmup, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
recs = [json.loads(line) for line in open(path) if line.strip()]
train = [r for r in recs if r.get("type") == "train"]
summary = [r for r in recs if r.get("type") == "summary"][-1]
if len(train) < 2 or train[0]["global_step"] != warmup or train[-1]["global_step"] != warmup + steps:
    sys.exit(f"{path}: expected progress records at steps {warmup} and {warmup + steps}, "
             f"got {[r['global_step'] for r in train]}")
samples = sum(r["samples"] for r in train[1:])
seconds = train[-1]["time"] - train[0]["time"]
print(json.dumps({"case": case, "impl": impl, "steps": steps, "warmup": warmup,
                  "samples": samples, "seconds": seconds, "samples_per_sec": samples / seconds,
                  "whole_run_samples_per_sec": summary["samples_per_sec"],
                  "data_wait_seconds": summary.get("data_wait_seconds"),
                  "allreduce_seconds": summary.get("allreduce_seconds"),
                  "final_loss": train[-1]["loss"], "device": summary.get("device")}))
EOF
    {
      FAILED=1
      echo "{\"case\": \"$c\", \"impl\": \"ddp-$backend\", \"failed\": true, \"warmup\": $warmup, \"steps\": $steps}" >>"$RESULTS"
    }
}

# run_torch CASE PLAIN LAYERS BATCH WARMUP STEPS: bench/torch_ddp.py, the same work.
run_torch() {
  local c=$1 plain=$2 layers=$3 batch=$4 warmup=$5 steps=$6
  local impl=torch
  local args=(--device "$DEVICE" --synthetic "$SAMPLES" --layers "$layers" --batch-size "$batch"
    --lr 0.01 --momentum 0.9 --warmup "$warmup" --steps "$steps")
  ((plain)) && impl=torch-plain && args+=(--plain)
  ((BIND)) || args+=(--no-bind)
  local dir=$RAW/${impl}_$c
  mkdir -p "$dir"
  echo "gpu_train_bench.sh: $c: $impl, $warmup + $steps steps" >&2
  local rc=0
  timeout --kill-after=10 "$RUN_TIMEOUT" "$PY" "$HERE/torch_ddp.py" "${args[@]}" \
    >"$dir/result.json" 2>"$dir/log.txt" || rc=$?
  if ((rc != 0)); then
    echo "gpu_train_bench.sh: $impl $c failed (exit $rc); the end of its log:" >&2
    tail -n 15 "$dir/log.txt" >&2
    FAILED=1
    echo "{\"case\": \"$c\", \"impl\": \"$impl\", \"failed\": true, \"warmup\": $warmup, \"steps\": $steps}" >>"$RESULTS"
    return
  fi
  "$PY" -c 'import json, sys; d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); d["case"] = sys.argv[2]; print(json.dumps(d))' \
    "$dir/result.json" "$c" >>"$RESULTS" || {
    FAILED=1
    echo "{\"case\": \"$c\", \"impl\": \"$impl\", \"failed\": true, \"warmup\": $warmup, \"steps\": $steps}" >>"$RESULTS"
  }
}

# report SHOW: the table and CSV from what has run so far (rewritten after every case, so a
# run cut short by a time limit leaves its finished cases); SHOW=1 prints the table too.
report() {
  {
    echo "device=$DEVICE"
    echo "gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
    echo "cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores"
    echo "ddp_train=$DDP_TRAIN"
    echo "kit=$( [[ -n ${DDP_KIT_ACTIVE:-} ]] && sed -n '2p' "$DDP_KIT_ACTIVE/KIT")"
    echo "nccl=${DDP_KIT_NCCL:-}"
    echo "samples=$SAMPLES"
    echo "bind=$BIND"
    echo "seconds=$((SECONDS - START))"
  } >"$RAW/machine.txt"
  "$PY" - "$RESULTS" "$RAW/machine.txt" "$OUTDIR/train_bench.md" "$OUTDIR/train_bench.csv" "$1" <<'EOF' || FAILED=1
import csv, json, sys
results, machine_path, md_path, csv_path, show = sys.argv[1:6]
runs = [json.loads(l) for l in open(results) if l.strip()]
machine = dict(l.rstrip("\n").split("=", 1) for l in open(machine_path) if "=" in l)
spec = {"small64": ("784-256-256-10", 64), "small1024": ("784-256-256-10", 1024),
        "wide1024": ("784-4096-4096-10", 1024)}
by = {(r["case"], r["impl"]): r for r in runs}
cases = list(dict.fromkeys(r["case"] for r in runs))

def rate(case, impl):
    r = by.get((case, impl))
    if r is None:
        return None, "-"
    if r.get("failed"):
        return None, "failed"
    return r["samples_per_sec"], f"{r['samples_per_sec']:,.0f}"

def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"

torch_run = next((r for r in runs if r["impl"].startswith("torch") and not r.get("failed")), {})
ddp_run = next((r for r in runs if r["impl"].startswith("ddp") and not r.get("failed")), {})
dev = machine.get("device", "?")
head = [f"#### Training throughput on one {'GPU' if dev == 'cuda' else 'CPU (functional run only)'}: ddp-train vs PyTorch, fp32, synthetic data",
        "",
        f"- machine: {machine.get('gpu') or 'no GPU'}; CPU {machine.get('cpu', '?')}",
        f"- ddp-train: {machine.get('ddp_train', '?')}"
        + (f" (packed runtime: {machine['kit']})" if machine.get("kit") else "")
        + (f"; NCCL {machine['nccl']}" if machine.get("nccl") else "")
        + f"; device {ddp_run.get('device', dev)}; 1 rank under mpirun, "
        + ("bound to a core" if machine.get("bind") == "1" else "not bound to a core"),
        ]
if torch_run:
    extra = ""
    if torch_run.get("device") == "cuda":
        extra = (f", CUDA {torch_run.get('cuda')}, NCCL {torch_run.get('nccl')}, "
                 f"TF32 off ({torch_run.get('tf32')}), {torch_run.get('gpu')}")
    head.append(f"- PyTorch {torch_run.get('torch')}{extra}; DDP: backend "
                f"{'nccl' if torch_run.get('device') == 'cuda' else 'gloo'}, world size 1, "
                f"bucket_cap_mb {torch_run.get('bucket_cap_mb')}; plain: the same model without the DDP wrapper")
head += [
    f"- same work on both sides: the model, per-rank batch, SGD lr 0.01 momentum 0.9, fp32, "
    f"{machine.get('samples', '?')} synthetic samples per epoch (remainder dropped), "
    "the same warm-up and timed step counts; buckets 25 MiB (first 1 MiB) on both sides",
    ("- data: **PyTorch's random samples are made on the GPU and batches gathered there (no "
     "data loading, no host-to-device copies)**; ddp-train generates them on the host and its "
     "loader thread assembles each batch, which is uploaded (double-buffered, pinned memory) "
     "inside the timed steps" if dev == "cuda" else
     "- data: random samples in memory on both sides; ddp-train's loader thread assembles each "
     "batch, PyTorch indexes its tensors"),
    "- timing: warm-up steps untimed. ddp-train: training.log_every = warm-up steps; the rate is "
    "the samples of the progress records after the first over the time between the first and the "
    "last record (metrics.jsonl), i.e. exactly the timed steps. PyTorch: the timed loop between "
    + ("torch.cuda.synchronize() calls" if dev == "cuda" else "barriers"),
    "- ratios: ddp-train with the nccl backend (mpi where nccl did not run) over PyTorch; "
    "data wait: the seconds ddp-train's training loop waited for its loader",
    "",
    "| model | batch | warm-up + timed steps | ddp-train nccl samples/s | ddp-train mpi (staged) samples/s "
    "| torch DDP samples/s | torch plain samples/s | ddp / torch DDP | ddp / torch plain "
    "| ddp data wait s |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]
rows = []
for c in cases:
    model, batch = spec.get(c, (c, "?"))
    ref = next((r for (cc, _), r in by.items() if cc == c and not r.get("failed")),
               next((r for (cc, _), r in by.items() if cc == c), {}))
    nccl, nccl_s = rate(c, "ddp-nccl")
    mpi, mpi_s = rate(c, "ddp-mpi")
    tddp, tddp_s = rate(c, "torch")
    tplain, tplain_s = rate(c, "torch-plain")
    ours = nccl or mpi  # on the CPU only the mpi backend runs
    wait = next((by[(c, i)].get("data_wait_seconds") for i in ("ddp-nccl", "ddp-mpi")
                 if (c, i) in by and not by[(c, i)].get("failed")), None)
    steps = f"{ref.get('warmup', '?')} + {ref.get('steps', '?')}"
    row = [model, batch, steps, nccl_s, mpi_s, tddp_s, tplain_s, ratio(ours, tddp), ratio(ours, tplain),
           "-" if wait is None else f"{wait:.3f}"]
    rows.append(row)
    head.append("| " + " | ".join(str(x) for x in row) + " |")
if dev == "cpu":
    head.append("")
    head.append("(CPU run: a check that the benchmark works, with a handful of steps; not a measurement.)")
text = "\n".join(head) + "\n"
open(md_path, "w").write(text)
if show == "1":
    print(text)
with open(csv_path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["model", "batch", "steps", "ddp_nccl_samples_per_sec", "ddp_mpi_samples_per_sec",
                "torch_ddp_samples_per_sec", "torch_plain_samples_per_sec", "ddp_vs_torch_ddp",
                "ddp_vs_torch_plain", "ddp_data_wait_seconds"])
    for c, row in zip(cases, rows):
        raw = [rate(c, i)[0] for i in ("ddp-nccl", "ddp-mpi", "torch", "torch-plain")]
        ours = raw[0] or raw[1]
        w.writerow(row[:3] + ["" if v is None else f"{v:.1f}" for v in raw]
                   + [f"{ours / raw[2]:.4f}" if ours and raw[2] else "",
                      f"{ours / raw[3]:.4f}" if ours and raw[3] else "", row[9] if row[9] != "-" else ""])
EOF
}

START=$SECONDS
for c in $CASES; do
  read -r layers batch warmup steps <<<"${CASE_SPEC[$c]}"
  [[ $DEVICE == cpu ]] && read -r warmup steps <<<"${CASE_CPU_STEPS[$c]}"
  if [[ $ONLY != torch ]]; then
    for b in $BACKENDS; do run_ddp "$c" "$b" "$layers" "$batch" "$warmup" "$steps"; done
  fi
  if [[ $ONLY != ddp ]]; then
    run_torch "$c" 0 "$layers" "$batch" "$warmup" "$steps"
    run_torch "$c" 1 "$layers" "$batch" "$warmup" "$steps"
  fi
  report 0
done
report 1

echo "gpu_train_bench.sh: $((SECONDS - START)) s; $OUTDIR/train_bench.md, train_bench.csv, raw/" >&2
exit $((FAILED ? 1 : 0))
