#!/usr/bin/env bash
# gpu_train_bench.sh: training throughput on one GPU, ddp-train against PyTorch (DDP and plain)
# on the same model, batch and optimizer, on synthetic data, in fp32 and in bf16 / fp16 (ddp-train's
# training.precision against torch.autocast); prints a markdown table and writes it with a CSV.
# bench/gpu_check.sh runs it on the GPU machine.
#
# usage: bench/gpu_train_bench.sh [--out DIR] [--cases "small64 small1024 wide1024"]
#                                 [--backends "nccl eager mpi"] [--only ddp|torch] [--samples N]
#                                 [--precisions "fp32 bf16 fp16"]
#                                 [--precision-cases "small1024 wide1024"]
#   --out DIR     train_bench.md, train_bench.csv and raw/ (every run's log, config, metrics)
#                 go there (default runs/gpu-train-bench)
#   --cases       which of: small64 (784-256-256-10, batch 64), small1024 (the same, batch 1024),
#                 wide1024 (784-4096-4096-10, batch 1024)
#   --backends    ddp-train's gradient paths to run (default "nccl eager"): nccl (steps replayed
#                 as CUDA graphs, training.cuda_graphs true), eager (nccl with every kernel
#                 launched, cuda_graphs false), mpi (staged through host memory); on 1 rank they
#                 only show what the path costs without peers
#   --samples N   synthetic training samples (default 60000, Fashion-MNIST's count)
#   --precisions  which of fp32, bf16, fp16 to run (default all three; on the CPU fp16 is left
#                 out with a note, as ddp-train refuses it there). fp32 runs every case with every
#                 backend and PyTorch DDP and plain; bf16 and fp16 run ddp-train with
#                 --set training.precision=P on the nccl backend only (mpi on the CPU) and
#                 PyTorch DDP with --autocast P (fp16 with a GradScaler), on --precision-cases
#   --precision-cases  the cases that get the bf16 / fp16 rows (default "small1024 wide1024",
#                 where the GEMMs matter; small64 is bound by per-step overheads). Chosen to fit
#                 gpu_check.sh's 150-240 s for this bench: 12 fp32 runs and 8 more, each
#                 expected to take a few seconds of start-up and about a second of timed steps
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
# momentum 0.9 in fp32 (PyTorch with TF32 off) or with the row's 16-bit GEMMs, synthetic data
# (--samples per epoch, the last partial batch dropped). ddp-train runs with
# training.log_every = W and max_steps = W + N: its rate is the N timed steps' samples over the
# time between the progress records of steps W and W + N in metrics.jsonl (start-up, CUDA
# context and the warm-up are outside). PyTorch
# (bench/torch_ddp.py --synthetic) times its loop between torch.cuda.synchronize() calls; its
# data is made and indexed on the GPU, while ddp-train's loader assembles batches on the host
# and uploads them inside the timed steps. The table's "÷ fp32" columns are each side's own
# rate in bf16 / fp16 over its rate in fp32 on the same case.
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
BACKENDS="nccl eager"
ONLY=""
SAMPLES=60000
PRECISIONS="fp32 bf16 fp16"
PREC_CASES="small1024 wide1024"
while (($#)); do
  case $1 in
    --out) OUTDIR=${2:?--out needs a folder}; shift 2 ;;
    --cases) CASES=${2:?--cases needs a list}; shift 2 ;;
    --backends) BACKENDS=${2:?--backends needs a list}; shift 2 ;;
    --only) ONLY=${2:?--only needs ddp or torch}; shift 2 ;;
    --samples) SAMPLES=${2:?--samples needs a number}; shift 2 ;;
    --precisions) PRECISIONS=${2:?--precisions needs a list}; shift 2 ;;
    --precision-cases) PREC_CASES=${2:?--precision-cases needs a list}; shift 2 ;;
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
  [[ $b == nccl || $b == eager || $b == mpi ]] ||
    die "--backends takes nccl, eager and/or mpi (got '$b')"
