#!/usr/bin/env bash
# Two hosts without Slurm: network namespaces h1, h2 joined by a veth pair (10.77.x.1/.2), and
# mpirun with a hostfile, starting the remote ranks through an rsh agent that enters the other
# namespace instead of ssh. All MPI traffic crosses the veth; the run must match the one-node
# 4-rank weights and print the two-host layout.
# shellcheck source=tests/cluster/lib.sh
source "$(dirname "$0")/lib.sh"
require_tools ip unshare mpirun
reference_runs

# Namespace and link names carry this process id, so leftovers or parallel runs cannot clash.
suffix=$(($$ % 10000))
h1="ddp${suffix}a" h2="ddp${suffix}b"
subnet="10.77.$((suffix % 250)).0/24"
ip1="10.77.$((suffix % 250)).1" ip2="10.77.$((suffix % 250)).2"
ip netns add "$h1" 2>/dev/null || skip "cannot create network namespaces here"
CLEANUPS+=("ip netns pids $h1 | xargs -r kill -9; ip netns del $h1")
ip netns add "$h2" || { fail "second namespace"; finish; }
CLEANUPS+=("ip netns pids $h2 | xargs -r kill -9; ip netns del $h2")
# ip netns exec remounts /sys privately: impossible where / is not a mount point (a chroot).
probe="$(ip netns exec "$h1" unshare --uts true 2>&1)" || skip "cannot enter a network namespace here: $probe"
ip link add "v${suffix}a" type veth peer name "v${suffix}b" || skip "cannot create veth links here"
ip link set "v${suffix}a" netns "$h1"
ip link set "v${suffix}b" netns "$h2"
ip -n "$h1" addr add "$ip1/24" dev "v${suffix}a"
ip -n "$h2" addr add "$ip2/24" dev "v${suffix}b"
for h in "$h1" "$h2"; do ip -n "$h" link set lo up; done
ip -n "$h1" link set "v${suffix}a" up
ip -n "$h2" link set "v${suffix}b" up

# Open MPI's rsh launcher calls: agent HOST COMMAND... ; run it inside that host's namespace,
# with its own host name.
cat >"$WORK/nsrsh" <<'AGENT'
#!/bin/bash
host="$1"; shift
exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$0"; exec /bin/sh -c "$1"' "$host" "$*"
AGENT
chmod +x "$WORK/nsrsh"
printf '%s slots=2\n%s slots=2\n' "$h1" "$h2" >"$WORK/hostfile"
rx_before="$(ip -n "$h2" -s link show "v${suffix}b" | awk '/RX:/ {getline; print $1}')"

if timeout 120 ip netns exec "$h1" unshare --uts sh -c "hostname $h1; exec mpirun \
    --hostfile '$WORK/hostfile' -np 4 --mca plm_rsh_agent '$WORK/nsrsh' \
    --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include $subnet --mca btl tcp,self \
    --mca btl_tcp_if_include $subnet \"\$0\" \"\$@\"" "$DDP_TRAIN" "${TRAIN_ARGS[@]}" \
    --set output.dir="$WORK/netns" >"$WORK/netns.log" 2>&1; then
  pass "mpirun --hostfile across two namespaces exited 0"
else
  cat "$WORK/netns.log"; fail "mpirun across two namespaces failed"
fi
if grep -q "$h1: ranks 0 1" "$WORK/netns.log" && grep -q "$h2: ranks 2 3" "$WORK/netns.log"; then
  pass "layout: 2 hosts x 2 ranks"
else
  grep "ranks" "$WORK/netns.log"; fail "layout $h1: ranks 0 1 / $h2: ranks 2 3 not printed"
fi
rx_after="$(ip -n "$h2" -s link show "v${suffix}b" | awk '/RX:/ {getline; print $1}')"
# 60 steps x 243 float gradients (~58 KB) go each way, besides the launch's own messages.
if ((rx_after - rx_before > 50000)); then
  pass "traffic over the veth: $((rx_after - rx_before)) bytes received by $h2"
else
  fail "only $((rx_after - rx_before)) bytes crossed the veth"
fi
compare "mpirun 2 hosts x 2 ranks vs 1 node x 4 ranks" "$WORK/ref4/model.safetensors" \
  "$WORK/netns/model.safetensors"
finish
