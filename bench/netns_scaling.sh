#!/usr/bin/env bash
# netns_scaling.sh: two "nodes" on this machine (network namespaces joined by a veth pair),
# the link limited by tc's token bucket to each rate given, and at each rate: the MPI_Allreduce
# sweep (ddp_bench_allreduce) and ddp-train on the Fashion-MNIST MLP and a wider MLP at
# 2 nodes x 2 ranks. Also the same trainings on one node x 4 ranks, for the compute time.
# Writes everything to OUTDIR; bench/scaling_model.py turns it into docs/scaling.md's tables.
#   bench/netns_scaling.sh OUTDIR [--rates "unlimited 10gbit 1gbit"] [--steps N] [--per-node K]
#                          [--repeats R]   (each training R times, interleaved; the model takes
#                                           the median)
#                          [--set key.path=value ...]   (added to every training run, e.g.
#                                           distributed.shard_optimizer=true)
# Needs root, iproute2 (ip, tc with the tbf qdisc), util-linux (unshare); builds nothing:
# $DDP_TRAIN (default build/ddp-train) and $DDP_BENCH_ALLREDUCE (build/bench/ddp_bench_allreduce).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${1:?usage: netns_scaling.sh OUTDIR [--rates LIST] [--steps N]}"
shift
rates="unlimited 10gbit 1gbit"
steps=300
per_node=2
repeats=1
extra_sets=()
while (($#)); do
  case "$1" in
    --rates) rates="${2:?}"; shift 2 ;;
    --steps) steps="${2:?}"; shift 2 ;;
    --per-node) per_node="${2:?}"; shift 2 ;;
    --repeats) repeats="${2:?}"; shift 2 ;;
    --set) extra_sets+=(--set "${2:?--set needs key.path=value}"); shift 2 ;;
    *) echo "netns_scaling.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
train="${DDP_TRAIN:-$root/build/ddp-train}"
allreduce="${DDP_BENCH_ALLREDUCE:-$root/build/bench/ddp_bench_allreduce}"
[[ -x "$train" && -x "$allreduce" ]] || { echo "netns_scaling.sh: build ddp-train and ddp_bench_allreduce first" >&2; exit 2; }
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# shellcheck source=tests/cluster/netns.sh
source "$root/tests/cluster/netns.sh"
h1=ddpsa h2=ddpsb subnet=10.78.0.0/24
trap 'netns_remove $h1 $h2' EXIT
netns_remove $h1 $h2
netns_pair $h1 $h2 vsa vsb 10.78.0 || { echo "netns_scaling.sh: $NETNS_ERROR" >&2; exit 2; }
netns_rsh_agent "$out/nsrsh"
printf '%s slots=%d\n%s slots=%d\n' $h1 "$per_node" $h2 "$per_node" >"$out/hostfile"
ranks=$((2 * per_node))

# The namespaces share this machine's cores, which Open MPI cannot see: ranks must yield the core
# while they wait, or their busy polling starves the others (milliseconds per message).
two_nodes() {  # two_nodes PROGRAM ARGS...: per_node ranks in each namespace, MPI over the veth
  netns_mpirun $h1 "$out/hostfile" "$out/nsrsh" $subnet -np $ranks --bind-to none \
    --mca mpi_yield_when_idle 1 --mca btl tcp,self,vader -- "$@"
}

models=(
  "fashion|$root/bench/fashion_mnist_bench.yaml|"
  "wide|$root/bench/fashion_mnist_bench.yaml|model.layers=[784,1024,1024,10] distributed.bucket_cap_mb=25 distributed.first_bucket_mb=1"
)
run_model() {  # run_model LABEL where(one|two) model-spec repeat
  local label="$1" where="$2" spec="$3" rep="$4" name config extra args=()
  IFS='|' read -r name config extra <<<"$spec"
  for s in $extra; do args+=(--set "$s"); done
  local dir="$out/$label-$name"
  ((rep == 1)) || dir="$dir.r$rep"
  args+=(--config "$config" --set training.max_steps="$steps" --set output.dir="$dir"
         "${extra_sets[@]}")
  if [[ "$where" == one ]]; then
    mpirun -n "$ranks" --oversubscribe --bind-to none "$train" "${args[@]}" >"$dir.log" 2>&1
  else
    two_nodes "$train" "${args[@]}" >"$dir.log" 2>&1
  fi
  echo "$label $name ($rep): $(grep '^done:' "$dir.log")"
}

set_rate() {
  netns_set_rate "$h1" vsa "$rate"
  netns_set_rate "$h2" vsb "$rate"
}

for ((rep = 1; rep <= repeats; ++rep)); do
  for spec in "${models[@]}"; do run_model one-node one "$spec" "$rep"; done
  for rate in $rates; do
    set_rate
    if ((rep == 1)); then
      two_nodes "$allreduce" --min-bytes 4096 --max-bytes $((16 << 20)) --reps 10 >"$out/allreduce-$rate.md" 2>&1
      echo "allreduce at $rate: $(tail -1 "$out/allreduce-$rate.md")"
    fi
    for spec in "${models[@]}"; do run_model "two-nodes-$rate" two "$spec" "$rep"; done
  done
done
