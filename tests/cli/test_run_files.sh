# What a run does to files, through the real binary: links another user planted in a shared
# folder are never followed (their targets keep their bytes); a second job in a running job's
# output.dir is refused naming the holder, and a dead job's lock is taken over; a fresh run
# refuses to start where an earlier run left checkpoints (--start-over moves them aside,
# byte for byte); --resume auto passes over damaged checkpoints to the newest valid one; a
# non-UTF-8 output path and the umask are honoured.
source "$(dirname "$0")/lib.sh"

seed="$DDP_SOURCE_DIR/configs/seed.yaml"
common=(--config "$seed" --set training.log_every=0)

# Overwrites 7 bytes of $1's last tensor: a checksum mismatch.
damage() { printf 'garbage' | dd of="$1" bs=1 seek=$(($(stat -c %s "$1") - 8)) conv=notrunc status=none; }

# The bytes of every file under $1 (names and contents), to compare before and after.
snapshot() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }

# --- links planted by another user in a shared folder ------------------------------------------
hostile_folder() {
  checks=$((checks + 1))
  local shared="$WORK/shared" victim="$WORK/victim"
  mkdir -p "$shared" "$victim" && chmod 1777 "$shared" && chmod 755 "$WORK"
  printf 'precious\n' >"$victim/file"
  as_other() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
  if ((EUID != 0)) || ! as_other true 2>/dev/null; then
    echo "skipped: hostile folder (needs root and setpriv to act as another user)"
    checks=$((checks - 1)); return
  fi
  # A link in place of output.dir itself, and a folder of the other user's with links at every
  # name a run writes, at the fixed temporary name the trace used and at the temporary names the
  # writers used to derive from the next few hundred pids.
  as_other ln -s "$victim" "$shared/out"
  as_other mkdir -m 777 "$shared/theirs"
  local name p
  for name in metrics.jsonl config.yaml model.safetensors trace.json trace.json.tmp; do
    as_other ln -s "$victim/file" "$shared/theirs/$name"
  done
  for ((p = $$; p < $$ + 400; ++p)); do
    as_other ln -s "$victim/file" "$shared/theirs/model.safetensors.tmp.$p"
  done
  local before
  before="$(snapshot "$victim")"
  run_ranks 1 60 "${common[@]}" --set "output.dir=$shared/out"
  if ((rc != 1)) || ! grep -q "output.dir: '$shared/out' is a symbolic link of another user" <<<"$out"; then
    fail "hostile folder: output.dir as another user's link: rc $rc"; echo "$out" | tail -3; return
  fi
  local refusal
  refusal="$(grep -o 'output.dir: .*not followed' <<<"$out" | head -1)"
  run_ranks 1 60 "${common[@]}" --set "output.dir=$shared/theirs" --set output.trace=true \
    --set checkpoint.every_steps=100
  if ((rc != 0)); then fail "hostile folder: the run failed ($rc)"; echo "$out" | tail -3; return; fi
  if [[ "$(snapshot "$victim")" != "$before" ]]; then fail "hostile folder: the links' target changed"; return; fi
  for name in metrics.jsonl config.yaml model.safetensors trace.json; do
    if [[ -L "$shared/theirs/$name" || ! -f "$shared/theirs/$name" ]]; then
      fail "hostile folder: $name is not a file of the run's own"; return
    fi
  done
  pass "hostile folder: a planted output.dir link refused (\"$refusal\"), 405 planted links left their target's bytes as they were"
}
hostile_folder

# start_endless NAME DIR: one rank trains into DIR until stopped ($launcher); returns once it
# holds DIR's lock and has written a checkpoint (1, and the check failed, if it never does).
start_endless() {
  local name="$1" dir="$2"
  start_ranks 1 "$dir.log" "${common[@]}" --set "output.dir=$dir" --set training.epochs=100000 \
    --set checkpoint.every_steps=2000
  under_way() { [[ -s "$dir/.ddp-lock" ]] && compgen -G "$dir/checkpoints/step-*.safetensors" >/dev/null; }
  wait_until 60 under_way && return
  fail "$name: the job never wrote a checkpoint"; kill "$launcher"; wait "$launcher"; return 1
}

