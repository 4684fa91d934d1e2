#!/usr/bin/env bash
# gradient_path_bench.sh: how gradients cross nodes, measured on two "nodes" on this machine
# (network namespaces joined by a veth pair, tests/cluster/netns.sh) with the link limited by
# tc's token bucket: per model, layout and rate, the step time and the bytes that crossed the
# link per step of each variant, in the same run, repeats interleaved, medians, against the
# flat float32 allreduce and against a prediction. One markdown table on stdout; logs, metrics
# and results.tsv in OUTDIR.
#   bench/gradient_path_bench.sh OUTDIR [--rates "10gbit 1gbit"] [--per-node "1 2"]
#       [--models "fashion mlp1024 wide"] [--variants "none bf16 fp16 hier hier-bf16 psgd2"]
#       [--repeats R]
#       [--steps-fashion N] [--steps-wide N] [--loads "0 1"] [--set key.path=value ...]
# Variants: none (flat MPI_Allreduce in float32), bf16 and fp16 (distributed.compression),
# hier (distributed.hierarchical: on), hier-bf16 (both); the hierarchical ones need 2 ranks per
# node and are left out at 1; psgdR is distributed.compression: powersgd of factor rank R from
# the first step (powersgd_start_step 0: every measured step compressed); tune is
# distributed.tune: auto with compression none (lossless settings only), tune-bf16 with bf16
# allowed, tune-psgdR with PowerSGD from rank R allowed (start step 0), each chosen at start-up
# and reported beside the best of the sweep's variants that it may choose. Models: fashion is
# bench/fashion_mnist_bench.yaml (784-256-256-10); mlp1024 is 784-1024-1024-10 (1.86 M
# parameters, bench/netns_scaling.sh's wide); wide is 784-4096-4096-10 (20.0 M parameters);
# both with 25 MiB buckets.
# Step time: between the first and the last logged step (startup and the first steps left out).
# Link bytes per step: both directions, from the veth's counters, less a one-step run's (the
# startup's parameter broadcast), over the remaining steps.
# Predictions (docs/scaling.md), from runs other than the one predicted: the same ranks on one
# node give the compute time C (float32 on shared memory) and C16 (compressed there too,
# compression_on_node: the casts and 16-bit sums). With F the flat float32 step and B its link
# bytes at the same rate, communication time is taken as proportional to link bytes:
#   bf16, fp16: C16 + (F - C) / 2
#   hier:       C + (F - C) x 2S / B      (S the model's float32 bytes: each node sends S each way)
#   hier-bf16:  C + (F - C) x S / B
#   psgdR:      Cp + (F - C) x P / B      (Cp: one node with the same PowerSGD, which compresses
#                                          there too; P: its link bytes, fixed by the model)
# --loads: each rate again beside that many busy programs (bench/background_load.sh), rows
# labelled "RATE+Kbusy" (no prediction: the one-node runs are idle).
# Needs root, iproute2, util-linux; builds nothing: $DDP_TRAIN (default build/ddp-train).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${1:?usage: gradient_path_bench.sh OUTDIR [options] (see the header)}"
shift
rates="10gbit 1gbit"; per_nodes="1 2"; models="fashion wide"; variants="none bf16 fp16 hier hier-bf16"
repeats=1; steps_fashion=300; steps_wide=12; loads="0"; extra_sets=()
while (($#)); do
  case "$1" in
    --rates) rates="${2:?}"; shift 2 ;;
    --per-node) per_nodes="${2:?}"; shift 2 ;;
    --models) models="${2:?}"; shift 2 ;;
    --variants) variants="${2:?}"; shift 2 ;;
    --repeats) repeats="${2:?}"; shift 2 ;;
    --steps-fashion) steps_fashion="${2:?}"; shift 2 ;;
    --steps-wide) steps_wide="${2:?}"; shift 2 ;;
    --loads) loads="${2:?}"; shift 2 ;;
    --set) extra_sets+=(--set "${2:?--set needs key.path=value}"); shift 2 ;;
    *) echo "gradient_path_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
