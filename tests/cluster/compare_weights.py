"""Compares two model.safetensors files tensor by tensor: prints the largest absolute difference
and exits 1 if it is above --tol (or, with --differ, if it is not above --tol: the check that a
comparison can tell different trainings apart)."""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
import safetensors_io  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("reference")
    parser.add_argument("candidate")
    parser.add_argument("--tol", type=float, default=1e-5)
    parser.add_argument("--differ", action="store_true")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    ref = safetensors_io.load(args.reference)
    got = safetensors_io.load(args.candidate)
    if sorted(ref) != sorted(got):
        print(f"{args.label}: tensor names differ: {sorted(ref)} vs {sorted(got)}")
        return 1
    worst, where = 0.0, ""
    for name in ref:
        if ref[name].shape != got[name].shape:
            print(f"{args.label}: {name} has shape {got[name].shape}, expected {ref[name].shape}")
            return 1
        diff = float(np.max(np.abs(ref[name].astype(np.float64) - got[name])))
        if not np.isfinite(diff):
            print(f"{args.label}: {name} is not finite")
            return 1
        if diff >= worst:
            worst, where = diff, name
    verdict = (worst > args.tol) if args.differ else (worst <= args.tol)
    relation = ">" if args.differ else "<="
    print(f"{args.label}: max |w - w_ref| = {worst:.3g} ({where}); expected {relation} {args.tol:g}: "
          f"{'ok' if verdict else 'FAIL'}")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
