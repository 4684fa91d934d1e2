"""Our training against PyTorch on the same model, data, initial weights and batches.

Writes a CSV data set and PyTorch-initialised weights, runs ddp-train on N ranks (per-rank
batch B, no shuffle: global batch k is samples [kNB, (k+1)NB)), trains the same nn.Sequential
with torch.optim.SGD on batches of N*B in that order, and compares the final weights.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddp-train", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = [13, 32, 24, 7]
    ranks, batch, epochs = args.ranks, 8, 3
    samples = ranks * batch * 10  # 10 steps per epoch, no padding
    rng = np.random.default_rng(1)
    x = rng.standard_normal((samples, layers[0])).astype(np.float32)
    y = rng.integers(0, layers[-1], samples)
    opt = dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True)

    mods = []
    for i in range(len(layers) - 1):
        mods.append(torch.nn.Linear(layers[i], layers[i + 1]))
        if i + 2 < len(layers):
            mods.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*mods)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]

    with tempfile.TemporaryDirectory() as work:
        csv = os.path.join(work, "data.csv")
        with open(csv, "w") as f:
            for row, label in zip(x, y):
                f.write(",".join(repr(float(v)) for v in row) + f",{label}\n")
        init = os.path.join(work, "init.safetensors")
        tensors = {}
        for i, lin in enumerate(linears):
            tensors[f"layers.{i}.weight"] = lin.weight.detach().numpy().copy()
            tensors[f"layers.{i}.bias"] = lin.bias.detach().numpy().copy()
        safetensors_io.save(init, tensors)
        config = os.path.join(work, "run.yaml")
        with open(config, "w") as f:
            f.write(f"""model: {{layers: {layers}, init_from: {init}}}
data: {{format: csv, train: {{path: {csv}}}, shuffle: false}}
optimizer: {{lr: {opt['lr']}, momentum: {opt['momentum']}, weight_decay: {opt['weight_decay']}, nesterov: true}}
training: {{epochs: {epochs}, batch_size: {batch}, log_every: 0}}
distributed: {{first_bucket_mb: 0.001, bucket_cap_mb: 0.002}}
output: {{dir: {work}/out}}
""")
        cmd = [args.mpiexec, "-n", str(ranks), "--oversubscribe", args.ddp_train, "--config", config]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            print(run.stdout, run.stderr)
            print(f"FAIL: ddp-train exited {run.returncode}")
            return 1
        ours = safetensors_io.load(os.path.join(work, "out", "model.safetensors"))

    sgd = torch.optim.SGD(model.parameters(), **opt)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    global_batch = ranks * batch
    for _ in range(epochs):
        for k in range(samples // global_batch):
            sl = slice(k * global_batch, (k + 1) * global_batch)
            sgd.zero_grad()
            loss_fn(model(xt[sl]), yt[sl]).backward()
            sgd.step()

    worst, moved = 0.0, 0.0
    for i, lin in enumerate(linears):
        for kind, param in (("weight", lin.weight), ("bias", lin.bias)):
            name = f"layers.{i}.{kind}"
            ref = param.detach().numpy()
            assert ours[name].shape == ref.shape, f"{name}: shape {ours[name].shape} vs {ref.shape}"
            worst = max(worst, float(np.abs(ours[name] - ref).max()))
            moved = max(moved, float(np.abs(ref - tensors[name]).max()))
    print(f"torch {torch.__version__}, {ranks} ranks x batch {batch}, {epochs * samples // global_batch} steps: "
          f"max |w_ddp - w_torch| = {worst:.3g} (weights moved up to {moved:.3g})")
    if moved < 1e-2:
        print("FAIL: the weights barely moved; the comparison would prove nothing")
        return 1
    if worst > 1e-5:
        print("FAIL: weights differ from PyTorch's by more than 1e-5")
        return 1
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
