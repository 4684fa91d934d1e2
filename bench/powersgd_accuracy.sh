#!/usr/bin/env bash
# powersgd_accuracy.sh: Fashion-MNIST test accuracy trained with float32 gradients and with
# PowerSGD (distributed.compression: powersgd) of each factor rank, at each world size and seed
# on this machine (mpirun, one node); prints one markdown table of the mean test accuracy over
# the seeds and the largest gap of a seed to float32's. Models: fashion is
# configs/fashion_mnist_adamw.yaml (784-256-256-10, 10 epochs, AdamW, cosine schedule,
# clipping), wide the same with 784-1024-1024-10, sgd is configs/fashion_mnist.yaml (3 epochs of
# SGD with momentum: bench/torch_powersgd_accuracy.py's PyTorch peer).
#   bench/powersgd_accuracy.sh OUTDIR [--models "fashion wide sgd"] [--ranks "1 2 4"]
#                              [--seeds "0 1 2"] [--factor-ranks "1 2 4"] [--run-timeout S]
# ddp-train: $DDP_TRAIN, else build/ddp-train. Each run's log and metrics stay in OUTDIR.
set -euo pipefail

usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
train="${DDP_TRAIN:-$root/build/ddp-train}"
out="${1:-}"
[[ -n "$out" && "$out" != -* ]] || usage
shift
models="fashion wide sgd"; ranks_list="1 2 4"; seeds="0 1 2"; factor_ranks="1 2 4"; run_timeout=900
while (($#)); do
  case "$1" in
    --models) models="${2:?--models needs a list}"; shift 2 ;;
    --ranks) ranks_list="${2:?--ranks needs a list}"; shift 2 ;;
    --seeds) seeds="${2:?--seeds needs a list}"; shift 2 ;;
    --factor-ranks) factor_ranks="${2:?--factor-ranks needs a list}"; shift 2 ;;
    --run-timeout) run_timeout="${2:?--run-timeout needs seconds}"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "powersgd_accuracy.sh: unknown argument $1" >&2; usage ;;
  esac
done
for v in $ranks_list $factor_ranks "$run_timeout"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "powersgd_accuracy.sh: expected a positive integer, got '$v'" >&2; exit 2; }
done
for s in $seeds; do
  [[ "$s" =~ ^[0-9]+$ ]] || { echo "powersgd_accuracy.sh: a seed is a non-negative integer, got '$s'" >&2; exit 2; }
done
[[ -x "$train" ]] || { echo "powersgd_accuracy.sh: ddp-train not found at $train (build it)" >&2; exit 2; }
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

model_args() {  # model_args NAME: the config and --set arguments of a model
  case "$1" in
    fashion) echo "--config $root/configs/fashion_mnist_adamw.yaml" ;;
    wide) echo "--config $root/configs/fashion_mnist_adamw.yaml --set model.layers=[784,1024,1024,10]" \
               "--set distributed.bucket_cap_mb=25 --set distributed.first_bucket_mb=1" ;;
    sgd) echo "--config $root/configs/fashion_mnist.yaml" ;;
    *) echo "powersgd_accuracy.sh: unknown model '$1' (fashion, wide, sgd)" >&2; exit 2 ;;
  esac
}
for model in $models; do model_args "$model" >/dev/null; done

for model in $models; do
  sets=$(model_args "$model")
  for n in $ranks_list; do
    for seed in $seeds; do
      for path in none $factor_ranks; do
        dir="$out/$model-n$n-s$seed-$path"
        args=($sets --set training.seed="$seed"
              --set training.log_every=0 --set output.save_model=false --set output.dir="$dir")
        [[ "$path" == none ]] || args+=(--set distributed.compression=powersgd
                                        --set distributed.powersgd_rank="$path")
        timeout "$run_timeout" mpirun -n "$n" --oversubscribe --bind-to none "$train" "${args[@]}" \
          >"$dir.log" 2>&1 || { echo "powersgd_accuracy.sh: run failed, see $dir.log" >&2; exit 1; }
        echo "$model ranks $n seed $seed ${path/#[0-9]*/powersgd r$path}: $(grep -o 'test accuracy [0-9.]*%' "$dir.log")"
      done
    done
  done
done

python3 - "$out" "$models" "$ranks_list" "$seeds" "$factor_ranks" <<'PY'
import json, sys
out, models, ranks, seeds, factors = sys.argv[1], *[a.split() for a in sys.argv[2:]]

def accuracy(model, n, seed, path):
    acc = None
    with open(f"{out}/{model}-n{n}-s{seed}-{path}/metrics.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "eval":
                acc = 100.0 * r["accuracy"]
    return acc

print("| model | ranks | float32 | " + " | ".join(f"PowerSGD r={r}" for r in factors) + " |")
print("|---|---|---|" + "---|" * len(factors))
for model in models:
    for n in ranks:
        base = {s: accuracy(model, n, s, "none") for s in seeds}
        cells = []
        for r in factors:
            accs = {s: accuracy(model, n, s, r) for s in seeds}
            worst = max(base[s] - accs[s] for s in seeds)
            cells.append(f"{sum(accs.values()) / len(seeds):.2f} ({worst:+.2f})")
        mean = sum(base.values()) / len(seeds)
        print(f"| {model} | {n} | {mean:.2f} | " + " | ".join(cells) + " |")
print(f"\nMean test accuracy (%) over seeds {', '.join(seeds)}; in brackets the largest gap of a "
      "seed: float32's accuracy less PowerSGD's for the same seed (positive: PowerSGD is below).")
PY
