"""Our training against PyTorch on the same model, data, initial weights and batches.

Writes a CSV data set and PyTorch-initialised weights, runs ddp-train on N ranks (per-rank
batch B, no shuffle: global batch k is samples [kNB, (k+1)NB)), trains the same nn.Sequential
with the same torch.optim optimizer on batches of N*B in that order, and compares the final
weights, for each case (SGD with Nesterov momentum and weight decay; Adam with L2 weight decay;
AdamW with and without AMSGrad; each lr schedule after a warmup, with gradient clipping), and
the learning rate and gradient norm of every step.
Exit 77 (skipped) when torch is not importable; 0 when the weights agree; 1 otherwise."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

try:
    import numpy as np
    import torch
except ImportError as e:  # reported as a skip by ctest, never as a pass
    print(f"SKIP: PyTorch reference needs python3-torch and python3-numpy ({e})")
    sys.exit(77)

# SequentialLR steps its schedulers with an epoch argument at the milestones (torch 1.13).
warnings.filterwarnings("ignore", message="The epoch parameter")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402


STEPS = 50  # 5 epochs of 10 steps


def warmup_then(after, warmup, start_factor):
    """torch's composition of a linear warmup and a schedule after it (scheduler.* in ddp)."""
    def make(opt):
        first = torch.optim.lr_scheduler.LinearLR(opt, start_factor=start_factor,
                                                  end_factor=1.0, total_iters=warmup)
        return torch.optim.lr_scheduler.SequentialLR(opt, [first, after(opt)],
                                                     milestones=[warmup])
    return make


def cosine(total, warmup, min_lr):
    return lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(
        opt, T_max=total - warmup, eta_min=min_lr)


def linear_decay(total, warmup, lr, min_lr):
    return lambda opt: torch.optim.lr_scheduler.LinearLR(
        opt, start_factor=1.0, end_factor=min_lr / lr, total_iters=total - warmup)


def step_decay(step_size, gamma):
    return lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=step_size, gamma=gamma)


class Case:
    """One comparison: ddp-train's optimizer (and scheduler, clipping) sections and torch's
    same, with the largest |w_ddp - w_torch| accepted. SGD's tolerance is looser: its updates
    are lr times the gradient, so a last-bit difference in a GEMM's summation order carries
    into the weights at full size, while Adam's normalised update damps it."""

    def __init__(self, optimizer, torch_optimizer, torch_args, tolerance, scheduler="",
                 torch_scheduler=None, clip=0.0):
        self.optimizer, self.torch_optimizer, self.torch_args = optimizer, torch_optimizer, \
            torch_args
        self.tolerance, self.scheduler, self.torch_scheduler = tolerance, scheduler, \
            torch_scheduler
        self.clip = clip


