#!/usr/bin/env bash
# launch/ddp-run --max-restarts across two hosts (network namespaces h1, h2, 2 slots each; the
# rsh agent of tests/cluster/netns.sh): once a checkpoint is written, h2's namespace is removed
# with everything in it, mpirun loses its daemon there (exit 205), ddp-run probes both hosts
# through the same agent, leaves h2 out and continues on h1's 2 ranks with twice the
# accumulation steps, so the global batch stays 200. With --min-ranks 3 it stops instead, saying
# why, with mpirun's code. On 3 ranks (h1 2 slots, h2 1) the global batch of 150 cannot be
# kept on 2: --shrink keep-global-batch refuses to restart, keep-rank-batch continues at 100. The ranks of a host talk through shared memory (vader): h2's removal
# takes the veth, and with it h1's end, away.
# shellcheck source=tests/cluster/lib.sh
source "$(dirname "$0")/lib.sh"
require_tools ip unshare mpirun
# shellcheck source=tests/cluster/netns.sh
source "$(dirname "$0")/netns.sh"

suffix=$(($$ % 10000))
net="10.78.$((suffix % 250))"
netns_rsh_agent "$WORK/nsrsh"
# 40 epochs of 10 steps at a global batch of 200 (4 ranks x 50): a checkpoint every 50 steps.
sets=(--set training.epochs=40 --set training.log_every=0 --set training.print_shapes=false
      --set checkpoint.every_steps=50 --set checkpoint.keep_last=0 --set distributed.timeout_s=10)
has_checkpoint() { compgen -G "$1/checkpoints/step-*.safetensors" >/dev/null; }

# run_losing_h2 NAME MIN_RANKS [SLOTS_H2 [DDP_RUN_ARGS...]]: ddp-run on a fresh pair of hosts
# (h1 2 slots, h2 SLOTS_H2, 2 by default; -n all of them), h2 removed after the first
# checkpoint; sets $rc and $log.
run_losing_h2() {
  local name="$1" min="$2" slots2="${3:-2}" runner
  local h1="ddp${suffix}${1:0:1}a" h2="ddp${suffix}${1:0:1}b"
  shift $(($# < 3 ? $# : 3))
  log="$WORK/$name.log"
  CLEANUPS+=("netns_remove $h1 $h2")
  netns_pair "$h1" "$h2" "v${suffix}${name:0:1}a" "v${suffix}${name:0:1}b" "$net" || skip "$NETNS_ERROR"
  printf '%s slots=2\n%s slots=%s\n' "$h1" "$h2" "$slots2" >"$WORK/$name.hosts"
  ip netns exec "$h1" unshare --uts sh -c "hostname $h1; exec \"\$0\" \"\$@\"" \
    timeout 240 "$DDP_SOURCE_DIR/launch/ddp-run" -n $((2 + slots2)) --hostfile "$WORK/$name.hosts" \
    --max-restarts 1 --min-ranks "$min" "$@" "$DDP_SOURCE_DIR/configs/seed.yaml" "${sets[@]}" \
    --set "output.dir=$WORK/$name" -- --mca plm_rsh_agent "$WORK/nsrsh" \
    --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include "$net.0/24" \
    --mca btl_tcp_if_include "$net.0/24" --mca btl vader,tcp,self >"$log" 2>&1 &
  runner=$!
  local i
  for ((i = 0; i < 1200; ++i)); do
    has_checkpoint "$WORK/$name" || ! kill -0 "$runner" 2>/dev/null && break
    sleep 0.1
  done
  has_checkpoint "$WORK/$name" || { fail "$name: no checkpoint within 120 s"; cat "$log"; }
  netns_remove "$h2"
  wait "$runner"; rc=$?
  H1="$h1" H2="$h2"
}

run_losing_h2 shrink 2
if ((rc != 0)); then
  fail "h2 lost, --min-ranks 2: ddp-run exited $rc, expected 0"; grep -v '^epoch' "$log" | tail -20
elif ! grep -q "^ddp-run: host $H2 does not answer" "$log" ||
    ! grep -q "^ddp-run: 2 of 4 ranks: --set training.accumulate_steps=2 keeps the global batch of 200 samples (2 ranks x 50 x 2)$" "$log" ||
    ! grep -q "^ddp-run: attempt 2 of 2 after a lost host (mpirun lost a remote daemon) (exit 205): resuming from the newest checkpoint$" "$log"; then
  fail "h2 lost, --min-ranks 2: the restart is not explained"; grep '^ddp-run' "$log"
elif ! grep -q "^  $H1: ranks 0 1$" "$log" || grep -q "^ddp-train: 2 rank(s) on 2 node" "$log" ||
    ! grep -q "^resume: 4 rank(s) in the checkpoint, 2 now; the global batch stays 200$" "$log" ||
    ! grep -q "^data: .*global batch 200 = 50 per rank x 2 ranks x 2 accumulation step(s)$" "$log" ||
    [[ ! -f "$WORK/shrink/model.safetensors" ]]; then
  fail "h2 lost, --min-ranks 2: not finished on $H1's 2 ranks at the global batch of 200"
  grep -v '^epoch' "$log" | tail -20
else
  pass "h2 lost, --min-ranks 2: $(grep -m1 '^ddp-run: attempt' "$log" | cut -c10-); finished on $H1's 2 ranks, global batch 200 kept"
fi

run_losing_h2 minimum 3
if ((rc != 205)) || grep -q "^ddp-run: attempt" "$log" ||
    ! grep -q "^ddp-run: not restarting after a lost host (mpirun lost a remote daemon) (exit 205): 2 rank(s) left on the hosts that answer, fewer than --min-ranks 3$" "$log"; then
  fail "h2 lost, --min-ranks 3: exit $rc"; grep '^ddp-run' "$log"
else
  pass "h2 lost, --min-ranks 3: exit 205, \"$(grep -m1 '^ddp-run: not restarting' "$log" | cut -c10-)\""
fi
# 2 + 1 ranks: nodes of different sizes, each sharing its copy of the data (data.share_on_node).
run_losing_h2 global 2 1
if ((rc != 205)) || grep -q "^ddp-run: attempt" "$log" ||
    ! grep -q "^ddp-run: cannot keep the global batch of 150 samples (3 ranks x 50 x 1) on 2 ranks: 2 x training.batch_size 50 does not divide it; not restarting (--shrink keep-rank-batch continues with a smaller global batch)$" "$log"; then
  fail "3 ranks, h2 lost: exit $rc"; grep '^ddp-run' "$log"
else
  pass "3 ranks, h2 lost, --shrink keep-global-batch: exit 205, the global batch of 150 does not divide over 2 ranks"
fi

run_losing_h2 rank_batch 2 1 --shrink keep-rank-batch
if ((rc != 0)) ||
    ! grep -q "^ddp-run: 2 of 3 ranks, 50 samples per rank: the global batch shrinks from 150 to 100 samples per step (--shrink keep-rank-batch)$" "$log" ||
    ! grep -q "^warning: the global batch changes from 150 samples per step (3 rank(s) in the checkpoint) to 100" "$log"; then
  fail "3 ranks, h2 lost, keep-rank-batch: exit $rc"; grep '^ddp-run\|^warning\|^resume' "$log"
else
  pass "3 ranks, h2 lost, --shrink keep-rank-batch: finished on 2 ranks at a global batch of 100, said so"
fi
finish