# --- two jobs, one output.dir ---------------------------------------------------------------
two_jobs() {
  checks=$((checks + 1))
  local dir="$WORK/two"
  start_endless "two jobs" "$dir" || return
  local first="$launcher"
  ranks_command 2 "${common[@]}" --set "output.dir=$dir"
  local second
  second="$(timeout 60 "${cmd[@]}" 2>&1)"; local second_rc=$?
  read_rank_codes 2
  kill -TERM "$(ranks_of "output.dir=$dir( |$)")" 2>/dev/null
  wait "$first"; local first_rc=$?
  if ((second_rc != 1)) || [[ "$rank_codes" != "1 1 " ]]; then
    fail "two jobs: the second exited $second_rc (ranks $rank_codes)"; echo "$second" | tail -3; return
  fi
  if ! grep -q "output.dir: '$dir' is in use by another job (host .* pid [0-9]* since" <<<"$second"; then
    fail "two jobs: the refusal does not name the holder"; echo "$second" | tail -3; return
  fi
  if ((first_rc != 75)); then fail "two jobs: the first job ended $first_rc, expected 75 (stopped)"; return; fi
  # One job's records only: a single start, no second summary.
  if (($(grep -c '"type":"resume"\|"type":"summary"' "$dir/metrics.jsonl") > 1)); then
    fail "two jobs: metrics.jsonl holds more than one job's records"; return
  fi
  pass "two jobs: the second refused on both ranks: $(grep -o "is in use by another job ([^)]*)" <<<"$second" | head -1); the first ran on and stopped cleanly (75)"
}
two_jobs

# --- a dead job's lock is taken over --------------------------------------------------------
stale_lock() {
  checks=$((checks + 1))
  local dir="$WORK/stale"
  start_endless "stale lock" "$dir" || return
  kill -9 "$(ranks_of "output.dir=$dir( |$)")"
  wait "$launcher"
  run_ranks 2 120 "${common[@]}" --set "output.dir=$dir" --set training.epochs=20 --resume auto
  if ((rc != 0)); then fail "stale lock: the resumed run failed ($rc)"; echo "$out" | tail -3; return; fi
  if ! grep -q "warning: output.dir: took over '$dir/.ddp-lock' from a job that is gone (host .* pid" <<<"$out"; then
    fail "stale lock: no warning about the dead holder"; echo "$out" | head -5; return
  fi
  if [[ -s "$dir/.ddp-lock" ]]; then fail "stale lock: a clean end left the lock file non-empty"; return; fi
  pass "stale lock: $(grep -o 'took over .* gone' <<<"$out")"
}
stale_lock

# --- a fresh run where an earlier run left checkpoints -------------------------------------
fresh_over_earlier() {
  checks=$((checks + 1))
  local dir="$WORK/earlier"
  run_ranks 2 120 "${common[@]}" --set "output.dir=$dir" --set checkpoint.every_steps=40
  if ((rc != 0)); then fail "earlier run: failed ($rc)"; return; fi
  local before
  before="$(snapshot "$dir" | grep -v ddp-lock)"
  expect_error "a fresh run beside an earlier run's checkpoints" 2 \
    "checkpoint.dir: $dir/checkpoints holds 3 checkpoints of an earlier run" \
    "${common[@]}" --set "output.dir=$dir" --set checkpoint.every_steps=40 --set optimizer.lr=0.5
  if [[ "$(snapshot "$dir" | grep -v ddp-lock)" != "$before" ]]; then
    fail "fresh run: the earlier run's files changed although it was refused"; return
  fi
  run_ranks 2 120 "${common[@]}" --set "output.dir=$dir" --set checkpoint.every_steps=40 \
    --set optimizer.lr=0.5 --start-over
  if ((rc != 0)); then fail "start over: failed ($rc)"; echo "$out" | tail -3; return; fi
  local moved kept
  moved="$(cd "$dir" && ls -d earlier-run-*)"
  kept="$(cat <(snapshot "$dir/$moved") <(snapshot "$dir/checkpoints/$moved") | awk '{print $1}' | sort)"
  if [[ "$kept" != "$(awk '{print $1}' <<<"$before" | sort)" ]]; then
    fail "start over: the files moved aside are not the earlier run's, byte for byte"; return
  fi
  if ! grep -q "start over: the earlier run's 3 checkpoints moved to $dir/checkpoints/$moved" <<<"$out"; then
    fail "start over: the log does not say where the checkpoints went"; echo "$out" | grep -i start; return
  fi
  pass "start over: the earlier run's $(wc -l <<<"$kept") files kept byte for byte in $moved/"
}
fresh_over_earlier

