# shellcheck shell=bash
# Helpers for the cluster tests: a real Slurm (munge, slurmctld and two slurmd as nodes n1, n2,
# each in its own UTS namespace) and Open MPI across two network namespaces, all on this machine,
# and cleanup of everything a test started, whatever way it ends. Sourced by tests/cluster/test_*.sh.
# A test exits 77 (ctest: skipped, with the reason) when the machine cannot host the cluster:
# not root, or Slurm, munge, iproute2 or util-linux missing (launch/install-deps --cluster).
set -uo pipefail

: "${DDP_TRAIN:?DDP_TRAIN must point at the ddp-train binary}"
: "${DDP_SOURCE_DIR:?DDP_SOURCE_DIR must point at the source tree}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ddp_cluster.XXXXXX")"
chmod 755 "$WORK"
failures=0
CLEANUPS=()

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
skip() { echo "skipped: $*"; exit 77; }

cleanup() {
  local i
  for ((i = ${#CLEANUPS[@]} - 1; i >= 0; --i)); do eval "${CLEANUPS[i]}" >/dev/null 2>&1; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

finish() {
  if ((failures > 0)); then echo "$failures check(s) failed"; exit 1; fi
  echo "all checks passed"
  exit 0
}

require_tools() {
  ((EUID == 0)) || skip "needs root (daemons, namespaces)"
  local t
  for t in "$@"; do command -v "$t" >/dev/null 2>&1 || skip "$t is not installed (launch/install-deps --cluster)"; done
  /usr/bin/python3 -c "import numpy" 2>/dev/null || skip "Debian's python3-numpy is needed to compare weights"
}

# The training every launcher runs: the seed config, with a learning rate and momentum that move
# the weights enough for a wrong gradient to show. $1: output directory. Further args: --set.
TRAIN_ARGS=(--config "$DDP_SOURCE_DIR/configs/seed.yaml" --set optimizer.lr=0.05
            --set optimizer.momentum=0.9 --set training.epochs=3 --set training.print_shapes=false)

compare() {  # compare LABEL REFERENCE CANDIDATE [--differ] [--tol X]
  local label="$1" ref="$2" got="$3"; shift 3
  if /usr/bin/python3 "$DDP_SOURCE_DIR/tests/cluster/compare_weights.py" --label "$label" "$ref" "$got" "$@"; then
    pass "$label"
  else
    fail "$label"
  fi
}

# The 1 node x 4 ranks run every multi-node run is compared with (the shared-memory allreduce),
# and a 2-rank run that must differ from it (so the comparison can fail).
reference_runs() {
  local mpiexec="${DDP_MPIEXEC:-mpiexec}"
  timeout 120 "$mpiexec" -n 4 --oversubscribe "$DDP_TRAIN" "${TRAIN_ARGS[@]}" \
    --set output.dir="$WORK/ref4" >"$WORK/ref4.log" 2>&1 || { cat "$WORK/ref4.log"; fail "reference run (mpirun -n 4) failed"; finish; }
  timeout 120 "$mpiexec" -n 2 --oversubscribe "$DDP_TRAIN" "${TRAIN_ARGS[@]}" \
    --set output.dir="$WORK/ref2" >"$WORK/ref2.log" 2>&1 || { cat "$WORK/ref2.log"; fail "control run (mpirun -n 2) failed"; finish; }
  compare "control: 2 ranks differ from 4 ranks" "$WORK/ref4/model.safetensors" \
    "$WORK/ref2/model.safetensors" --differ --tol 1e-4
}

# --- munge + Slurm -------------------------------------------------------------------------

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
  [[ -s /etc/munge/munge.key ]] || skip "no /etc/munge/munge.key (install munge)"
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged || skip "munged does not start here"
  CLEANUPS+=("kill \$(cat /run/munge/munged.pid)")
  munge -n | unmunge >/dev/null || skip "munge does not work here"
}

# start_slurm: controller and nodes n1, n2 (2 CPUs each) on loopback, ports picked from this
# process id so concurrent or leftover clusters do not collide. Sets SLURM_CONF.
start_slurm() {
  local d="$WORK/slurm" host port
  host="$(hostname -s)"
  port=$((20000 + ($$ % 20000)))
  mkdir -p "$d/state" "$d/spool/n1" "$d/spool/n2" "$d/tmp/n1" "$d/tmp/n2"
  cat >"$d/slurm.conf" <<CONF
ClusterName=ddpci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
AuthType=auth/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
TmpFS=$d/tmp/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
NodeName=n1 NodeHostname=n1 NodeAddr=127.0.0.1 Port=$((port + 1)) CPUs=2 RealMemory=1000
NodeName=n2 NodeHostname=n2 NodeAddr=127.0.0.1 Port=$((port + 2)) CPUs=2 RealMemory=1000
PartitionName=ci Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF="$d/slurm.conf"
  CLEANUPS+=("stop_slurm '$d'")
  slurmctld -f "$SLURM_CONF" -i || { tail "$d"/*.log; skip "slurmctld does not start here"; }
  local n
  # Each slurmd in its own UTS namespace: the "nodes" need their own host names, or Open MPI
  # takes them for one node and their shared-memory files collide.
  for n in n1 n2; do
    unshare --uts sh -c "hostname $n; exec slurmd -f '$SLURM_CONF' -N $n" || { tail "$d"/*.log; skip "slurmd does not start here"; }
  done
  for ((n = 0; n < 60; ++n)); do
    [[ "$(sinfo -h -N -o %N:%T 2>/dev/null | sort | tr '\n' ' ')" == "n1:idle n2:idle " ]] && return 0
    sleep 0.5
  done
  sinfo -N 2>&1; tail -n 20 "$d"/*.log
  fail "the Slurm nodes did not become idle within 30 s"
  finish
}

stop_slurm() {
  local d="$1" f pid i
  scontrol shutdown 2>/dev/null
  for f in "$d"/slurmctld.pid "$d"/slurmd-n1.pid "$d"/slurmd-n2.pid; do
    [[ -f "$f" ]] || continue
    pid="$(cat "$f")"
    for ((i = 0; i < 20; ++i)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null
  done
  rm -rf /tmp/spmix_appdir_* 2>/dev/null
}

# wait_job JOBID LIMIT_S: polls until the job ends; sets $job_state (COMPLETED, FAILED, ...).
wait_job() {
  local id="$1" limit="$2" start=$SECONDS
  job_state=""
  while ((SECONDS - start < limit)); do
    job_state="$(scontrol show job "$id" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')"
    case "$job_state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE) return 0 ;;
    esac
    sleep 0.5
  done
  scancel "$id" 2>/dev/null
  job_state="TIMEOUT (test limit ${limit}s)"
}
