# The GPU benchmarks' own logic, on the CPU: bench/gpu_train_bench.sh in its functional mode
# (DDP_BENCH_DEVICE=cpu) with epochs shorter than the timed steps, so the rate must count every
# timed step across epoch ends (it once summed the progress records' per-epoch counts), and
# PyTorch's rows must run; and bench/torch_ddp.py's query of OpenBLAS's kernel family against
# libraries that export it under a renamed symbol (numpy's scipy-openblas) or not at all (it
# once failed every PyTorch run there); and gpu_check.sh's split of its extra-argument variables
# (plain word splitting once broke a quoted list of cases in two); and bench/bitwise_bench.sh's
# table on the seed config. Skipped (exit 77) without a
# python3 that imports torch.
source "$(dirname "$0")/lib.sh"

python=/usr/bin/python3
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "SKIP: $python does not import torch (launch/install-deps --torch)"
  exit 77
fi

# --- the training rate over epoch ends --------------------------------------------------------
checks=$((checks + 1))
bench_out="$WORK/bench"
DDP_BENCH_DEVICE=cpu timeout 300 bash "$DDP_SOURCE_DIR/bench/gpu_train_bench.sh" --cases small64 \
  --precisions fp32 --backends mpi --samples 256 --out "$bench_out" >"$WORK/bench.log" 2>&1
rc=$?
if ((rc != 0)); then
  fail "gpu_train_bench.sh (cpu) exited $rc"; tail -20 "$WORK/bench.log"
else
  pass "gpu_train_bench.sh (cpu) ran"
fi

# Every row ran, and ddp-train's rate is its timed steps' samples (4 steps an epoch at batch 64
# of 256 samples) over the time between the progress records that bound them.
checks=$((checks + 1))
if verdict="$("$python" - "$bench_out/raw" 2>&1 <<'PY'
import json, sys
raw = sys.argv[1]
results = [json.loads(line) for line in open(f"{raw}/results.jsonl") if line.strip()]
impls = {r["impl"]: r for r in results}
missing = [i for i in ("ddp-mpi", "torch", "torch-plain") if i not in impls]
if missing:
    sys.exit(f"no result for {missing}: {results}")
bad = [i for i, r in impls.items() if r.get("failed") or not r.get("samples_per_sec", 0) > 0]
if bad:
    sys.exit(f"failed or empty rows: {bad}: {results}")
ddp = impls["ddp-mpi"]
recs = [json.loads(line) for line in open(f"{raw}/ddp_small64_mpi_fp32/out/metrics.jsonl")]
train = [r for r in recs if r.get("type") == "train"]
steps = train[-1]["global_step"] - train[0]["global_step"]
epochs = {r["epoch"] for r in recs if r.get("type") == "epoch" and
          train[0]["global_step"] < r["global_step"] <= train[-1]["global_step"]}
if len(epochs) < 2:
    sys.exit(f"the timed steps span {len(epochs)} epoch end(s); the check needs several")
want = steps * 64 / (train[-1]["time"] - train[0]["time"])
if ddp["samples"] != steps * 64 or abs(ddp["samples_per_sec"] - want) > 1e-9 * want:
    sys.exit(f"ddp-train: {ddp['samples']} samples at {ddp['samples_per_sec']}/s, "
             f"want {steps * 64} at {want}/s")
print(f"{steps} timed steps over {len(epochs)} epoch ends: {want:,.0f} samples/s")
PY
)"; then
  pass "rates: $verdict"
else
  fail "rates: $verdict"
fi
if grep -q failed "$bench_out/train_bench.csv" 2>/dev/null; then
  checks=$((checks + 1)); fail "the table has failed rows: $(cat "$bench_out/train_bench.csv")"
fi

# --- OpenBLAS's kernel family under renamed symbols --------------------------------------------
checks=$((checks + 1))
cat >"$WORK/renamed.c" <<'C'
const char* scipy_openblas_get_corename64_(void) { return "Zen"; }
C
cat >"$WORK/none.c" <<'C'
int openblas_something_else(void) { return 1; }
C
cc -shared -fPIC -o "$WORK/libscipy_openblas64_.so" "$WORK/renamed.c" &&
  cc -shared -fPIC -o "$WORK/libopenblas_none.so" "$WORK/none.c" || fail "cc could not build the test libraries"
names="$(cd "$DDP_SOURCE_DIR/bench" && "$python" -c '
import sys, torch_ddp
for path in sys.argv[1:]:
    print(torch_ddp.openblas_corename(path))
' "$WORK/libscipy_openblas64_.so" "$WORK/libopenblas_none.so" 2>&1)"
want="Zen
unknown (libopenblas_none.so exports no corename query)"
if [[ "$names" == "$want" ]]; then
  pass "openblas_corename: $(echo $names)"
else
  fail "openblas_corename: got '$names', want '$want'"
fi

# --- gpu_check.sh's extra arguments keep the shell's quoting ----------------------------------
checks=$((checks + 1))
split_check="$WORK/split_check.sh"
sed -n '/^die() {/,/^}/p;/^split_args() {/,/^}/p' "$DDP_SOURCE_DIR/bench/gpu_check.sh" >"$split_check"
words="$(bash -c 'source "$1"; split_args "--cases \"small64 wide1024\" --backends nccl" V
  printf "[%s]" "${SPLIT[@]}"; split_args "" V; echo " ${#SPLIT[@]}"' _ "$split_check" 2>&1)"
bad="$(bash -c 'source "$1"; split_args "--cases \"small64" DDP_TRAIN_BENCH_ARGS; echo parsed' _ \
  "$split_check" 2>&1)"
bad_rc=$?
if [[ "$words" != "[--cases][small64 wide1024][--backends][nccl] 0" ]]; then
  fail "split_args: got '$words'"
elif ((bad_rc != 2)) || [[ "$bad" != *"DDP_TRAIN_BENCH_ARGS does not split into arguments"* ]]; then
  fail "split_args on an unbalanced quote: exit $bad_rc, '$bad'"
else
  pass "gpu_check.sh split_args: $words; an unbalanced quote: $bad"
fi

# --- bitwise_bench.sh: a row per path, each against the default's median ------------------------
checks=$((checks + 1))
table="$(timeout 300 bash "$DDP_SOURCE_DIR/bench/bitwise_bench.sh" --bin "$DDP_TRAIN" --ranks "1 2" \
  --chunks 10 --runs 1 --steps 30 -- --config "$DDP_SOURCE_DIR/configs/seed.yaml" \
  --set training.print_shapes=false 2>&1)"
rows="$(grep -cE '^\| [12] \| (default|bitwise, chunk 10) \| [0-9]+  \| [0-9]+ \| [0-9.]+x \|$' <<<"$table")"
if ((rows == 4)) && grep -qE '^\| 2 \| default \| .* \| 1\.00x \|$' <<<"$table"; then
  pass "bitwise_bench.sh: default and chunked rows at 1 and 2 ranks"
else
  fail "bitwise_bench.sh printed $rows rows of 4:"; echo "$table" | tail -8
fi

finish
