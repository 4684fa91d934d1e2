# Files that are not regular files, signals and outputs that are inputs, through the real binary:
# a FIFO (or a device, or a directory) in place of any input file is refused within seconds,
# naming it, where open() used to block forever; SIGTERM and SIGINT stop convert, predict and
# evaluate within a second with 143 / 130 and no output left; a closed stdout does not kill a
# training run before it writes its model; predict and convert refuse an output that is one of
# their inputs, by identity, and the input keeps its bytes.
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"

# refused NAME MESSAGE ARGS...: ddp-train ARGS (one process) exits 1 within 20 s saying MESSAGE.
# A process blocked in open() does not end on timeout's SIGTERM (it only asks for a stop): -k.
refused() {
  local name="$1" message="$2"; shift 2
  checks=$((checks + 1))
  local got code start=$SECONDS
  got="$(timeout -k 2 20 "$DDP_TRAIN" "$@" 2>&1)"
  code=$?
  if ((code == 124 || code == 137)); then
    fail "$name: still blocked after 20 s"
  elif ((code != 1)) || ! grep -qF -- "$message" <<<"$got"; then
    fail "$name: exit $code, expected 1 with '$message':"; echo "$got" | tail -3
  else
    pass "$name ($((SECONDS - start)) s): $(grep -m1 -oF -- "$message" <<<"$got")"
  fi
}

# IDX files of N 4x5 images (random pixels) and their labels in [0, 3): the seed model's shape.
write_idx() {
  python3 - "$1" "$2" "$3" <<'PY'
import os, random, sys
n, images, labels = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(images, "wb") as f:
    f.write((0x803).to_bytes(4, "big") + n.to_bytes(4, "big") + (4).to_bytes(4, "big") +
            (5).to_bytes(4, "big") + os.urandom(20 * n))
with open(labels, "wb") as f:
    f.write((0x801).to_bytes(4, "big") + n.to_bytes(4, "big") +
            bytes(b % 3 for b in os.urandom(n)))
PY
}
# write_npy N PATH [labels]: a uint8 .npy of N rows of 20 features (read as v / 255), or of N
# labels in [0, 3).
write_npy() {
  python3 - "$1" "$2" "${3:-features}" <<'PY'
import os, sys
n, path, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3]
shape, data = ("(%d,)" % n, bytes(b % 3 for b in os.urandom(n))) if kind == "labels" else \
    ("(%d, 20)" % n, os.urandom(20 * n))
header = "{'descr': '|u1', 'fortran_order': False, 'shape': %s, }" % shape
header += " " * ((64 - (11 + len(header)) % 64) % 64) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data)
PY
}

# The seed model (20 features, 3 classes) and small inputs of its shape.
"$DDP_TRAIN" --config "$seed" --set "output.dir=$WORK/m" --set training.epochs=1 >/dev/null 2>&1
model="$WORK/m/model.safetensors"
check "the seed model trained" test -s "$model"
write_idx 10 "$WORK/images" "$WORK/labels"
write_npy 10 "$WORK/small.npy"
printf '0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1,1.1,1.2,1.3,1.4,1.5,1.6,1.7,1.8,1.9,2,1\n' >"$WORK/one.csv"

# --- A FIFO (with no writer) for each kind of input file: refused at once, named.
fifo="$WORK/fifo"
mkfifo "$fifo" "$fifo.gz" "$fifo.csv" "$fifo.npy" "$fifo.safetensors"
is_fifo="not a regular file (a FIFO)"
refused "FIFO as --config" "config file '$fifo': $is_fifo" --config "$fifo"
refused "FIFO as evaluate --config" "config file '$fifo': $is_fifo" \
  evaluate --config "$fifo" --model "$model"
refused "FIFO as --resume" "'$fifo.safetensors': $is_fifo" \
  --config "$seed" --set "output.dir=$WORK/r" --resume "$fifo.safetensors"
refused "FIFO as predict --model" "safetensors file '$fifo': $is_fifo" \
  predict --model "$fifo" --data "$WORK/one.csv" --out "$WORK/p.csv"
refused "FIFO as evaluate --model" "safetensors file '$fifo': $is_fifo" \
  evaluate --config "$seed" --set data.test.samples=10 --model "$fifo"
refused "FIFO as predict --data (IDX .gz)" "$fifo.gz: $is_fifo" \
  predict --model "$model" --data "$fifo.gz" --out "$WORK/p.csv"
