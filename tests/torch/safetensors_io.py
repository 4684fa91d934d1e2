"""Minimal safetensors reader/writer (F32 only) on numpy, so the PyTorch checks need nothing
beyond Debian's python3-torch and python3-numpy."""
import json
import struct

import numpy as np


def save(path, tensors):
    """tensors: dict name -> float32 numpy array, written in insertion order."""
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load(path):
    """Returns dict name -> float32 numpy array."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", f"{path}: {name} has dtype {info['dtype']}"
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"]).copy()
    return out
