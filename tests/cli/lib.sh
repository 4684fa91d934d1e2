# Helpers for the end-to-end tests: run ddp-train under mpiexec with a time limit, record every
# rank's own exit code, find a rank's process, and check messages. Sourced by tests/cli/test_*.sh (run by ctest).
set -uo pipefail

: "${DDP_TRAIN:?DDP_TRAIN must point at the ddp-train binary}"
: "${DDP_SOURCE_DIR:?DDP_SOURCE_DIR must point at the source tree}"
DDP_MPIEXEC="${DDP_MPIEXEC:-mpiexec}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ddp_cli.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
failures=0
checks=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# Each rank runs in this wrapper, which records ddp-train's own exit code in $WORK/rc.<rank>
# and is otherwise transparent. mpirun signals each rank's whole process group: the wrapper
# survives SIGTERM and SIGUSR1 (traps, so ddp-train still starts with the default dispositions)
# and records what ddp-train did with them, instead of dying and losing the code; a ddp-train
# killed by a signal is passed on as that signal, so mpirun reports it as such.
rank_wrapper="$WORK/ddp-train-rank"
cat >"$rank_wrapper" <<WRAPPER
#!/usr/bin/env bash
trap : TERM USR1 USR2
$(printf '%q' "$DDP_TRAIN") "\$@"
code=\$?
echo \$code >$(printf '%q' "$WORK")/rc.\${OMPI_COMM_WORLD_RANK:-0}
if ((code > 128)); then trap - TERM USR1 USR2; kill -\$((code - 128)) \$\$; fi
exit \$code
WRAPPER
chmod +x "$rank_wrapper"

# ranks_command N ARGS...: sets $cmd to the mpiexec command line running ddp-train ARGS on N
# ranks, each in the wrapper; clears the recorded codes.
ranks_command() {
  local n="$1"; shift
  rm -f "$WORK"/rc.*
  cmd=("$DDP_MPIEXEC" -n "$n" --oversubscribe "$rank_wrapper" "$@")
}

# read_rank_codes N: sets $rank_codes to each rank's exit code, space-separated ("missing" for a
# rank that recorded none).
read_rank_codes() {
  local r
  rank_codes=""
  for ((r = 0; r < $1; ++r)); do
    rank_codes+="$(cat "$WORK/rc.$r" 2>/dev/null || echo missing) "
  done
}

# run_ranks N LIMIT_S ARGS...: runs ddp-train ARGS on N ranks; sets $out (stdout+stderr), $rc
# (mpiexec's code), $rank_codes and $elapsed.
run_ranks() {
  local n="$1" limit="$2"; shift 2
  ranks_command "$n" "$@"
  local start=$SECONDS
  out="$(timeout "$limit" "${cmd[@]}" 2>&1)"
  rc=$?
  elapsed=$((SECONDS - start))
  read_rank_codes "$n"
}

# start_ranks N LOG ARGS...: starts ddp-train ARGS on N ranks in the background, output to LOG;
# sets $launcher (mpiexec's pid). After `wait "$launcher"`, read_rank_codes N.
start_ranks() {
  local n="$1" log="$2"; shift 2
  ranks_command "$n" "$@"
  "${cmd[@]}" >"$log" 2>&1 &
  launcher=$!
}

