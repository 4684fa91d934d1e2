# shellcheck shell=bash
# shellcheck disable=SC2034  # NETNS_ERROR is read by the scripts that source this file
# Two "hosts" on one machine: network namespaces joined by a veth pair, and the rsh agent that
# lets mpirun start ranks inside them. Sourced by tests/cluster/test_netns.sh and
# bench/netns_scaling.sh; needs root, ip (iproute2) and unshare (util-linux).

# netns_pair H1 H2 LINK_A LINK_B NET: namespaces H1 (address NET.1/24 on LINK_A) and H2 (NET.2/24
# on LINK_B), joined by the veth LINK_A-LINK_B, loopback up. NET is three octets ("10.77.3").
# On failure returns 1 with the reason in NETNS_ERROR (what exists by then is left for
# netns_remove).
netns_pair() {
  local h1="$1" h2="$2" a="$3" b="$4" net="$5" out
  NETNS_ERROR=""
  if ! out="$(ip netns add "$h1" 2>&1)"; then NETNS_ERROR="cannot create network namespaces here: $out"; return 1; fi
  if ! out="$(ip netns add "$h2" 2>&1)"; then NETNS_ERROR="second namespace: $out"; return 1; fi
  # ip netns exec remounts /sys privately: impossible where / is not a mount point (a chroot).
  if ! out="$(ip netns exec "$h1" unshare --uts true 2>&1)"; then
    NETNS_ERROR="cannot enter a network namespace here: $out"; return 1
  fi
  if ! out="$(ip link add "$a" type veth peer name "$b" 2>&1)"; then
    NETNS_ERROR="cannot create veth links here: $out"; return 1
  fi
  if ! { ip link set "$a" netns "$h1" && ip link set "$b" netns "$h2" &&
    ip -n "$h1" addr add "$net.1/24" dev "$a" && ip -n "$h2" addr add "$net.2/24" dev "$b" &&
    ip -n "$h1" link set lo up && ip -n "$h2" link set lo up &&
    ip -n "$h1" link set "$a" up && ip -n "$h2" link set "$b" up; }; then
    NETNS_ERROR="configuring the veth failed"
    return 1
  fi
}

# netns_remove H...: kills every process in the namespaces and deletes them (the veth goes too).
netns_remove() {
  local h
  for h in "$@"; do
    { ip netns pids "$h" 2>/dev/null | xargs -r kill -9; } || true
    ip netns del "$h" 2>/dev/null || true
  done
}

# netns_rsh_agent FILE: Open MPI's rsh launcher calls `agent HOST COMMAND...`; this agent runs the
# command inside HOST's namespace, with HOST as its host name.
netns_rsh_agent() {
  cat >"$1" <<'AGENT'
#!/bin/bash
host="$1"; shift
exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$0"; exec /bin/sh -c "$1"' "$host" "$*"
AGENT
  chmod +x "$1"
}

# netns_rx_bytes H LINK: bytes received so far on LINK inside namespace H.
netns_rx_bytes() {
  ip -n "$1" -s link show "$2" | awk '/RX:/ {getline; print $1}'
}

# netns_set_rate H LINK RATE: LINK in namespace H sends at most RATE (tc's rate syntax, "1gbit"),
# through a token bucket with a 256 KB burst; "unlimited" removes the limit.
netns_set_rate() {
  tc -n "$1" qdisc del dev "$2" root 2>/dev/null || true
  [[ "$3" == unlimited ]] || tc -n "$1" qdisc add dev "$2" root tbf rate "$3" burst 256kb latency 50ms
}

# netns_mpirun H1 HOSTFILE AGENT SUBNET [MPIRUN_ARGS...] -- PROGRAM ARGS...: mpirun started in
# H1 (with its host name), remote ranks through AGENT, all MPI traffic on SUBNET; killed after
# NETNS_TIMEOUT seconds when that is set.
netns_mpirun() {
  local h1="$1" hostfile="$2" agent="$3" subnet="$4" mpi_args=() limit=()
  shift 4
  while (($#)) && [[ "$1" != "--" ]]; do mpi_args+=("$1"); shift; done
  shift
  [[ -n "${NETNS_TIMEOUT:-}" ]] && limit=(timeout "$NETNS_TIMEOUT")
  "${limit[@]}" ip netns exec "$h1" unshare --uts sh -c "hostname $h1; exec mpirun --hostfile '$hostfile' \
    --mca plm_rsh_agent '$agent' --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include $subnet \
    --mca btl_tcp_if_include $subnet ${mpi_args[*]} \"\$0\" \"\$@\"" "$@"
}
