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
finish
