# background_load.sh: sourced by the benchmarks that measure under load. start_load N starts N
# CPU-bound programs (`sh -c 'while :; do :; done'`, nice 0) in the caller's session;
# stop_load ends them. The caller's EXIT trap must call stop_load.
load_pids=()
stop_load() {
  if ((${#load_pids[@]})); then
    kill "${load_pids[@]}" 2>/dev/null || true
    wait "${load_pids[@]}" 2>/dev/null || true
  fi
  load_pids=()
}
start_load() {  # count
  local i
  for ((i = 0; i < $1; i++)); do
    sh -c 'while :; do :; done' &
    load_pids+=("$!")
  done
}