done
[[ -n ${PRECISIONS// /} ]] || die "--precisions needs at least one of fp32 bf16 fp16"
for p in $PRECISIONS; do
  [[ $p == fp32 || $p == bf16 || $p == fp16 ]] || die "--precisions takes fp32, bf16 and/or fp16 (got '$p')"
done
# NCCL moves GPU memory: on the CPU only the mpi backend exists.
[[ $DEVICE == cpu ]] && BACKENDS=mpi
# The bf16 / fp16 rows run on one backend: nccl, the one that keeps the gradients on the GPU.
PREC_BACKEND=mpi
[[ " $BACKENDS " == *" nccl "* ]] && PREC_BACKEND=nccl
PREC_NOTE=""
if [[ $DEVICE == cpu && " $PRECISIONS " == *" fp16 "* ]]; then
  PRECISIONS=$(for p in $PRECISIONS; do [[ $p == fp16 ]] || echo "$p"; done | xargs)
  PREC_NOTE="fp16 not run: ddp-train refuses training.precision fp16 on CPUs (a GPU precision)"
  echo "gpu_train_bench.sh: $PREC_NOTE" >&2
  [[ -n $PRECISIONS ]] || die "--precisions: only fp16 was asked for, which the CPU refuses"
fi

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
for c in $PREC_CASES; do
  [[ -n ${CASE_SPEC[$c]:-} ]] || die "--precision-cases: unknown case '$c' (known: ${!CASE_SPEC[*]})"
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

# failed CASE IMPL PREC WARMUP STEPS: the record of a run that gave no rate.
failed() {
  FAILED=1
  echo "{\"case\": \"$1\", \"impl\": \"$2\", \"precision\": \"$3\", \"failed\": true, \"warmup\": $4, \"steps\": $5}" >>"$RESULTS"
}

# run_ddp CASE BACKEND PREC LAYERS BATCH WARMUP STEPS: one ddp-train run on 1 rank; appends its
# steady-state rate (the progress records after the first, so the warm-up steps are excluded)
# to RESULTS.
run_ddp() {
  local c=$1 backend=$2 prec=$3 layers=$4 batch=$5 warmup=$6 steps=$7
  local name=ddp_${c}_${backend}_$prec dir=$RAW/ddp_${c}_${backend}_$prec
  local sets=() dist=$backend
  # fp32 runs without the key, exactly the configuration of the fp32 rows before it existed.
  [[ $prec == fp32 ]] || sets=(--set "training.precision=$prec")
  if [[ $backend == eager ]]; then
    dist=nccl
    sets+=(--set training.cuda_graphs=false)
  fi
  mkdir -p "$dir"
  cat >"$dir/config.yaml" <<EOF
# gpu_train_bench.sh: $c, ddp-train, distributed.backend $backend, training.precision $prec
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
  backend: $dist
output:
  dir: $dir/out
  save_model: false
EOF
  local bind=(--bind-to none)
  ((BIND)) && bind=(--bind-to core)
  echo "gpu_train_bench.sh: $c: ddp-train ($backend, $prec), $warmup + $steps steps" >&2
  local rc=0
  timeout --kill-after=10 "$RUN_TIMEOUT" "$MPIRUN" -n 1 "${bind[@]}" "$DDP_TRAIN" \
    --config "$dir/config.yaml" "${sets[@]}" >"$dir/log.txt" 2>&1 || rc=$?
  if ((rc != 0)); then
    echo "gpu_train_bench.sh: $name failed (exit $rc); the end of its log:" >&2
    tail -n 15 "$dir/log.txt" >&2
    failed "$c" "ddp-$backend" "$prec" "$warmup" "$steps"
    return
  fi
  "$PY" - "$dir/out/metrics.jsonl" "$c" "ddp-$backend" "$prec" "$warmup" "$steps" >>"$RESULTS" <<'EOF' ||
import json, sys
path, case, impl, prec = sys.argv[1:5]
warmup, steps = int(sys.argv[5]), int(sys.argv[6])
recs = [json.loads(line) for line in open(path) if line.strip()]
train = [r for r in recs if r.get("type") == "train"]
summary = [r for r in recs if r.get("type") == "summary"][-1]
if len(train) < 2 or train[0]["global_step"] != warmup or train[-1]["global_step"] != warmup + steps:
    sys.exit(f"{path}: expected progress records at steps {warmup} and {warmup + steps}, "
             f"got {[r['global_step'] for r in train]}")
# A progress record's "samples" counts from the later of the previous record and the epoch's
# start, so summing them drops the steps between an epoch's last record and its end: the rate
# is the timed steps' samples (every step has the same, drop_last) over their time.
per_step = summary["samples"] / summary["steps"]
samples = per_step * (train[-1]["global_step"] - train[0]["global_step"])
seconds = train[-1]["time"] - train[0]["time"]
print(json.dumps({"case": case, "impl": impl, "precision": prec, "steps": steps, "warmup": warmup,
                  "samples": samples, "seconds": seconds, "samples_per_sec": samples / seconds,
                  "whole_run_samples_per_sec": summary["samples_per_sec"],
                  "data_wait_seconds": summary.get("data_wait_seconds"),
                  "allreduce_seconds": summary.get("allreduce_seconds"),
                  "final_loss": train[-1]["loss"], "device": summary.get("device"),
                  "loss_scale": train[-1].get("loss_scale"),
                  "scaler_skipped_steps": summary.get("scaler_skipped_steps"),
                  "graph_steps": summary.get("graph_steps")}))
EOF
    failed "$c" "ddp-$backend" "$prec" "$warmup" "$steps"
}

# run_torch CASE PLAIN PREC LAYERS BATCH WARMUP STEPS: bench/torch_ddp.py, the same work; PREC
# bf16 / fp16 runs forward and loss under torch.autocast (--autocast).
run_torch() {
  local c=$1 plain=$2 prec=$3 layers=$4 batch=$5 warmup=$6 steps=$7
  local impl=torch autocast=$3
  [[ $prec == fp32 ]] && autocast=off
  local args=(--device "$DEVICE" --synthetic "$SAMPLES" --layers "$layers" --batch-size "$batch"
    --lr 0.01 --momentum 0.9 --warmup "$warmup" --steps "$steps" --autocast "$autocast")
  ((plain)) && impl=torch-plain && args+=(--plain)
  ((BIND)) || args+=(--no-bind)
  local dir=$RAW/${impl}_${c}_$prec
  mkdir -p "$dir"
  echo "gpu_train_bench.sh: $c: $impl ($prec), $warmup + $steps steps" >&2
  local rc=0
  timeout --kill-after=10 "$RUN_TIMEOUT" "$PY" "$HERE/torch_ddp.py" "${args[@]}" \
    >"$dir/result.json" 2>"$dir/log.txt" || rc=$?
  if ((rc != 0)); then
    echo "gpu_train_bench.sh: $impl $c $prec failed (exit $rc); the end of its log:" >&2
    tail -n 15 "$dir/log.txt" >&2
    failed "$c" "$impl" "$prec" "$warmup" "$steps"
    return
  fi
  # torch_ddp.py's own "precision" (its words, e.g. "bf16 autocast") becomes torch_precision.
  "$PY" -c 'import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
d["torch_precision"] = d.get("precision")
d.update(case=sys.argv[2], precision=sys.argv[3])
print(json.dumps(d))' "$dir/result.json" "$c" "$prec" >>"$RESULTS" ||
    failed "$c" "$impl" "$prec" "$warmup" "$steps"
}

# report SHOW: the table and CSV from what has run so far (rewritten after every row, so a
# run cut short by a time limit leaves its finished rows); SHOW=1 prints the table too.
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
    echo "precisions=$PRECISIONS"
    echo "precision_cases=$PREC_CASES"
    echo "precision_backend=$PREC_BACKEND"
    echo "precision_note=$PREC_NOTE"
  } >"$RAW/machine.txt"
  "$PY" - "$RESULTS" "$RAW/machine.txt" "$OUTDIR/train_bench.md" "$OUTDIR/train_bench.csv" "$1" <<'EOF' || FAILED=1
import csv, json, sys
results, machine_path, md_path, csv_path, show = sys.argv[1:6]
runs = [json.loads(l) for l in open(results) if l.strip()]
machine = dict(l.rstrip("\n").split("=", 1) for l in open(machine_path) if "=" in l)
spec = {"small64": ("784-256-256-10", 64), "small1024": ("784-256-256-10", 1024),
        "wide1024": ("784-4096-4096-10", 1024)}
by = {(r["case"], r.get("precision", "fp32"), r["impl"]): r for r in runs}
rows_run = list(dict.fromkeys((r["case"], r.get("precision", "fp32")) for r in runs))
precisions = list(dict.fromkeys(p for _, p in rows_run))
dev = machine.get("device", "?")

def rate(case, prec, impl):
    r = by.get((case, prec, impl))
    if r is None:
        return None, "-"
    if r.get("failed"):
        return None, "failed"
    return r["samples_per_sec"], f"{r['samples_per_sec']:,.0f}"

def ours(case, prec):
    """ddp-train's rate in a row and the backend it came from: nccl, else mpi (on the CPU only
    mpi runs)."""
    for impl in ("ddp-nccl", "ddp-mpi"):
        value = rate(case, prec, impl)[0]
        if value:
            return value, impl
    return None, None

def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"

def gains(case, prec):
    """Each side's rate in this row over its own rate in fp32 (same case, same backend)."""
    if prec == "fp32":
        return None, None
    value, impl = ours(case, prec)
    ddp = value / rate(case, "fp32", impl)[0] if impl and rate(case, "fp32", impl)[0] else None
    t, t32 = rate(case, prec, "torch")[0], rate(case, "fp32", "torch")[0]
    return ddp, (t / t32 if t and t32 else None)

def header():
    torch_run = next((r for r in runs if r["impl"].startswith("torch") and not r.get("failed")), {})
    ddp_run = next((r for r in runs if r["impl"].startswith("ddp") and not r.get("failed")), {})
    where = "GPU" if dev == "cuda" else "CPU (functional run only)"
    head = [f"#### Training throughput on one {where}: ddp-train vs PyTorch, "
            f"{', '.join(precisions) or 'fp32'}, synthetic data",
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
        f"- same work on both sides: the model, per-rank batch, SGD lr 0.01 momentum 0.9, the row's "
        f"precision, {machine.get('samples', '?')} synthetic samples per epoch (remainder dropped), "
        "the same warm-up and timed step counts; buckets 25 MiB (first 1 MiB) on both sides",
        ("- data: **PyTorch's random samples are made on the GPU and batches gathered there (no "
         "data loading, no host-to-device copies)**; ddp-train generates them on the host and its "
         "loader threads (data.workers) assemble each batch, which is uploaded (double-buffered, pinned memory) "
         "inside the timed steps" if dev == "cuda" else
         "- data: random samples in memory on both sides; ddp-train's loader thread assembles each "
         "batch, PyTorch indexes its tensors"),
        "- timing: warm-up steps untimed. ddp-train: training.log_every = warm-up steps; the rate is "
        "the timed steps' samples over the time between the progress records at the end of the warm-up "
        "and at the last step (metrics.jsonl). PyTorch: the timed loop between "
        + ("torch.cuda.synchronize() calls" if dev == "cuda" else "barriers"),
    ]
    head += precision_lines()
    head += [
        "- ddp-train nccl: steps replayed as CUDA graphs (training.cuda_graphs, the default; the "
        "logged steps run eagerly); nccl eager: the same with cuda_graphs false, every kernel "
        "launched from the host",
        "- ratios: ddp-train with the nccl backend (mpi where nccl did not run) over PyTorch; "
        "÷ fp32: each side's rate over its own fp32 rate on the same model and batch (ddp-train "
        "on the same backend, PyTorch DDP); data wait: the seconds ddp-train's training loop "
        "waited for its loader",
        "",
        "| model | batch | precision | warm-up + timed steps | ddp-train nccl samples/s "
        "| ddp-train nccl eager samples/s | ddp-train mpi (staged) samples/s | torch DDP samples/s | torch plain samples/s "
        "| ddp / torch DDP | ddp / torch plain | ddp ÷ fp32 | torch DDP ÷ fp32 | ddp data wait s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return head

def precision_lines():
    """What the bf16 / fp16 rows are, when any ran or was left out."""
    lines = []
    if any(p != "fp32" for p in precisions):
        gemms = ("WMMA tensor-core GEMMs" if dev == "cuda" else "oneDNN bf16 GEMMs")
        lines.append(
            "- precision: fp32 as above; bf16 / fp16: ddp-train with training.precision bf16 / fp16 "
            f"({gemms}, float32 accumulation and master weights; fp16 with dynamic loss scaling, "
            "loss_scaling auto) against PyTorch DDP with forward and loss under "
            "torch.autocast(dtype=bfloat16 / float16) (fp16 with a GradScaler with its defaults: "
            "the same initial scale 2^16 and growth interval 2000 as ddp-train's); these rows run "
            f"ddp-train on the {machine.get('precision_backend', '?')} backend and PyTorch DDP only, "
            f"on {machine.get('precision_cases', '?')}")
    if machine.get("precision_note"):
        lines.append(f"- {machine['precision_note']}")
    return lines

def row(c, prec):
    model, batch = spec.get(c, (c, "?"))
    group = [r for (cc, p, _), r in by.items() if cc == c and p == prec]
    ref = next((r for r in group if not r.get("failed")), group[0] if group else {})
    texts = [rate(c, prec, i)[1]
             for i in ("ddp-nccl", "ddp-eager", "ddp-mpi", "torch", "torch-plain")]
    mine = ours(c, prec)[0]
    ddp_gain, torch_gain = gains(c, prec)
    wait = next((by[(c, prec, i)].get("data_wait_seconds") for i in ("ddp-nccl", "ddp-eager", "ddp-mpi")
                 if (c, prec, i) in by and not by[(c, prec, i)].get("failed")), None)
    steps = f"{ref.get('warmup', '?')} + {ref.get('steps', '?')}"
    return [model, batch, prec, steps] + texts + [
        ratio(mine, rate(c, prec, "torch")[0]), ratio(mine, rate(c, prec, "torch-plain")[0]),
        "-" if ddp_gain is None else f"{ddp_gain:.2f}x",
        "-" if torch_gain is None else f"{torch_gain:.2f}x",
        "-" if wait is None else f"{wait:.3f}"]

def write_csv(rows):
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "batch", "precision", "steps", "ddp_nccl_samples_per_sec",
                    "ddp_eager_samples_per_sec", "ddp_mpi_samples_per_sec", "torch_ddp_samples_per_sec",
                    "torch_plain_samples_per_sec", "ddp_vs_torch_ddp", "ddp_vs_torch_plain",
                    "ddp_vs_own_fp32", "torch_ddp_vs_own_fp32", "ddp_data_wait_seconds"])
        for (c, prec), text in zip(rows_run, rows):
            raw = [rate(c, prec, i)[0]
                   for i in ("ddp-nccl", "ddp-eager", "ddp-mpi", "torch", "torch-plain")]
            mine = ours(c, prec)[0]
            num = lambda v: "" if v is None else f"{v:.4f}"
            w.writerow(text[:4] + ["" if v is None else f"{v:.1f}" for v in raw]
                       + [num(mine / raw[3] if mine and raw[3] else None),
                          num(mine / raw[4] if mine and raw[4] else None)]
                       + [num(g) for g in gains(c, prec)]
                       + [text[13] if text[13] != "-" else ""])

rows = [row(c, prec) for c, prec in rows_run]
lines = header() + ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
if dev == "cpu":
    lines += ["", "(CPU run: a check that the benchmark works, with a handful of steps; not a measurement.)"]
text = "\n".join(lines) + "\n"
open(md_path, "w").write(text)
if show == "1":
    print(text)
write_csv(rows)
EOF
}

