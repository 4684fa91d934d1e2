#!/usr/bin/python3
"""The PyTorch DDP peer of ddp-train's benchmarks: same model, loss, optimizer and per-rank batch,
data in memory, only the training loop timed. Prints one JSON line.
On CPU (the default): gloo, one thread per rank, Fashion-MNIST from its IDX files; run it with
Debian's /usr/bin/python3 (the one that has python3-torch).
On a GPU (--device cuda): NCCL, rank r on GPU r % device_count, fp32 with TF32 off, CUDA
synchronised around the timed loop; usually with --synthetic N (random data made on the GPU).
--autocast bf16|fp16: forward and loss under torch.autocast(device, dtype=torch.bfloat16|float16)
(16-bit GEMMs, float32 master weights and optimizer), the peer of ddp-train's training.precision;
fp16 (cuda only, as ddp-train refuses it on CPUs) adds a GradScaler with its defaults, as
ddp-train's fp16 turns on loss scaling with the same defaults.

    /usr/bin/python3 bench/torch_ddp.py --world-size 2 --steps 3000
    python3 bench/torch_ddp.py --device cuda --synthetic 60000 --layers 784,4096,4096,10 \
        --batch-size 1024 --lr 0.01 --steps 500 [--plain]
"""
import os

# Before torch (and the BLAS it loads) reads them: one thread per rank, like ddp-train, whose
# parallelism is one rank per core. The spawned ranks inherit these.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import contextlib
import ctypes
import gzip
import json
import socket
import sys
import time
from types import SimpleNamespace

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
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (gloo, default) or cuda (NCCL, rank r on GPU r %% device_count)")
    p.add_argument("--synthetic", type=int, default=0, metavar="N",
                   help="N random samples made on --device (normal features, uniform labels) "
                        "instead of Fashion-MNIST: no file reading and no host-to-device copies")
    p.add_argument("--no-bind", action="store_true",
                   help="do not pin rank r to core r (ddp-run pins ranks to cores)")
    p.add_argument("--plain", action="store_true",
                   help="1 process without DistributedDataParallel: what DDP costs on top of the model")
    p.add_argument("--autocast", choices=("off", "bf16", "fp16"), default="off",
                   help="bf16 | fp16: forward and loss under torch.autocast in bfloat16 | float16, "
                        "fp16 with a GradScaler (cuda only); default off: fp32")
    p.add_argument("--openblas-core", action="store_true",
                   help="print the kernel family OpenBLAS picks on this machine and exit")
    args = p.parse_args(argv)
    if args.world_size < 1 or args.steps < 1 or args.warmup < 0 or args.batch_size < 1:
        p.error("--world-size, --steps and --batch-size must be >= 1 and --warmup >= 0")
    if args.autocast == "fp16" and args.device == "cpu":
        p.error("--autocast fp16 needs --device cuda: ddp-train refuses training.precision fp16 "
                "on CPUs, so there is no CPU run to compare with (use bf16 on the CPU)")
    if args.autocast == "bf16" and args.device == "cpu" and not cpu_bf16_autocast():
        p.error("--autocast bf16: this torch has no CPU autocast (torch.autocast needs 1.10 or later)")
    if args.plain and args.world_size != 1:
        p.error("--plain runs one process: it needs --world-size 1")
    try:
        widths = [int(w) for w in args.layers.split(",")]
    except ValueError:
        p.error(f"--layers: expected comma-separated integers, got '{args.layers}'")
    if len(widths) < 2 or min(widths) < 1:
        p.error(f"--layers: needs at least 2 widths, each >= 1, got '{args.layers}'")
    if args.synthetic < 0:
        p.error("--synthetic must be >= 0")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            p.error("--device cuda: PyTorch sees no CUDA device "
                    f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        if args.world_size > torch.cuda.device_count() and not args.plain:
            p.error(f"--device cuda: NCCL needs one GPU per rank; {args.world_size} ranks, "
                    f"{torch.cuda.device_count()} GPU(s)")
    if args.synthetic:
        if args.synthetic < args.batch_size * args.world_size:
            p.error(f"--synthetic {args.synthetic}: fewer samples than one global batch "
                    f"({args.batch_size} x {args.world_size} ranks)")
        return args
    if widths[0] != 784 or widths[-1] != 10:
        p.error(f"--layers: Fashion-MNIST needs 784 inputs and 10 classes, got '{args.layers}' "
                "(or use --synthetic N)")
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


OPENBLAS_CORENAME_SYMBOLS = ("openblas_get_corename", "openblas_get_corename64_",
                             "scipy_openblas_get_corename", "scipy_openblas_get_corename64_")


def openblas_core():
    """The kernel family OpenBLAS chose for this CPU (e.g. 'SkylakeX'; 'Prescott' is its SSE3
    fallback for CPUs it does not know), or None when torch did not load OpenBLAS."""
    torch.ones(2, 2) @ torch.ones(2, 2)  # make sure the BLAS is loaded
    for path in loaded_blas():
        if "openblas" in os.path.basename(path):
            return openblas_corename(path)
    return None


def openblas_corename(path):
    """What the OpenBLAS library at `path` says its kernel family is. Builds that rename their
    symbols (numpy's scipy-openblas: a prefix and a 64_ suffix) export the query under another
    name, and a build may export none: then 'unknown (...)', never an exception."""
    lib = ctypes.CDLL(path)
    for name in OPENBLAS_CORENAME_SYMBOLS:
        try:
            query = getattr(lib, name)
        except AttributeError:
            continue
        query.restype = ctypes.c_char_p
        return query().decode()
    return f"unknown ({os.path.basename(path)} exports no corename query)"


def batches(sampler, batch_size):
    """Index tensors of one epoch's batches for this rank, in sampler order."""
    order = torch.tensor(list(sampler), dtype=torch.int64)
    return order.split(batch_size)


def make_synthetic(n, widths, device, seed):
    """n samples made on the device itself: normal features and uniform labels."""
    g = torch.Generator(device=device)
    g.manual_seed(seed + 1)
    x = torch.randn(n, widths[0], generator=g, device=device)
    y = torch.randint(0, widths[-1], (n,), generator=g, device=device)
    return x, y


def synthetic_batches(n, batch_size, world_size, rank, epoch, seed, device):
    """This rank's index batches of one epoch, made on the device: a fresh permutation each
    epoch, cut into steps of world_size full batches (the remainder is dropped, so every rank
    takes the same number of steps with the same batch size)."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1000003 + epoch)
    steps = n // (batch_size * world_size)
    order = torch.randperm(n, generator=g, device=device)[:steps * batch_size * world_size]
    return order.view(steps, world_size, batch_size)[:, rank].unbind(0)


def cpu_bf16_autocast():
    """Whether this torch can autocast to bfloat16 on the CPU (torch.autocast, 1.10 and later)."""
    return hasattr(torch, "autocast")


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_context(args):
    """forward and loss under torch.autocast in --autocast's 16-bit type, else nothing."""
    if args.autocast == "off":
        return contextlib.nullcontext()
    return torch.autocast(args.device, dtype=AUTOCAST_DTYPES[args.autocast])


def make_grad_scaler(args):
    """A GradScaler with its defaults for --autocast fp16 (whose small exponent range needs it),
    else None. torch.amp.GradScaler("cuda") where it exists: newer PyTorch deprecates the
    torch.cuda.amp spelling, older PyTorch has only that one."""
    if args.autocast != "fp16":
        return None
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def precision_name(args):
    """The arithmetic of the run, in words, for the JSON line."""
    return {"off": "fp32", "bf16": "bf16 autocast",
            "fp16": "fp16 autocast + GradScaler"}[args.autocast]


def disable_tf32():
    """fp32 matrix products in full fp32 (what ddp-train computes), not TF32. PyTorch 2.9 and
    later have the fp32_precision settings and warn about the older allow_tf32 flags (mixing
    the two is not supported), so each version gets its own."""
    if hasattr(torch.backends, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"  # Linear layers do not use cuDNN; for completeness
        return "fp32_precision=ieee"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return "allow_tf32=False"


def tf32_state():
    """What the process really computes with, as PyTorch reports it."""
    if hasattr(torch.backends, "fp32_precision"):
        return f"matmul fp32_precision={torch.backends.cuda.matmul.fp32_precision}"
    return f"matmul allow_tf32={torch.backends.cuda.matmul.allow_tf32}"


def nccl_version():
    """The NCCL PyTorch loaded, as 'major.minor.patch' (older PyTorch returns one integer)."""
    v = torch.cuda.nccl.version()
    return ".".join(str(part) for part in v) if isinstance(v, tuple) else str(v)


def train(rank, args, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    cuda = args.device == "cuda"
    if not args.no_bind:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already fixed in this process (a rank run in the main process after other work)
    if cuda:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        precision = disable_tf32()
        dist.init_process_group("nccl", rank=rank, world_size=args.world_size)
    else:
        device = torch.device("cpu")
        precision = None
        dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    widths = [int(w) for w in args.layers.split(",")]
    if args.synthetic:
        x_all, y_all = make_synthetic(args.synthetic, widths, device, args.seed)
    else:
        x_all, y_all = (t.to(device) for t in load_fashion_mnist(args.data_dir))
    torch.manual_seed(args.seed)
    model = make_model(widths).to(device)
    if not args.plain:
        model = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb,
                                        device_ids=[device.index] if cuda else None)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    scaler = make_grad_scaler(args)
    sampler = None
    if not args.synthetic:
        sampler = DistributedSampler(range(x_all.shape[0]), num_replicas=args.world_size,
                                     rank=rank, shuffle=True, seed=args.seed)

    def epoch_batches(epoch):
        if sampler is None:
            return synthetic_batches(args.synthetic, args.batch_size, args.world_size, rank,
                                     epoch, args.seed, device)
        sampler.set_epoch(epoch)
        return [idx.to(device) for idx in batches(sampler, args.batch_size)]

    def sync():
        """Every rank's queued GPU work done, then every rank here (a barrier)."""
        if not cuda:
            dist.barrier()
            return
        torch.cuda.synchronize(device)
        if args.world_size > 1:
            dist.barrier(device_ids=[device.index])

    total = args.warmup + args.steps
    step, epoch, samples, loss = 0, 0, 0, None
    t0 = None
    while step < total:
        for idx in epoch_batches(epoch):
            if step == args.warmup:
                sync()  # every rank starts the clock together, with the warm-up finished
                t0 = time.perf_counter()
            x, y = x_all[idx], y_all[idx]
            opt.zero_grad(set_to_none=True)
            with autocast_context(args):
                loss = loss_fn(model(x), y)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            step += 1
            if t0 is not None:
                samples += idx.numel()
            if step == total:
                break
        epoch += 1
    sync()
    seconds = time.perf_counter() - t0
    if rank == 0:
        # DistributedSampler pads every rank's shard to the same length (and synthetic_batches
        # drops the remainder), so the batches of one step have the same size on every rank.
        result = {
            "impl": "torch-plain" if args.plain else "torch", "world_size": args.world_size, "steps": args.steps,
            "batch_size": args.batch_size, "samples": samples * args.world_size,
            "seconds": seconds, "samples_per_sec": samples * args.world_size / seconds,
            "final_loss": float(loss.item()), "bucket_cap_mb": args.bucket_cap_mb,
            "torch": torch.__version__, "blas": loaded_blas(), "openblas_core": openblas_core(),
            "threads_per_rank": torch.get_num_threads(), "bound_to_cores": not args.no_bind,
            "device": args.device, "layers": args.layers, "warmup": args.warmup,
            "precision": precision_name(args),
            "autocast": None if args.autocast == "off" else args.autocast,
            "loss_scale": None if scaler is None else float(scaler.get_scale()),
            "lr": args.lr, "momentum": args.momentum,
            "data": f"synthetic {args.synthetic} on {args.device}" if args.synthetic else "fashion-mnist",
        }
        if cuda:
            result.update({
                "gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda,
                "nccl": nccl_version(),
                "precision": f"{result['precision']} ({precision})", "tf32": tf32_state(),
                "backend": "none (no DDP)" if args.plain else "nccl",
            })
        results.put(result)
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
    if args.world_size == 1:
        # One rank runs in this process: a spawned one would import torch (and start CUDA) a
        # second time, seconds that every run of a benchmark series pays for nothing.
        results = []
        train(0, args, free_port(), SimpleNamespace(put=results.append))
        print(json.dumps(results[0]), flush=True)
        return
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(train, args=(args, free_port(), results), nprocs=args.world_size, join=True)
    print(json.dumps(results.get()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