refused "FIFO as predict --data (CSV)" "$fifo.csv: $is_fifo" \
  predict --model "$model" --data "$fifo.csv" --out "$WORK/p.csv"
refused "FIFO as predict --data (.npy)" "npy file '$fifo.npy': $is_fifo" \
  predict --model "$model" --data "$fifo.npy" --out "$WORK/p.csv"
refused "FIFO as convert --images (IDX)" "$fifo: $is_fifo" \
  convert --format idx --images "$fifo" --labels "$WORK/labels" --out "$WORK/c"
refused "FIFO as convert --labels (IDX)" "$fifo: $is_fifo" \
  convert --format idx --images "$WORK/images" --labels "$fifo" --out "$WORK/c"
refused "FIFO as convert --data (CSV)" "$fifo.csv: $is_fifo" \
  convert --format csv --data "$fifo.csv" --out "$WORK/c"
# Training's data files: the config's check names the key, the reader would name the file.
cat >"$WORK/fifo_data.yaml" <<YAML
model: {layers: [20, 10, 3]}
data: {format: idx, train: {images: $fifo, labels: $WORK/labels}}
output: {dir: $WORK/out}
YAML
refused "FIFO as data.train.images" "data.train.images: not a regular file: $fifo" \
  --config "$WORK/fifo_data.yaml"
cat >"$WORK/fifo_test.yaml" <<YAML
model: {layers: [20, 10, 3]}
data: {format: npy, train: {features: $WORK/small.npy, labels: $fifo.npy}}
output: {dir: $WORK/out}
YAML
refused "FIFO as data.train.labels (.npy)" "data.train.labels: not a regular file: $fifo.npy" \
  --config "$WORK/fifo_test.yaml"
# A device that never ends and a directory: refused alike.
refused "/dev/zero as predict --data" "/dev/zero: not a regular file (a character device)" \
  predict --model "$model" --data /dev/zero --format idx --out "$WORK/p.csv"
refused "a directory as --config" "config file '$WORK': not a regular file (a directory)" \
  --config "$WORK"
check "no output from the refused runs" test ! -e "$WORK/p.csv" -a ! -e "$WORK/c"

# --- Signals: the one-shot commands stop within a second, exit 128 + signal, leave nothing.
# ms_since START_NS: milliseconds since a `date +%s%N`.
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
# cpu_ticks PID: user + system clock ticks the process has used (0 once it is gone).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# stop_check NAME SIGNAL CODE READY LEFTOVER ARGS...: starts ddp-train ARGS, waits (up to 60 s)
# until the command READY (given the pid) succeeds, i.e. the work is under way, sends SIGNAL;
# the process must exit CODE within 1 s saying "stopped by SIG<SIGNAL>", and LEFTOVER (a
# directory) must hold no file.
stop_check() {
  local name="$1" signal="$2" code="$3" ready="$4" leftover="$5"; shift 5
  checks=$((checks + 1))
  "$DDP_TRAIN" "$@" >"$WORK/stop.log" 2>&1 &
  local pid=$! waited=0
  while ! "$ready" "$pid" && kill -0 "$pid" 2>/dev/null && ((waited < 600)); do
    sleep 0.1; waited=$((waited + 1))
  done
  local start rc ms
  start=$(date +%s%N)
  kill -"$signal" "$pid" 2>/dev/null
  (sleep 10 && kill -KILL "$pid") 2>/dev/null &  # a regression fails, it does not hang
  local watchdog=$!
  wait "$pid"; rc=$?
  ms=$(ms_since "$start")
  kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null
  local left
  left="$(find "$leftover" -type f 2>/dev/null | head -3)"
  if ((rc != code)); then
    fail "$name: exit $rc, expected $code"; tail -3 "$WORK/stop.log"
  elif ((ms > 1000)); then
    fail "$name: took $ms ms to stop"
  elif ! grep -q "stopped by SIG$signal" "$WORK/stop.log"; then
    fail "$name: no 'stopped by SIG$signal' in:"; tail -3 "$WORK/stop.log"
  elif [[ -n "$left" ]]; then
    fail "$name: left $left"
  else
    pass "$name: exit $rc $ms ms after SIG$signal: $(grep -o '[^:]*: stopped by .*' "$WORK/stop.log" | head -1)"
  fi
}

# The work is under way once the process has used 0.3 s of CPU: starting up (MPI, the model,
# mapping a .npy) takes a few hundredths.
busy() { (($(cpu_ticks "$1") >= 30)); }