# run_row CASE PREC: the runs of one row of the table. fp32: every backend, PyTorch DDP and
# plain; bf16 / fp16: one backend and PyTorch DDP (the precision changes the GEMMs, not what
# DDP or the host staging costs).
run_row() {
  local c=$1 prec=$2 layers batch warmup steps backends=$PREC_BACKEND plains=0 b plain
  read -r layers batch warmup steps <<<"${CASE_SPEC[$c]}"
  [[ $DEVICE == cpu ]] && read -r warmup steps <<<"${CASE_CPU_STEPS[$c]}"
  if [[ $prec == fp32 ]]; then
    backends=$BACKENDS
    plains="0 1"
  fi
  if [[ $ONLY != torch ]]; then
    for b in $backends; do run_ddp "$c" "$b" "$prec" "$layers" "$batch" "$warmup" "$steps"; done
  fi
  if [[ $ONLY != ddp ]]; then
    for plain in $plains; do run_torch "$c" "$plain" "$prec" "$layers" "$batch" "$warmup" "$steps"; done
  fi
}

START=$SECONDS
for c in $CASES; do
  for p in $PRECISIONS; do
    [[ $p == fp32 || " $PREC_CASES " == *" $c "* ]] || continue
    run_row "$c" "$p"
    report 0
  done
done
report 1

echo "gpu_train_bench.sh: $((SECONDS - START)) s; $OUTDIR/train_bench.md, train_bench.csv, raw/" >&2
exit $((FAILED ? 1 : 0))