CASES = {
    "sgd": Case("{lr: 0.05, momentum: 0.9, weight_decay: 0.01, nesterov: true}",
                torch.optim.SGD,
                dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True),
                1e-5),
    "adam": Case("{name: adam, lr: 0.01, weight_decay: 0.01}", torch.optim.Adam,
                 dict(lr=0.01, weight_decay=0.01), 1e-6),
    "adamw": Case("{name: adamw, lr: 0.01, weight_decay: 0.1}", torch.optim.AdamW,
                  dict(lr=0.01, weight_decay=0.1), 1e-6),
    "adamw_amsgrad": Case("{name: adamw, lr: 0.01, weight_decay: 0.01, amsgrad: true}",
                          torch.optim.AdamW, dict(lr=0.01, weight_decay=0.01, amsgrad=True),
                          1e-6),
    # Schedules, each after a warmup, and clipping that clips on some steps and not others.
    "adamw_cosine_clip": Case(
        "{name: adamw, lr: 0.02, weight_decay: 0.05}", torch.optim.AdamW,
        dict(lr=0.02, weight_decay=0.05), 1e-6,
        "{name: cosine, warmup_steps: 8, warmup_start_factor: 0.1, min_lr: 0.001}",
        warmup_then(cosine(STEPS, 8, 0.001), 8, 0.1), clip=0.35),
    "adam_amsgrad_linear_clip": Case(
        "{name: adam, lr: 0.01, amsgrad: true}", torch.optim.Adam,
        dict(lr=0.01, amsgrad=True), 1e-6,
        "{name: linear, warmup_steps: 5, min_lr: 0.0005}",
        warmup_then(linear_decay(STEPS, 5, 0.01, 0.0005), 5, 1 / 3), clip=0.35),
    "sgd_step_clip": Case(
        "{lr: 0.1, momentum: 0.9}", torch.optim.SGD, dict(lr=0.1, momentum=0.9), 1e-5,
        "{name: step, warmup_steps: 4, warmup_start_factor: 0.25, step_size: 12, gamma: 0.5}",
        warmup_then(step_decay(12, 0.5), 4, 0.25), clip=0.35),
    "adamw_constant_warmup": Case(
        "{name: adamw, lr: 0.01, weight_decay: 0.01}", torch.optim.AdamW,
        dict(lr=0.01, weight_decay=0.01), 1e-6, "{warmup_steps: 10, warmup_start_factor: 0.5}",
        warmup_then(lambda opt: torch.optim.lr_scheduler.ConstantLR(opt, 1.0, 0), 10, 0.5)),
}


def make_model(layers):
    mods = []
    for i in range(len(layers) - 1):
        mods.append(torch.nn.Linear(layers[i], layers[i + 1]))
        if i + 2 < len(layers):
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def run_case(name, args, work, layers, x, y, init, tensors):
    """ddp-train and torch on one optimizer case; returns True when they agree."""
    case = CASES[name]
    ranks, batch, epochs = args.ranks, args.batch, 5
    samples = len(x)
    csv = os.path.join(work, "data.csv")
    config = os.path.join(work, f"{name}.yaml")
    with open(config, "w") as f:
        f.write(f"""model: {{layers: {layers}, init_from: {init}}}
data: {{format: csv, train: {{path: {csv}}}, shuffle: false}}
optimizer: {case.optimizer}
scheduler: {case.scheduler or "{}"}
training: {{epochs: {epochs}, batch_size: {batch}, log_every: 1, clip_grad_norm: {case.clip}}}
distributed: {{first_bucket_mb: 0.001, bucket_cap_mb: 0.002}}
output: {{dir: {work}/{name}}}
""")
    cmd = [args.mpiexec, "-n", str(ranks), "--oversubscribe", args.ddp_train, "--config", config]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        print(run.stdout, run.stderr)
        print(f"FAIL {name}: ddp-train exited {run.returncode}")
        return False
    ours = safetensors_io.load(os.path.join(work, name, "model.safetensors"))
    with open(os.path.join(work, name, "metrics.jsonl")) as f:
        logged = [r for r in map(json.loads, f) if r["type"] == "train"]

    torch.manual_seed(0)
    model = make_model(layers)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for i, lin in enumerate(linears):
            lin.weight.copy_(torch.from_numpy(tensors[f"layers.{i}.weight"]))
            lin.bias.copy_(torch.from_numpy(tensors[f"layers.{i}.bias"]))
    optimizer = case.torch_optimizer(model.parameters(), **case.torch_args)
    scheduler = case.torch_scheduler(optimizer) if case.torch_scheduler else None
    loss_fn = torch.nn.CrossEntropyLoss()
    lrs, norms = [], []
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    global_batch = ranks * batch
    for _ in range(epochs):
        for k in range(samples // global_batch):
            sl = slice(k * global_batch, (k + 1) * global_batch)
            optimizer.zero_grad()
            loss_fn(model(xt[sl]), yt[sl]).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(
                model.parameters(), case.clip if case.clip > 0 else float("inf"))))
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if scheduler:
                scheduler.step()

    worst, moved = 0.0, 0.0
    for i, lin in enumerate(linears):
        for kind, param in (("weight", lin.weight), ("bias", lin.bias)):
            key = f"layers.{i}.{kind}"
            ref = param.detach().numpy()
            assert ours[key].shape == ref.shape, f"{key}: shape {ours[key].shape} vs {ref.shape}"
            worst = max(worst, float(np.abs(ours[key] - ref).max()))
            moved = max(moved, float(np.abs(ref - tensors[key]).max()))
    print(f"{name}: torch {torch.__version__}, {ranks} ranks x batch {batch}, "
          f"{epochs * samples // global_batch} steps: max |w_ddp - w_torch| = {worst:.3g} "
          f"(weights moved up to {moved:.3g}, tolerance {case.tolerance:g})")
    if moved < 1e-2:
        print(f"FAIL {name}: the weights barely moved; the comparison would prove nothing")
        return False
    if worst > case.tolerance:
        print(f"FAIL {name}: weights differ from PyTorch's by more than {case.tolerance:g}")
        return False
    return compare_steps(name, case, logged, lrs, norms)


