#!/usr/bin/python3
"""The PyTorch peer of bench/powersgd_accuracy.sh: Fashion-MNIST test accuracy of an MLP trained
with DistributedDataParallel (gloo, CPU) and its powerSGD_hook of each factor rank, beside plain
allreduce; same model, optimizer (SGD with momentum), per-rank batch, epochs and data scaling
as configs/fashion_mnist.yaml. Prints one JSON line per run and a markdown table.

    /usr/bin/python3 bench/torch_powersgd_accuracy.py --world-size 2 --factor-ranks 1,2,4
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import json
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp import DEFAULT_DATA, batches, free_port, make_model, read_idx  # noqa: E402

TEST_FILES = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
TRAIN_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")


def load(data_dir, files):
    images, labels = (read_idx(os.path.join(data_dir, name)) for name in files)
    x = torch.from_numpy(images.reshape(images.shape[0], -1).astype(np.float32) / 255.0)
    return x, torch.from_numpy(labels.astype(np.int64))


def train(rank, args, factor_rank, port, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.world_size)
    torch.manual_seed(args.seed)
    x, y = load(args.data_dir, TRAIN_FILES)
    model = DistributedDataParallel(make_model([int(w) for w in args.layers.split(",")]),
                                    bucket_cap_mb=args.bucket_cap_mb)
    if factor_rank > 0:
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=factor_rank,
                                       start_powerSGD_iter=args.start_step,
                                       random_seed=args.seed)
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sampler = DistributedSampler(range(len(y)), num_replicas=args.world_size, rank=rank,
                                 shuffle=True, seed=args.seed)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for idx in batches(sampler, args.batch_size):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
    if rank == 0:
        tx, ty = load(args.data_dir, TEST_FILES)
        with torch.no_grad():
            correct = (model.module(tx).argmax(1) == ty).sum().item()
        results.put(100.0 * correct / len(ty))
    dist.barrier()  # no rank tears gloo down under another
    dist.destroy_process_group()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--factor-ranks", default="1,2,4", help="PowerSGD ranks; 0 is plain allreduce")
    p.add_argument("--seeds", default="0")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--layers", default="784,256,256,10")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--start-step", type=int, default=10, help="start_powerSGD_iter")
    p.add_argument("--bucket-cap-mb", type=float, default=0.25)
    p.add_argument("--data-dir", default=DEFAULT_DATA)
    args = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    table = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        args.seed = seed
        for r in [0] + [int(v) for v in args.factor_ranks.split(",")]:
            results = ctx.SimpleQueue()
            mp.start_processes(train, args=(args, r, free_port(), results),
                               nprocs=args.world_size, start_method="spawn")
            acc = results.get()
            table[(seed, r)] = acc
            print(json.dumps({"seed": seed, "powersgd_rank": r, "test_accuracy": acc}), flush=True)
    ranks = [int(v) for v in args.factor_ranks.split(",")]
    print("| seed | allreduce | " + " | ".join(f"powerSGD_hook r={r}" for r in ranks) + " |")
    print("|---|---|" + "---|" * len(ranks))
    for seed in sorted({s for s, _ in table}):
        print(f"| {seed} | {table[(seed, 0)]:.2f} | " +
              " | ".join(f"{table[(seed, r)]:.2f}" for r in ranks) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