# The pids of the ddp-train processes whose command line contains $1 (not their wrappers).
ranks_of() {
  local pid
  for pid in $(pgrep -f -- "$1" || true); do
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == ddp-train ]] && echo "$pid"
  done
}
# rank_pid PATTERN R: the pid of rank R among ranks_of PATTERN.
rank_pid() {
  local pid
  for pid in $(ranks_of "$1"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$pid"
    fi
  done
}
# wait_until LIMIT_S COMMAND...: waits until COMMAND succeeds; non-zero after LIMIT_S seconds.
wait_until() {
  local limit="$1"; shift
  local i
  for ((i = 0; i < limit * 10; ++i)); do
    "$@" && return 0
    sleep 0.1
  done
  return 1
}

# check NAME COMMAND...: passes if the command succeeds.
check() {
  local name="$1"; shift
  checks=$((checks + 1))
  if "$@"; then pass "$name"; else fail "$name"; fi
}

# run_for_message NAME N MESSAGE ARGS...: counts a check and runs ddp-train ARGS on N ranks for
# 60 s at most; fails it (returning 1) when the run hung or MESSAGE is not in its output.
run_for_message() {
  local name="$1" n="$2" message="$3"; shift 3
  checks=$((checks + 1))
  run_ranks "$n" 60 "$@"
  if ((rc == 124)); then fail "$name: hung (killed after 60 s)"; return 1; fi
  if ! grep -qF -- "$message" <<<"$out"; then
    fail "$name: message '$message' not in output:"; echo "$out" | tail -8; return 1
  fi
}

# expect_error NAME N MESSAGE ARGS...: the run must fail within 60 s with MESSAGE in the
# output, every rank exiting 1 by itself and mpiexec returning 1.
expect_error() {
  local name="$1" n="$2"
  run_for_message "$@" || return
  local expected
  expected="$(printf '1 %.0s' $(seq "$n"))"
  if ((rc != 1)) || [[ "$rank_codes" != "$expected" ]]; then
    fail "$name: mpiexec $rc, rank codes '$rank_codes' (expected 1 everywhere)"
    echo "$out" | tail -8; return
  fi
  pass "$name (${elapsed}s, rank codes: $rank_codes)"
}

# stalled_rank_check LABEL TIMEOUT_S DIR [RANKS] [VICTIM]: RANKS ranks (2) train the seed
# config endlessly with distributed.timeout_s=TIMEOUT_S (output in DIR, log in DIR.log); once
# training runs, rank VICTIM (1) is stopped with SIGSTOP. The job must end non-zero within
# TIMEOUT_S + 10 s plus the hang analysis' wait for the stopped rank's record (TIMEOUT_S, at
# most 10 s), naming the collective that did not complete, with the rank that prints the hang
# analysis exiting 76 (a lost peer) by itself and the launcher returning 76; the hang analysis
# must name the victim, and `ddp-train analyze DIR` must give the same verdict from the records
# the others left.
stalled_rank_check() {
  local label="$1" timeout_s="$2" dir="$3" ranks="${4:-2}" victim_rank="${5:-1}" victim=""
  local start rc grace limit reporter=0
  grace=$((timeout_s < 10 ? timeout_s : 10))
  limit=$((timeout_s + 10 + grace))
  ((victim_rank == 0)) && reporter=1
  checks=$((checks + 1))
  start_ranks "$ranks" "$dir.log" --config "$DDP_SOURCE_DIR/configs/seed.yaml" \
    --set "output.dir=$dir" --set training.epochs=1000000 --set training.log_every=0 \
    --set distributed.timeout_s="$timeout_s"
  for _ in $(seq 1 150); do
    victim="$(rank_pid "output.dir=$dir" "$victim_rank")"
    [[ -n "$victim" ]] && grep -q '^model:' "$dir.log" && break
    sleep 0.2
  done
  if [[ -z "$victim" ]]; then
    fail "$label: rank $victim_rank never started"; kill "$launcher" 2>/dev/null; return
  fi
  sleep 1
  kill -STOP "$victim"
  start=$SECONDS
  launcher_done() { ! kill -0 "$launcher" 2>/dev/null; }
  if ! wait_until "$limit" launcher_done; then
    fail "$label: the job still runs $((SECONDS - start)) s after rank $victim_rank stopped"
    kill -CONT "$victim"; kill "$launcher"; wait "$launcher" 2>/dev/null
    return
  fi
  wait "$launcher"; rc=$?
  read_rank_codes "$ranks"
  local codes=($rank_codes) verdict printed
  verdict="$(grep -A1 'hang analysis by rank' "$dir.log" | tail -1)"
  # The reporter is the lowest rank whose record was there when it looked: the lowest live rank,
  # or, when that one timed out later (a starved core), the next.
  printed="$(sed -n 's/^ddp-train: hang analysis by rank \([0-9]*\) .*/\1/p' "$dir.log" | head -1)"
  reporter="${printed:-$reporter}"
  if ((rc != 76)); then
    fail "$label: the job exited $rc, expected 76 (a lost peer)"
  elif ! grep -q "did not complete within $timeout_s s" "$dir.log"; then
    fail "$label: no timeout message"; tail -5 "$dir.log"
  elif [[ "${codes[$reporter]}" != 76 ]]; then
    fail "$label: rank $reporter exited '${codes[$reporter]}', expected 76 (codes: $rank_codes)"
  elif [[ "$(grep -c 'hang analysis by rank' "$dir.log")" != 1 ]]; then
    fail "$label: not one hang analysis:"; grep -A6 'hang analysis' "$dir.log"
  elif ! sed -n '/hang analysis by rank/,/^ddp-train: error/p' "$dir.log" |
      grep -q "^  culprit: rank $victim_rank\$"; then
    fail "$label: the hang analysis does not name rank $victim_rank:"; grep -A8 'hang analysis' "$dir.log"
  elif ! "$DDP_TRAIN" analyze "$dir" 2>&1 | grep -qxF -- "${verdict#  }"; then
    fail "$label: ddp-train analyze $dir does not repeat the verdict given at the time:"
    "$DDP_TRAIN" analyze "$dir" 2>&1 | head -8; echo "at the time: $verdict"
  else
    pass "$label: job ended (code $rc, rank codes $rank_codes) $((SECONDS - start))s after rank $victim_rank stopped: ${verdict#  }"
  fi
  kill -CONT "$victim" 2>/dev/null
}

finish() {
  echo "$((checks - failures)) passed, $failures failed"
  ((failures == 0))
}