def compare_steps(name, case, logged, lrs, norms):
    """Per step: the lr equal to torch's scheduler's (torch chains factors step by step, ours is
    the closed form torch's own _get_closed_form_lr gives: 1e-12 relative covers the rounding),
    the gradient norm within 1e-5 of torch's float32 norm, and clipping that clipped."""
    if len(logged) != len(lrs):
        print(f"FAIL {name}: {len(logged)} progress records for {len(lrs)} steps")
        return False
    lr_error = max(abs(r["lr"] - lr) / lr for r, lr in zip(logged, lrs))
    norm_error = max(abs(r["grad_norm"] - n) / n for r, n in zip(logged, norms))
    clipped = sum(n > case.clip for n in norms) if case.clip > 0 else 0
    print(f"  per step: lr max relative error {lr_error:.2g} ({min(lrs):.3g} to {max(lrs):.3g}), "
          f"grad norm {norm_error:.2g}; clipped on {clipped} of {len(norms)} steps")
    ok = lr_error <= 1e-12 and norm_error <= 1e-5
    if case.clip > 0 and not 0 < clipped < len(norms):
        print(f"FAIL {name}: clip_grad_norm {case.clip} should clip on some steps, not all")
        ok = False
    if not ok:
        print(f"FAIL {name}: per-step lr or gradient norm differs from torch's")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddp-train", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--layers", default="13,32,24,7",
                    help="the MLP's widths; wide ones take the CPU's oneDNN GEMMs, narrow ones Eigen's")
    ap.add_argument("--batch", type=int, default=8, help="per rank")
    ap.add_argument("--case", action="append", choices=sorted(CASES),
                    help="an optimizer case (repeatable); default: every case")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = [int(w) for w in args.layers.split(",")]
    samples = args.ranks * args.batch * 10  # 10 steps per epoch, no padding
    rng = np.random.default_rng(1)
    x = rng.standard_normal((samples, layers[0])).astype(np.float32)
    y = rng.integers(0, layers[-1], samples)
    linears = [m for m in make_model(layers) if isinstance(m, torch.nn.Linear)]

    failed = []
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "data.csv"), "w") as f:
            for row, label in zip(x, y):
                f.write(",".join(repr(float(v)) for v in row) + f",{label}\n")
        init = os.path.join(work, "init.safetensors")
        tensors = {}
        for i, lin in enumerate(linears):
            tensors[f"layers.{i}.weight"] = lin.weight.detach().numpy().copy()
            tensors[f"layers.{i}.bias"] = lin.bias.detach().numpy().copy()
        safetensors_io.save(init, tensors)
        cases = args.case or list(CASES)
        for name in cases:
            if not run_case(name, args, work, layers, x, y, init, tensors):
                failed.append(name)
    print(f"{len(cases) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
