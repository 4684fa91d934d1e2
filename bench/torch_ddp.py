#!/usr/bin/python3
"""The PyTorch DDP peer of ddp-train's Fashion-MNIST benchmark: same model, loss, optimizer and
per-rank batch, gloo on CPU, one thread per rank, data in memory, only the training loop timed.
Prints one JSON line. Run it with Debian's /usr/bin/python3 (the one that has python3-torch).

    /usr/bin/python3 bench/torch_ddp.py --world-size 2 --steps 3000
"""
import os

# Before torch (and the BLAS it loads) reads them: one thread per rank, like ddp-train, whose
# parallelism is one rank per core. The spawned ranks inherit these.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import ctypes
import gzip
import json
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
TRAIN_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=1, help="ranks (processes), default 1")
    p.add_argument("--steps", type=int, default=2000, help="timed optimizer steps, default 2000")
    p.add_argument("--warmup", type=int, default=50, help="untimed steps first, default 50")
    p.add_argument("--batch-size", type=int, default=64, help="per rank, default 64")
    p.add_argument("--layers", default="784,256,256,10", help="widths, input first")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0,
                   help="DDP bucket_cap_mb (PyTorch's default 25 puts this ~1 MiB model in one bucket)")
    p.add_argument("--data-dir", default=DEFAULT_DATA)
    p.add_argument("--no-bind", action="store_true",
                   help="do not pin rank r to core r (ddp-run pins ranks to cores)")
    p.add_argument("--plain", action="store_true",
                   help="1 process without DistributedDataParallel: what DDP costs on top of the model")
    p.add_argument("--openblas-core", action="store_true",
                   help="print the kernel family OpenBLAS picks on this machine and exit")
    args = p.parse_args(argv)
    if args.world_size < 1 or args.steps < 1 or args.warmup < 0 or args.batch_size < 1:
        p.error("--world-size, --steps and --batch-size must be >= 1 and --warmup >= 0")
    if args.plain and args.world_size != 1:
        p.error("--plain runs one process: it needs --world-size 1")
    for name in TRAIN_FILES:
        path = os.path.join(args.data_dir, name)
        if not os.path.isfile(path):
            p.error(f"--data-dir: file not found: {os.path.abspath(path)}")
    return args


def read_idx(path):
    """An IDX file (.gz or raw) as a numpy array of its declared shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims}, body has {body.size} bytes")
    return body.reshape(dims)


def load_fashion_mnist(data_dir):
    """The training split as in-memory tensors: X float32 [N, 784] in [0, 1], y int64 [N]."""
    images, labels = (read_idx(os.path.join(data_dir, name)) for name in TRAIN_FILES)
    x = torch.from_numpy(images.reshape(images.shape[0], -1).astype(np.float32) / 255.0)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def make_model(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def loaded_blas():
    """The BLAS shared libraries this process has mapped (after a matmul has run)."""
    libs = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            name = os.path.basename(path)
            if "blas" in name or "mkl" in name:
                libs.add(os.path.realpath(path))
    return sorted(libs)


def openblas_core():
    """The kernel family OpenBLAS chose for this CPU (e.g. 'SkylakeX'; 'Prescott' is its SSE3
    fallback for CPUs it does not know), or None when torch did not load OpenBLAS."""
    torch.ones(2, 2) @ torch.ones(2, 2)  # make sure the BLAS is loaded
    for path in loaded_blas():
        if "openblas" in os.path.basename(path):
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
    return None


def batches(sampler, batch_size):
    """Index tensors of one epoch's batches for this rank, in sampler order."""
    order = torch.tensor(list(sampler), dtype=torch.int64)
    return order.split(batch_size)


def train(rank, args, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if not args.no_bind:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    x_all, y_all = load_fashion_mnist(args.data_dir)
    widths = [int(w) for w in args.layers.split(",")]
    torch.manual_seed(args.seed)
    model = make_model(widths)
    if not args.plain:
        model = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sampler = DistributedSampler(range(x_all.shape[0]), num_replicas=args.world_size, rank=rank,
                                 shuffle=True, seed=args.seed)

    total = args.warmup + args.steps
    step, epoch, samples, loss = 0, 0, 0, None
    t0 = None
    while step < total:
        sampler.set_epoch(epoch)
        for idx in batches(sampler, args.batch_size):
            if step == args.warmup:
                dist.barrier()  # every rank starts the clock together
                t0 = time.perf_counter()
            x, y = x_all[idx], y_all[idx]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            if t0 is not None:
                samples += idx.numel()
            if step == total:
                break
        epoch += 1
    dist.barrier()
    seconds = time.perf_counter() - t0
    if rank == 0:
        # DistributedSampler pads every rank's shard to the same length, so the batches of one
        # step have the same size on every rank.
        results.put({
            "impl": "torch-plain" if args.plain else "torch", "world_size": args.world_size, "steps": args.steps,
            "batch_size": args.batch_size, "samples": samples * args.world_size,
            "seconds": seconds, "samples_per_sec": samples * args.world_size / seconds,
            "final_loss": float(loss.item()), "bucket_cap_mb": args.bucket_cap_mb,
            "torch": torch.__version__, "blas": loaded_blas(), "openblas_core": openblas_core(),
            "threads_per_rank": torch.get_num_threads(), "bound_to_cores": not args.no_bind,
        })
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    args = parse_args(argv)
    if args.openblas_core:
        print(openblas_core())
        return
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(train, args=(args, free_port(), results), nprocs=args.world_size, join=True)
    print(json.dumps(results.get()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
