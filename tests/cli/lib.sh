# Helpers for the end-to-end tests: run ddp-train under mpiexec with a time limit, record every
# rank's exit code, and check messages. Sourced by tests/cli/test_*.sh (run by ctest).
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

# run_ranks N LIMIT_S ARGS...: runs ddp-train ARGS on N ranks; sets $out (stdout+stderr), $rc
# (mpiexec's code), $rank_codes (each rank's own exit code, space-separated) and $elapsed.
run_ranks() {
  local n="$1" limit="$2"; shift 2
  rm -f "$WORK"/rc.*
  local start=$SECONDS
  out="$(timeout "$limit" "$DDP_MPIEXEC" -n "$n" --oversubscribe bash -c \
    '"$0" "$@"; code=$?; echo $code > "'"$WORK"'/rc.${OMPI_COMM_WORLD_RANK:-0}"; exit $code' \
    "$DDP_TRAIN" "$@" 2>&1)"
  rc=$?
  elapsed=$((SECONDS - start))
  rank_codes=""
  for ((r = 0; r < n; ++r)); do
    rank_codes+="$(cat "$WORK/rc.$r" 2>/dev/null || echo missing) "
  done
}

# expect_error NAME N MESSAGE ARGS...: the run must fail on every rank, within 60 s, and the
# output must contain MESSAGE.
expect_error() {
  local name="$1" n="$2" message="$3"; shift 3
  checks=$((checks + 1))
  run_ranks "$n" 60 "$@"
  if ((rc == 124)); then fail "$name: hung (killed after 60 s)"; return; fi
  if ((rc == 0)); then fail "$name: exited 0"; echo "$out" | tail -5; return; fi
  local code
  for code in $rank_codes; do
    if [[ "$code" == 0 ]]; then fail "$name: a rank exited 0 (codes: $rank_codes)"; return; fi
  done
  if ! grep -qF -- "$message" <<<"$out"; then
    fail "$name: message '$message' not in output:"; echo "$out" | tail -8; return
  fi
  pass "$name (${elapsed}s, rank codes: $rank_codes)"
}

finish() {
  echo "$((checks - failures)) passed, $failures failed"
  ((failures == 0))
}
