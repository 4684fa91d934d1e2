"""Our training against PyTorch on the same model, data, initial weights and batches.

Writes a CSV data set and PyTorch-initialised weights, runs ddp-train on N ranks (per-rank
batch B, no shuffle: global batch k is samples [kNB, (k+1)NB)), trains the same nn.Sequential
with the same torch.optim optimizer on batches of N*B in that order, and compares the final
weights, for each optimizer case (SGD with Nesterov momentum and weight decay; Adam with L2
weight decay; AdamW with and without AMSGrad).
Exit 77 (skipped) when torch is not importable; 0 when the weights agree; 1 otherwise."""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:  # reported as a skip by ctest, never as a pass
    print(f"SKIP: PyTorch reference needs python3-torch and python3-numpy ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402


# name: (the optimizer section of ddp-train's config, torch's optimizer, its arguments,
# the largest |w_ddp - w_torch| accepted). SGD's tolerance is looser: its updates are lr times
# the gradient, so a last-bit difference in a GEMM's summation order carries into the weights
# at full size, while Adam's normalised update damps it.
CASES = {
    "sgd": ("{lr: 0.05, momentum: 0.9, weight_decay: 0.01, nesterov: true}", torch.optim.SGD,
            dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True), 1e-5),
    "adam": ("{name: adam, lr: 0.01, weight_decay: 0.01}", torch.optim.Adam,
             dict(lr=0.01, weight_decay=0.01), 1e-6),
    "adamw": ("{name: adamw, lr: 0.01, weight_decay: 0.1}", torch.optim.AdamW,
              dict(lr=0.01, weight_decay=0.1), 1e-6),
    "adamw_amsgrad": ("{name: adamw, lr: 0.01, weight_decay: 0.01, amsgrad: true}",
                      torch.optim.AdamW, dict(lr=0.01, weight_decay=0.01, amsgrad=True), 1e-6),
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
    section, torch_optimizer, torch_args, tolerance = CASES[name]
    ranks, batch, epochs = args.ranks, 8, 5
    samples = len(x)
    csv = os.path.join(work, "data.csv")
    config = os.path.join(work, f"{name}.yaml")
    with open(config, "w") as f:
        f.write(f"""model: {{layers: {layers}, init_from: {init}}}
data: {{format: csv, train: {{path: {csv}}}, shuffle: false}}
optimizer: {section}
training: {{epochs: {epochs}, batch_size: {batch}, log_every: 0}}
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

    torch.manual_seed(0)
    model = make_model(layers)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for i, lin in enumerate(linears):
            lin.weight.copy_(torch.from_numpy(tensors[f"layers.{i}.weight"]))
            lin.bias.copy_(torch.from_numpy(tensors[f"layers.{i}.bias"]))
    optimizer = torch_optimizer(model.parameters(), **torch_args)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    global_batch = ranks * batch
    for _ in range(epochs):
        for k in range(samples // global_batch):
            sl = slice(k * global_batch, (k + 1) * global_batch)
            optimizer.zero_grad()
            loss_fn(model(xt[sl]), yt[sl]).backward()
            optimizer.step()

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
          f"(weights moved up to {moved:.3g}, tolerance {tolerance:g})")
    if moved < 1e-2:
        print(f"FAIL {name}: the weights barely moved; the comparison would prove nothing")
        return False
    if worst > tolerance:
        print(f"FAIL {name}: weights differ from PyTorch's by more than {tolerance:g}")
        return False
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddp-train", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--case", action="append", choices=sorted(CASES),
                    help="an optimizer case (repeatable); default: every case")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = [13, 32, 24, 7]
    samples = args.ranks * 8 * 10  # 10 steps per epoch, no padding
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