train="${DDP_TRAIN:-$root/build/ddp-train}"
[[ -x "$train" ]] || { echo "gradient_path_bench.sh: build ddp-train first (or set DDP_TRAIN)" >&2; exit 2; }
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# variant_sets VARIANT: the settings of a variant, one key=value per line.
variant_sets() {
  case "$1" in
    none) echo distributed.hierarchical=off ;;
    bf16|fp16) printf '%s\n' distributed.hierarchical=off distributed.compression="$1" ;;
    hier) echo distributed.hierarchical=on ;;
    hier-bf16) printf '%s\n' distributed.hierarchical=on distributed.compression=bf16 ;;
    psgd[1-9]*) printf '%s\n' distributed.hierarchical=off distributed.compression=powersgd \
                  distributed.powersgd_rank="${1#psgd}" distributed.powersgd_start_step=0 ;;
    tune) echo distributed.tune=auto ;;
    tune-bf16) printf '%s\n' distributed.tune=auto distributed.compression=bf16 ;;
    tune-psgd[1-9]*) printf '%s\n' distributed.tune=auto distributed.compression=powersgd \
                       distributed.powersgd_rank="${1#tune-psgd}" distributed.powersgd_start_step=0 ;;
    *) echo "gradient_path_bench.sh: unknown variant $1" >&2; exit 2 ;;
  esac
}
for v in $variants; do variant_sets "$v" >/dev/null; done

# shellcheck source=tests/cluster/netns.sh
source "$root/tests/cluster/netns.sh"
# shellcheck source=bench/background_load.sh
source "$here/background_load.sh"
h1=ddpga h2=ddpgb subnet=10.79.0.0/24
trap 'stop_load; netns_remove $h1 $h2' EXIT
netns_remove $h1 $h2
netns_pair $h1 $h2 vga vgb 10.79.0 || { echo "gradient_path_bench.sh: $NETNS_ERROR" >&2; exit 2; }
netns_rsh_agent "$out/nsrsh"

link_bytes() { echo $(($(netns_rx_bytes $h1 vga) + $(netns_rx_bytes $h2 vgb))); }

# train_args MODEL STEPS DIR SETTING...: ddp-train's arguments for one run, into `args`.
train_args() {
  local model="$1" steps="$2" dir="$3" s
  shift 3
  args=(--config "$root/bench/fashion_mnist_bench.yaml" --set training.max_steps="$steps"
        --set training.log_every=$((steps > 4 ? steps / 4 : 1)) --set output.dir="$dir"
        --set output.save_model=false)
  case "$model" in
    fashion) ;;
    mlp1024) args+=(--set "model.layers=[784,1024,1024,10]") ;;
    wide) args+=(--set "model.layers=[784,4096,4096,10]") ;;
    *) echo "gradient_path_bench.sh: unknown model $model" >&2; exit 2 ;;
  esac
  [[ "$model" == fashion ]] ||
    args+=(--set distributed.bucket_cap_mb=25 --set distributed.first_bucket_mb=1)
  for s in "$@"; do args+=(--set "$s"); done
  args+=("${extra_sets[@]}")
}

# one_node PER_NODE MODEL STEPS DIR SETTING...: the same ranks on one node (shared memory).
one_node() {
  local per_node="$1" args
  shift
  train_args "$@"
  mpirun -n $((2 * per_node)) --oversubscribe --bind-to none "$train" "${args[@]}" >"$3.log" 2>&1 ||
    { echo "gradient_path_bench.sh: run failed, see $3.log" >&2; exit 1; }
}

# two_nodes PER_NODE MODEL STEPS DIR SETTING...: one training across the two nodes; prints the
# bytes that crossed the link.
two_nodes() {
  local per_node="$1" dir="$4" args before
  shift
  printf '%s slots=%d\n%s slots=%d\n' $h1 "$per_node" $h2 "$per_node" >"$out/hostfile"
  train_args "$@"
  before=$(link_bytes)
  # The namespaces share this machine's cores, which Open MPI cannot see: waiting ranks yield.
  netns_mpirun $h1 "$out/hostfile" "$out/nsrsh" $subnet -np $((2 * per_node)) --bind-to none \
    --mca mpi_yield_when_idle 1 --mca btl tcp,self,vader -- "$train" "${args[@]}" \
    >"$dir.log" 2>&1 || { echo "gradient_path_bench.sh: run failed, see $dir.log" >&2; exit 1; }
  echo $(($(link_bytes) - before))
}

