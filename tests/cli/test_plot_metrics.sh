# launch/plot-metrics on synthetic metrics.jsonl files: a resumed run with lr and grad_norm, eval
# records and a truncated last line; an older file without lr and grad_norm; and the error paths
# (no file, no train records, no matplotlib). Skipped (exit 77) without a python3 that imports
# matplotlib (launch/install-deps --plot).
source "$(dirname "$0")/lib.sh"

plot="$DDP_SOURCE_DIR/launch/plot-metrics"
python=""
for candidate in /usr/bin/python3 "$(command -v python3)"; do
  if [[ -x "$candidate" ]] && "$candidate" -c 'import matplotlib' 2>/dev/null; then
    python="$candidate"
    break
  fi
done
if [[ -z "$python" ]]; then
  echo "SKIP: no python3 that imports matplotlib (launch/install-deps --plot)"
  exit 77
fi


# run_plot ARGS...: runs plot-metrics ARGS through its own #! line; sets $out (stdout), $err
# (stderr) and $rc.
run_plot() {
  out="$(timeout 60 "$plot" "$@" 2>"$WORK/stderr")"
  rc=$?
  err="$(cat "$WORK/stderr")"
}

# is_png FILE: the PNG signature and a size a figure with curves has (over 20 KB).
is_png() {
  [[ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" == 89504e470d0a1a0a ]] &&
    (($(stat -c %s "$1") > 20000))
}
# png_height FILE: the image height from the IHDR chunk (big-endian, bytes 20-23).
png_height() {
  local b
  read -ra b <<<"$(od -An -tu1 -j20 -N4 "$1")"
  echo $(((b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3]))
}

# write_metrics DIR NEW: a two-epoch run of 40 steps, logged every 5, killed after step 25 and
# resumed from the checkpoint at step 15 (global_step goes back), with lr and grad_norm when NEW
# is 1; the last line is cut short, as a killed writer leaves it. With NEW 0, the run was killed
# while writing step 25's record too, and the resumed run's first line continues it.
write_metrics() {
  mkdir -p "$1"
  "$python" - "$1/metrics.jsonl" "$2" <<'EOF'
import json, math, sys
path, new = sys.argv[1], sys.argv[2] == "1"
lines = []
def record(**fields):
    lines.append(json.dumps(fields))
def train(step):
    epoch = (step - 1) // 20 + 1
    fields = dict(type="train", epoch=epoch, step=(step - 1) % 20 + 1, global_step=step,
                  loss=2.3 * math.exp(-step / 15) + 0.3, accuracy=min(0.9, 0.1 + step / 45),
                  samples=500, samples_per_sec=40000 + 300 * (step % 7), time=step * 0.01)
    if new:
        fields["lr"] = 0.1 * 0.5 * (1 + math.cos(math.pi * step / 40))
        if step % 10:  # grad_norm may be missing on some records
            fields["grad_norm"] = 30 * math.exp(-step / 8) + 0.05
        fields["future_field"] = [1, 2]
    record(**fields)
def epoch_end(epoch, step, test_accuracy):
    record(type="epoch", epoch=epoch, global_step=step, train_loss=0.8, train_accuracy=0.7,
           seconds=0.2, samples_per_sec=41000)
    record(type="eval", epoch=epoch, global_step=step, loss=1.3 - epoch * 0.3,
           accuracy=test_accuracy, samples=1000)
for step in (5, 10, 15):
    train(step)
record(type="checkpoint", epoch=1, step=15, global_step=15, path="checkpoints/step-15",
       seconds=0.01)
train(20)
epoch_end(1, 20, 0.62)
train(25)  # killed here: no summary
cut = lines.pop()[:30]
record(type="resume", checkpoint="checkpoints/step-15", epoch=1, step=15, global_step=15,
       checkpoint_world_size=2, world_size=2)
if not new:  # killed while writing line 8, which the resumed run then continued
    lines[-1] = cut + lines[-1]
record(type="some_future_type", value=1)
train(20)
epoch_end(1, 20, 0.62)
for step in range(25, 41, 5):
    train(step)
record(type="skipped_step", epoch=2, step=11, global_step=31)
epoch_end(2, 40, 0.8731)
record(type="summary", epochs=2, steps=40, samples=20000, seconds=1.0, samples_per_sec=40000,
       world_size=2, device="cpu", test_accuracy=0.8731, test_loss=0.7)
with open(path, "w") as f:
    f.write("\n".join(lines) + "\n" + lines[0][:25])
EOF
}

# A run with every field: the default output, with five panels.
write_metrics "$WORK/run" 1
start=$SECONDS
run_plot "$WORK/run"
seconds=$((SECONDS - start))
echo "$err" | tail -5
check "new-style metrics: exits 0 (${seconds}s)" test "$rc" = 0
check "prints the output path" test "$out" = "$WORK/run/metrics.png"
check "writes RUN_DIR/metrics.png, a PNG over 20 KB" is_png "$WORK/run/metrics.png"
check "a truncated last line is skipped quietly" test -z "$err"

# An older file (no lr, no grad_norm), to --out: three panels, so a shorter figure.
# run_plot goes through the #! line: where the python3 first on PATH lacks matplotlib (a pyenv
# one), the script runs itself again under /usr/bin/python3.
write_metrics "$WORK/old" 0
run_plot "$WORK/old" --out "$WORK/old.png"
echo "$err" | tail -5
check "old-style metrics: exits 0" test "$rc" = 0
check "a broken line mid-file is skipped with a warning" \
  grep -qF "plot-metrics: $WORK/old/metrics.jsonl:8: not JSON, skipped" <<<"$err"
check "--out: writes that file, a PNG over 20 KB" is_png "$WORK/old.png"
check "--out: prints it" test "$out" = "$WORK/old.png"
check "--out: no RUN_DIR/metrics.png" test ! -e "$WORK/old/metrics.png"
new_height="$(png_height "$WORK/run/metrics.png")" old_height="$(png_height "$WORK/old.png")"
check "no lr or grad_norm panels without the fields ($old_height < $new_height pixels)" \
  test "$old_height" -lt "$new_height"

# expect_plot_error NAME CODE MESSAGE: the last run_plot exited CODE with MESSAGE on stderr and
# wrote nothing to stdout.
expect_plot_error() {
  checks=$((checks + 1))
  if ((rc != $2)) || ! grep -qF -- "$3" <<<"$err" || [[ -n "$out" ]]; then
    fail "$1: exit $rc (expected $2), stderr: $err"
  else
    pass "$1: exit $rc, $err"
  fi
}
run_plot "$WORK/nowhere"
expect_plot_error "missing RUN_DIR" 1 "plot-metrics: $WORK/nowhere/metrics.jsonl: no such file"
mkdir -p "$WORK/empty"
run_plot "$WORK/empty"
expect_plot_error "RUN_DIR without metrics.jsonl" 1 \
  "plot-metrics: $WORK/empty/metrics.jsonl: no such file"
mkdir -p "$WORK/epochs"
grep -v '"type": "train"' "$WORK/run/metrics.jsonl" >"$WORK/epochs/metrics.jsonl"
run_plot "$WORK/epochs"
expect_plot_error "no train records" 1 \
  "plot-metrics: $WORK/epochs/metrics.jsonl has no train records (training.log_every: 0?)"
run_plot
expect_plot_error "no RUN_DIR" 2 "usage: plot-metrics RUN_DIR [--out FILE]"
# Without matplotlib (a stand-in ahead of the real one on PYTHONPATH that fails to import): the
# script says what to install.
mkdir -p "$WORK/no_matplotlib/matplotlib"
echo 'raise ImportError("hidden by the test")' >"$WORK/no_matplotlib/matplotlib/__init__.py"
PYTHONPATH="$WORK/no_matplotlib" run_plot "$WORK/run" --out "$WORK/none.png"
expect_plot_error "no matplotlib" 1 \
  "plot-metrics: needs python3-matplotlib: launch/install-deps --plot"
check "no matplotlib: no output" test ! -e "$WORK/none.png"

finish