# 2,000,000 rows of a .npy: predict maps them at once and spends its time on the batches.
write_npy 2000000 "$WORK/big.npy"
mkdir -p "$WORK/pout"
stop_check "predict on SIGTERM" TERM 143 busy "$WORK/pout" \
  predict --model "$model" --data "$WORK/big.npy" --out "$WORK/pout/p.csv"
stop_check "predict on SIGINT" INT 130 busy "$WORK/pout" \
  predict --model "$model" --data "$WORK/big.npy" --out "$WORK/pout/p.csv"
check "predict stopped in its batches" grep -q "predict: stopped by SIGINT" "$WORK/stop.log"

# A 600,000-row CSV (85 MB): convert stops in the middle of parsing it.
python3 - "$WORK/big.csv" <<'PY'
import random, sys
random.seed(1)
rows = "".join(",".join("%.4f" % random.random() for _ in range(20)) + ",%d\n" % (i % 3)
               for i in range(1000))
with open(sys.argv[1], "w") as f:
    for _ in range(600):
        f.write(rows)
PY
stop_check "convert (CSV) on SIGTERM" TERM 143 busy "$WORK/cout" \
  convert --format csv --data "$WORK/big.csv" --out "$WORK/cout"
stop_check "convert (CSV) on SIGINT" INT 130 busy "$WORK/cout" \
  convert --format csv --data "$WORK/big.csv" --out "$WORK/cout"

# evaluate on the 2,000,000 rows of the .npy: it too spends its time on the batches.
write_npy 2000000 "$WORK/big-labels.npy" labels
cat >"$WORK/big_npy.yaml" <<YAML
model: {layers: [20, 10, 3]}
data:
  format: npy
  train: {features: $WORK/small.npy, labels: $WORK/big-labels.npy}
  test: {features: $WORK/big.npy, labels: $WORK/big-labels.npy}
output: {dir: $WORK/eout}
YAML
mkdir -p "$WORK/eout"
stop_check "evaluate on SIGTERM" TERM 143 busy "$WORK/eout" \
  evaluate --config "$WORK/big_npy.yaml" --model "$model"
check "evaluate stopped in its batches" grep -q "evaluate: stopped by SIGTERM" "$WORK/stop.log"

# --- A closed stdout: the run goes on, writes its model and exits 0.
checks=$((checks + 1))
"$DDP_TRAIN" --config "$seed" --set "output.dir=$WORK/piped" --set training.epochs=5 | head -1 >/dev/null
codes="${PIPESTATUS[*]}"
if [[ "$codes" != "0 0" ]]; then
  fail "training piped into head -1: exit codes $codes (141: killed by SIGPIPE)"
elif [[ ! -s "$WORK/piped/model.safetensors" ]]; then
  fail "training piped into head -1: no model.safetensors"
else
  pass "training piped into head -1 exits 0 and writes model.safetensors"
fi

# --- An output that is one of the inputs: refused by identity, the input keeps its bytes.
cp "$WORK/small.npy" "$WORK/keep.npy"
ln "$WORK/small.npy" "$WORK/hard.npy"
sum="$(cksum <"$WORK/small.npy")"
same="(the same file)"
refused "predict --out is --data (another spelling)" "is --data $WORK/small.npy $same" \
  predict --model "$model" --data "$WORK/small.npy" --out "$WORK/./m/../small.npy"
refused "predict --out is --data (a hard link)" "is --data $WORK/small.npy $same" \
  predict --model "$model" --data "$WORK/small.npy" --out "$WORK/hard.npy"
refused "predict --out is --model" "is --model $model $same" \
  predict --model "$model" --data "$WORK/small.npy" --out "$WORK/m/./model.safetensors"
check "the data kept its bytes" test "$(cksum <"$WORK/small.npy")" = "$sum"
check "the model still loads" "$DDP_TRAIN" predict --model "$model" --data "$WORK/small.npy" \
  --out "$WORK/ok.csv"
mkdir -p "$WORK/conv"
cp "$WORK/one.csv" "$WORK/conv/labels.npy"  # a CSV whose name is what convert writes
refused "convert --out holds --data" "is --data $WORK/conv/labels.npy $same" \
  convert --format csv --data "$WORK/conv/labels.npy" --out "$WORK/conv/"
check "convert's input kept its bytes" cmp "$WORK/one.csv" "$WORK/conv/labels.npy"
check "convert wrote nothing" test ! -e "$WORK/conv/features.npy"

finish