# --- a resumed run's earlier metrics: a link in their place is refused, not followed --------
metrics_link() {
  local dir="$WORK/earlier" victim="$WORK/metrics-victim"
  printf 'precious\n' >"$victim"
  mv "$dir/metrics.jsonl" "$dir/metrics.kept"
  ln -s "$victim" "$dir/metrics.jsonl"
  expect_error "a link in place of metrics.jsonl on resume" 2 \
    "output.dir: cannot read $dir/metrics.jsonl: it is a symbolic link" \
    "${common[@]}" --set "output.dir=$dir" --set checkpoint.every_steps=40 --set optimizer.lr=0.5 \
    --set training.epochs=11 --resume auto
  check "the link's target kept its bytes" test "$(cat "$victim")" = precious
  rm "$dir/metrics.jsonl" && mv "$dir/metrics.kept" "$dir/metrics.jsonl"
  expect_error "--start-over with --resume" 2 \
    "training.start_over: starts a fresh run; training.resume 'auto' continues one: not both" \
    "${common[@]}" --set "output.dir=$dir" --start-over --resume auto
}
metrics_link

# --- --resume auto passes over damaged checkpoints ------------------------------------------
damaged_newest() {
  checks=$((checks + 1))
  local dir="$WORK/damaged" ckpts
  run_ranks 1 120 "${common[@]}" --set "output.dir=$dir" --set checkpoint.every_steps=40
  ckpts=("$dir"/checkpoints/step-*.safetensors)
  local newest="${ckpts[2]}" middle="${ckpts[1]}"
  damage "$newest"
  run_ranks 2 120 "${common[@]}" --set "output.dir=$dir" --set training.epochs=12 \
    --set checkpoint.every_steps=40 --resume auto
  if ((rc != 0)); then fail "damaged newest: resume failed ($rc)"; echo "$out" | tail -3; return; fi
  if ! grep -q "resume: skipped checkpoint '$newest'.*checksum mismatch" <<<"$out" ||
     ! grep -q "resume: $middle: epoch" <<<"$out"; then
    fail "damaged newest: did not say what it skipped and resume the one before"; echo "$out" | grep resume; return
  fi
  if ! compgen -G "$dir/checkpoints/skipped-*/$(basename "$newest")" >/dev/null; then
    fail "damaged newest: the damaged checkpoint was not kept aside"; return
  fi
  pass "damaged newest: $(grep -o 'resume: skipped .*mismatch' <<<"$out" | cut -c1-90)...; resumed from $(basename "$middle")"
  local c
  for c in "$dir"/checkpoints/step-*.safetensors; do damage "$c"; done
  expect_error "every checkpoint damaged" 2 "training.resume auto: none of the 3 checkpoint(s) in $dir/checkpoints can continue this run" \
    "${common[@]}" --set "output.dir=$dir" --set training.epochs=12 --resume auto
}
damaged_newest

# --- names and modes ------------------------------------------------------------------------
non_utf8_path() {
  checks=$((checks + 1))
  local dir
  dir="$WORK/$(printf 'caf\xe9')"
  run_ranks 1 60 "${common[@]}" --set "output.dir=$dir" --set checkpoint.every_steps=100
  if ((rc != 0)); then fail "non-UTF-8 output path: failed ($rc)"; echo "$out" | tail -3; return; fi
  if ! grep -q $'"path":"[^"]*caf\xef\xbf\xbd/checkpoints/step-000000100' "$dir/metrics.jsonl"; then
    fail "non-UTF-8 output path: the checkpoint record does not carry U+FFFD"; return
  fi
  pass "non-UTF-8 output path: trained and recorded its checkpoints (the byte as U+FFFD in metrics.jsonl)"
}
non_utf8_path

umask_honoured() {
  local mask expected dir modes
  for mask in 077 002; do
    checks=$((checks + 1))
    dir="$WORK/umask$mask"
    expected="$(printf '%o' $((0666 & ~8#$mask)))"
    (umask "$mask" && run_ranks 1 60 "${common[@]}" --set "output.dir=$dir" --set checkpoint.every_steps=100)
    modes="$(stat -c '%a' "$dir/model.safetensors" "$dir/metrics.jsonl" "$dir/checkpoints/step-000000400.safetensors" | sort -u)"
    if [[ "$modes" != "$expected" ]]; then fail "umask $mask: files have modes $modes, expected $expected"; continue; fi
    pass "umask $mask: model, metrics and checkpoints are $expected"
  done
}
umask_honoured

finish
