#!/usr/bin/env bash
# Two hosts without Slurm: network namespaces h1, h2 joined by a veth pair (10.77.x.1/.2), and
# mpirun with a hostfile, starting the remote ranks through an rsh agent that enters the other
# namespace instead of ssh. All MPI traffic crosses the veth; the run must match the one-node
# 4-rank weights and print the two-host layout.
# shellcheck source=tests/cluster/lib.sh
source "$(dirname "$0")/lib.sh"
require_tools ip unshare mpirun
reference_runs

# shellcheck source=tests/cluster/netns.sh
source "$(dirname "$0")/netns.sh"

# Namespace and link names carry this process id, so leftovers or parallel runs cannot clash.
suffix=$(($$ % 10000))
h1="ddp${suffix}a" h2="ddp${suffix}b"
net="10.77.$((suffix % 250))"
subnet="$net.0/24"
CLEANUPS+=("netns_remove $h1 $h2")
netns_pair "$h1" "$h2" "v${suffix}a" "v${suffix}b" "$net" || skip "$NETNS_ERROR"
netns_rsh_agent "$WORK/nsrsh"
printf '%s slots=2\n%s slots=2\n' "$h1" "$h2" >"$WORK/hostfile"
rx_before="$(netns_rx_bytes "$h2" "v${suffix}b")"

if NETNS_TIMEOUT=120 netns_mpirun "$h1" "$WORK/hostfile" "$WORK/nsrsh" "$subnet" -np 4 --mca btl tcp,self \
    -- "$DDP_TRAIN" "${TRAIN_ARGS[@]}" --set output.dir="$WORK/netns" >"$WORK/netns.log" 2>&1; then
  pass "mpirun --hostfile across two namespaces exited 0"
else
  cat "$WORK/netns.log"; fail "mpirun across two namespaces failed"
fi
if grep -q "$h1: ranks 0 1" "$WORK/netns.log" && grep -q "$h2: ranks 2 3" "$WORK/netns.log"; then
  pass "layout: 2 hosts x 2 ranks"
else
  grep "ranks" "$WORK/netns.log"; fail "layout $h1: ranks 0 1 / $h2: ranks 2 3 not printed"
fi
rx_after="$(netns_rx_bytes "$h2" "v${suffix}b")"
# 60 steps x 243 float gradients (~58 KB) go each way, besides the launch's own messages.
if ((rx_after - rx_before > 50000)); then
  pass "traffic over the veth: $((rx_after - rx_before)) bytes received by $h2"
else
  fail "only $((rx_after - rx_before)) bytes crossed the veth"
fi
compare "mpirun 2 hosts x 2 ranks vs 1 node x 4 ranks" "$WORK/ref4/model.safetensors" \
  "$WORK/netns/model.safetensors"
if grep -q "hierarchical allreduce (distributed.hierarchical), 2 nodes x 2 ranks" "$WORK/netns.log"; then
  pass "distributed.hierarchical: auto is on for 2 hosts x 2 ranks"
else
  fail "no hierarchical allreduce line in the log"
fi

# across_hosts NAME SETTING...: the same run with more settings; sets RX to the bytes received.
across_hosts() {
  local name="$1" before args=()
  shift
  for s in "$@"; do args+=(--set "$s"); done
  before="$(netns_rx_bytes "$h2" "v${suffix}b")"
  if NETNS_TIMEOUT=120 netns_mpirun "$h1" "$WORK/hostfile" "$WORK/nsrsh" "$subnet" -np 4 --mca btl tcp,self \
      -- "$DDP_TRAIN" "${TRAIN_ARGS[@]}" --set output.dir="$WORK/$name" "${args[@]}" >"$WORK/$name.log" 2>&1; then
    pass "$name: exited 0"
  else
    cat "$WORK/$name.log"; fail "$name: failed"
  fi
  RX=$(($(netns_rx_bytes "$h2" "v${suffix}b") - before))
}
across_hosts flat distributed.hierarchical=off
grep -q "hierarchical allreduce" "$WORK/flat.log" && fail "flat: a hierarchical line in the log" || pass "flat: no hierarchy"
compare "flat MPI_Allreduce across 2 hosts vs 1 node x 4 ranks" "$WORK/ref4/model.safetensors" \
  "$WORK/flat/model.safetensors"
# A wider model, so that gradients, not message headers, are most of what crosses: bf16 sends
# half the bytes of float32.
wide=model.layers=[20,2000,3]
across_hosts wide_fp32 "$wide"
fp32_rx=$RX
across_hosts wide_bf16 "$wide" distributed.compression=bf16
if ((RX * 2 < fp32_rx * 11 / 10)); then
  pass "bf16: $RX bytes received by $h2, float32 $fp32_rx"
else
  fail "bf16: $RX bytes received by $h2, not about half of float32's $fp32_rx"
fi
finish
