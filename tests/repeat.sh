#!/usr/bin/env bash
# Repeats ctest tests N times in a row, for a flaky test: how often does it fail, idle and with
# CPU-bound processes running beside it?
#   tests/repeat.sh [--build DIR] [--load K] N REGEX
# runs `ctest -R REGEX` N times (with K busy processes at normal priority while it does), then
# prints one line per test: runs, failures, and the output of the first failure in a log.
set -uo pipefail
build=build
load=0
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --load) load="$2"; shift 2 ;;
    -*) echo "repeat.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if (($# != 2)) || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: tests/repeat.sh [--build DIR] [--load K] N REGEX" >&2
  exit 2
fi
runs="$1" regex="$2"
[[ -d "$build" ]] || { echo "repeat.sh: no build directory $build" >&2; exit 2; }
mapfile -t names < <(ctest --test-dir "$build" -N -R "$regex" | sed -n 's/^ *Test *#[0-9]*: //p')
((${#names[@]})) || { echo "repeat.sh: no test matches '$regex'" >&2; exit 2; }

busy=()
stop_load() { ((${#busy[@]})) && kill "${busy[@]}" 2>/dev/null; }
trap stop_load EXIT
for ((k = 0; k < load; ++k)); do
  sh -c 'while :; do :; done' &
  busy+=($!)
done

logs="$(mktemp -d "${TMPDIR:-/tmp}/repeat.XXXXXX")"
declare -A failed=()
for name in "${names[@]}"; do failed[$name]=0; done
start=$SECONDS
for ((i = 1; i <= runs; ++i)); do
  for name in "${names[@]}"; do
    log="$logs/$name.$i.log"
    if ctest --test-dir "$build" -R "^${name}\$" --output-on-failure >"$log" 2>&1; then
      rm -f "$log"
    else
      failed[$name]=$((failed[$name] + 1))
      echo "$name: run $i failed ($log)"
    fi
  done
done
status=0
echo "$runs run(s) each, $load busy process(es) beside, $((SECONDS - start)) s:"
for name in "${names[@]}"; do
  echo "  $name: ${failed[$name]} failure(s) in $runs"
  ((failed[$name] == 0)) || status=1
done
((status == 0)) && rmdir "$logs" 2>/dev/null
exit "$status"