# Seconds per step between the first and the last logged step of a metrics file.
step_seconds() {
  python3 - "$1" <<'EOF'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "train"]
a, b = steps[0], steps[-1]
print((b["time"] - a["time"]) / (b["global_step"] - a["global_step"]))
EOF
}

steps_of() { if [[ "$1" == wide ]]; then echo "$steps_wide"; else echo "$steps_fashion"; fi; }
# one_node_sets VARIANT: its one-node counterpart (the compute term), or nothing: none itself,
# the 16-bit formats with compression_on_node (the casts and sums without the link), PowerSGD as
# it is (it compresses on one node too).
one_node_sets() {
  case "$1" in
    none) echo distributed.hierarchical=off ;;
    bf16|fp16) printf '%s\n' distributed.compression="$1" distributed.compression_on_node=true ;;
    psgd*|tune*) variant_sets "$1" ;;
  esac
}
results="$out/results.tsv" choices="$out/choices.tsv"
: >"$results"
: >"$choices"
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$results"; }
# record_choice MODEL LAYOUT RATE VARIANT LOG: what distributed.tune: auto chose in that run.
record_choice() {
  [[ "$4" == tune* ]] || return 0
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" \
    "$(sed -n 's/^tune: chose \([^;]*\);.*/\1/p' "$5" | head -n 1)" >>"$choices"
}

for ((rep = 1; rep <= repeats; ++rep)); do
  for per_node in $per_nodes; do
    for model in $models; do
      steps=$(steps_of "$model")
      for fmt in $variants; do
        mapfile -t on_node < <(one_node_sets "$fmt")
        ((${#on_node[@]})) || continue
        tag="$model-2x$per_node-one-node-$fmt.r$rep"
        one_node "$per_node" "$model" "$steps" "$out/$tag" "${on_node[@]}"
        record "$model" "2x$per_node" one-node "$fmt" "$(step_seconds "$out/$tag/metrics.jsonl")" 0
        record_choice "$model" "2x$per_node" one-node "$fmt" "$out/$tag.log"
      done
    done
  done
  for rate_load in $(for r in $rates; do for l in $loads; do echo "$r+$l"; done; done); do
    rate="${rate_load%+*}" load="${rate_load#*+}"
    label="$rate"; ((load == 0)) || label="$rate+${load}busy"
    netns_set_rate $h1 vga "$rate"
    netns_set_rate $h2 vgb "$rate"
    start_load "$load"
    for per_node in $per_nodes; do
      for model in $models; do
        steps=$(steps_of "$model")
        for v in $variants; do
          [[ "$v" == hier* && "$per_node" == 1 ]] && continue
          mapfile -t sets < <(variant_sets "$v")
          tag="$model-2x$per_node-$label-$v"
          one=$(two_nodes "$per_node" "$model" 1 "$out/$tag.one.r$rep" "${sets[@]}")
          all=$(two_nodes "$per_node" "$model" "$steps" "$out/$tag.r$rep" "${sets[@]}")
          sec=$(step_seconds "$out/$tag.r$rep/metrics.jsonl")
          per_step=$(((all - one) / (steps - 1)))
          record "$model" "2x$per_node" "$label" "$v" "$sec" "$per_step"
          record_choice "$model" "2x$per_node" "$label" "$v" "$out/$tag.r$rep.log"
          echo "$tag (repeat $rep): $(awk "BEGIN {printf \"%.1f\", $sec * 1000}") ms/step," \
            "$((per_step / 1000)) kB/step on the link" >&2
        done
      done
    done
    stop_load
  done
done

python3 "$here/gradient_path_report.py" "$results" "$choices"
