#!/usr/bin/env python3
# Writes the seed corpora under tests/fuzz/corpus/<target>/: a few valid inputs per reader and
# the edge cases a reader must refuse cleanly. Deterministic; rerun after changing a format:
#   python3 tests/fuzz/make_corpus.py
# Files named crash-* (reproducers of past findings) are left alone.
import gzip
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def gz(data):
    return gzip.compress(data, mtime=0)


# --- IDX: a 2-byte little-endian images length, the images file, then the labels file.
def images(n, rows, cols, pixels=None, magic=0x803):
    if pixels is None:
        pixels = bytes((i * 37) % 256 for i in range(n * rows * cols))
    return struct.pack(">IIII", magic, n, rows, cols) + pixels


def labels(values, magic=0x801, count=None):
    return struct.pack(">II", magic, len(values) if count is None else count) + bytes(values)


def pair(img, lbl):
    return struct.pack("<H", len(img)) + img + lbl


def idx():
    img, lbl = images(3, 2, 3), labels([7, 0, 9])
    write("idx", "valid_raw", pair(img, lbl))
    write("idx", "valid_gz", pair(gz(img), gz(lbl)))
    write("idx", "valid_mixed", pair(gz(img), lbl))
    write("idx", "valid_4x4", pair(images(4, 4, 4), labels([0, 1, 2, 255])))
    write("idx", "wrong_magic", pair(images(3, 2, 3, magic=0x12345678), lbl))
    write("idx", "swapped", pair(lbl, img))
    write("idx", "labels_wrong_magic", pair(img, labels([1, 2, 3], magic=0x803)))
    write("idx", "truncated_pixels", pair(img[:-5], lbl))
    write("idx", "truncated_header", pair(img[:10], lbl))
    write("idx", "truncated_labels", pair(img, lbl[:-1]))
    write("idx", "truncated_gz", pair(gz(img)[:-12], lbl))
    write("idx", "count_mismatch", pair(img, labels([1, 2])))
    write("idx", "zero_samples", pair(images(0, 2, 3), labels([])))
    write("idx", "zero_rows", pair(images(3, 0, 3), lbl))
    huge = struct.pack(">IIII", 0x803, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF) + b"\x01" * 8
    write("idx", "huge_dims", pair(huge, labels([], count=0xFFFFFFFF)))
    big = struct.pack(">IIII", 0x803, 0xFFFFFFF0, 28, 28) + b"\x01" * 16
    write("idx", "huge_count", pair(big, labels([1] * 4, count=0xFFFFFFF0)))
    write("idx", "empty", b"")
    write("idx", "empty_files", b"\x00\x00")


# --- CSV: a leading 'H' means "read with a header line".
def csv():
    write("csv", "valid", "0.5,1.25,-3,2\n1e-3, 4 ,0,0\r\n-0.25,2.5e2,7,11\n\n  \n")
    write("csv", "valid_header", "Hf1,f2,label\n1,2,0\n3,4,1\n")
    write("csv", "no_newline", "1,2,3")
    write("csv", "ragged", "1,2,0\n3,4,1\n5,1\n")
    write("csv", "non_numeric", "1,2,0\n3,abc,1\n")
    write("csv", "nan_inf", "nan,2,0\ninf,-inf,1\n1e39,1e-50,2\n")
    write("csv", "hex_and_signs", "0x1p3,+1,0\n-0,.5,1\n5.,1e,2\n")
    write("csv", "labels", "1,2,1.5\n1,2,-1\n1,2,99999999999\n1,2,2147483647\n")
    write("csv", "unicode", "１,２,0\n\u00e9,\u2212\u0031,1\n\ufeff1,2,0\n")
    write("csv", "blank_inside", "1,2,0\n\n3,4,1\n")
    write("csv", "header_only", "Ha,b,label\n\n")
    write("csv", "only_label", "5\n")
    write("csv", "wide", ",".join(["0.5"] * 200) + ",1\n")
    write("csv", "cr_only", "1,2,0\r3,4,1\r")
    write("csv", "nul_bytes", b"1,2\x00,0\n3,4,1\n")
    write("csv", "empty", b"")


# --- safetensors: 8-byte little-endian header length, JSON header, then the F32 data.
def safetensors(header, data=b"", pad=True, length=None):
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def st():
    w = struct.pack("<6f", *[0.5, -1.0, 2.0, 0.0, 1e-3, 3.25])
    b = struct.pack("<2f", 0.25, -0.5)
    good = {"__metadata__": {"format": "pt"},
            "0.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "0.bias": {"dtype": "F32", "shape": [2], "data_offsets": [24, 32]}}
    write("safetensors", "valid", safetensors(good, w + b))
    write("safetensors", "valid_scalar_and_empty",
          safetensors({"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
                       "e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [4, 4]}},
                      struct.pack("<f", 1.5)))
    write("safetensors", "valid_unpadded", safetensors(good, w + b, pad=False))
    write("safetensors", "truncated_data", safetensors(good, (w + b)[:-3]))
    write("safetensors", "truncated_header", safetensors(good, w + b)[:20])
    write("safetensors", "huge_header_length", safetensors(good, w + b, length=0xFFFFFFFFFFFFFFF0))
    write("safetensors", "header_length_past_end", safetensors(good, w + b, length=4096))
    write("safetensors", "short_file", b"\x10\x00\x00")
    write("safetensors", "empty", b"")
    overlap = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    write("safetensors", "overlap", safetensors(overlap, b"\x00" * 12))
    gap = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}
    write("safetensors", "gap", safetensors(gap, b"\x00" * 8))
    write("safetensors", "negative_dim",
          safetensors({"a": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8]}}, b"\0" * 8))
    write("safetensors", "huge_dims",
          safetensors({"a": {"dtype": "F32", "shape": [2**62, 2**62, 16],
                             "data_offsets": [0, 8]}}, b"\0" * 8))
    write("safetensors", "wrong_dtype",
          safetensors({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4))
    write("safetensors", "offsets_not_ints",
          safetensors({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, "4"]}}, b"\0" * 4))
    write("safetensors", "metadata_not_strings",
          safetensors({"__metadata__": {"n": 1, "o": {"x": []}}}, b""))
    write("safetensors", "header_not_object", safetensors([1, 2, 3], b""))
    raw = b'{"\xff\xfe":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    write("safetensors", "invalid_utf8_name", struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    dup = (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
           b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}')
    write("safetensors", "duplicate_key", struct.pack("<Q", len(dup)) + dup + b"\0" * 8)
    nested = b"[" * 2000 + b"]" * 2000
    write("safetensors", "deep_json", struct.pack("<Q", len(nested)) + nested)
    # "MANY" or "HUGE", the count's power of two, its offset + 128, one entry repeated (see
    # fuzz_safetensors.cpp). HUGE ones take seconds each, instrumented: ctest replays them from
    # safetensors_many, the fuzzers do not start from them.
    entry = b'"t#i":{"dtype":"F32","shape":[1],"data_offsets":[#b,#e]}'
    nested = b'"t#i":{"a":{"b":[#b,{"c":#e}]},"d":{}}'
    write("safetensors", "many_valid", b"MANY" + bytes([10, 128]) + entry)  # 1,024 tensors
    write("safetensors", "many_same_name", b"MANY" + bytes([6, 128]) + entry.replace(b"#i", b""))
    write("safetensors", "many_nested", b"MANY" + bytes([6, 128]) + nested)
    write("safetensors_many", "valid_16k", b"HUGE" + bytes([14, 128]) + entry)  # the most it loads
    # Nested objects: the callback parser re-scanned the parent at the end of each one.
    write("safetensors_many", "nested_16k", b"HUGE" + bytes([14, 128]) + nested)
    write("safetensors_many", "over_cap", b"HUGE" + bytes([16, 129]) + entry)  # 65,537
    write("safetensors_many", "over_cap_far", b"HUGE" + bytes([17, 255]) + entry)  # 131,199

# --- npy: "\x93NUMPY", version, header length (2 bytes in 1.0, 4 in 2.0/3.0), the dict
# padded with spaces and "\n" (to 64 bytes, as numpy.save does), then the data.
def npy_file(descr, shape, data=b"", major=1, fortran="False", dict_text=None, align=64):
    text = dict_text or "{'descr': %s, 'fortran_order': %s, 'shape': %s, }" % (
        descr if descr.startswith("[") else repr(descr), fortran, shape)
    preamble = 8 + (2 if major == 1 else 4)
    text += " " * ((align - (preamble + len(text) + 1) % align) % align) + "\n"
    length = struct.pack("<H" if major == 1 else "<I", len(text))
    return b"\x93NUMPY" + bytes([major, 0]) + length + text.encode("latin1") + data


def npy():
    f4 = struct.pack("<12f", *[i * 0.5 - 2 for i in range(12)])
    write("npy", "valid_f4_3x4", npy_file("<f4", "(3, 4)", f4))
    write("npy", "valid_u1_labels", npy_file("|u1", "(5,)", bytes([0, 1, 9, 3, 255])))
    write("npy", "valid_u1_images", npy_file("|u1", "(2, 4, 4)", bytes(range(32))))
    write("npy", "valid_i8_v2", npy_file("<i8", "(2,)", struct.pack("<2q", -1, 7), major=2))
    write("npy", "valid_f2_v3", npy_file("<f2", "(1, 2)", b"\x00\x3c\x00\xc0", major=3))
    write("npy", "valid_empty", npy_file("<f8", "(0, 3)"))
    write("npy", "valid_syntax", npy_file(None, None, struct.pack("<2I", 1, 2), dict_text=
          "{\"shape\" : ( 2L ,\n ) ,'fortran_order':False,\t'descr':'=u4'}"))
    write("npy", "big_endian", npy_file(">f4", "(3, 4)", f4))
    write("npy", "object", npy_file("|O", "(2,)", b"\x80\x04N."))
    write("npy", "structured", npy_file("[('x', '<f4'), ('y', '<i4')]", "(1,)", b"\0" * 8))
    write("npy", "fortran", npy_file("<f4", "(3, 4)", f4, fortran="True"))
    write("npy", "zero_d", npy_file("<f4", "()", b"\0" * 4))
    write("npy", "huge_dim", npy_file("<f4", "(99999999999999999999,)"))
    write("npy", "overflow_shape", npy_file("|u1", "(0, 4294967296, 4294967296)"))
    write("npy", "negative_dim", npy_file("<f4", "(3, -1)"))
    write("npy", "odd_offset", npy_file("<f4", "(12,)", f4, align=1))
    write("npy", "truncated_data", npy_file("<f4", "(3, 4)", f4[:-3]))
    write("npy", "trailing_data", npy_file("<f4", "(3, 4)", f4 + b"\0" * 4))
    write("npy", "truncated_header", npy_file("<f4", "(3, 4)", f4)[:40])
    write("npy", "missing_key", npy_file(None, None, dict_text="{'descr': '<f4', 'shape': (3,)}"))
    write("npy", "version_4", b"\x93NUMPY\x04\x00" + npy_file("<f4", "(1,)")[8:])
    write("npy", "not_npy", b"PK\x03\x04\x14\x00\x00\x00")
    write("npy", "empty", b"")


def config():
    seed_path = os.path.join(os.path.dirname(ROOT), "..", "..", "configs", "seed.yaml")
    with open(seed_path, "rb") as f:
        write("config", "seed_yaml", f.read())
    write("config", "minimal", "model: {layers: [4, 3]}\n")
    write("config", "full_flow",
          "device: cpu\nmodel: {layers: [20, 10, 3], activation: relu}\n"
          "data: {format: synthetic, train: {samples: 100}, test: {samples: 20}, seed: 3}\n"
          "optimizer: {name: sgd, lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 1e-4}\n"
          "training: {epochs: 2, batch_size: 8, accumulate_steps: 2, log_every: 0}\n"
          "distributed: {backend: mpi, bucket_cap_mb: 0.5, gpus: [0, 1], timeout_s: 30}\n"
          "output: {dir: /tmp/x, trace: true, trace_steps: 0}\n")
    write("config", "with_overrides",
          b"model: {layers: [4, 3]}\n\x00training.epochs=3\x00optimizer.lr=1e-2"
          b"\x00model.layers=[5, 2]")
    write("config", "bad_override", b"model: {layers: [4, 3]}\n\x00training\x00=3\x00a.b.c.d=[")
    write("config", "csv_missing_file",
          "model: {layers: [4, 3]}\ndata: {format: csv, train: {path: /nonexistent.csv}}\n")
    write("config", "numbers",
          "model: {layers: [4, 3]}\noptimizer: {lr: .nan, momentum: -.inf}\n"
          "training: {epochs: 0x10, batch_size: 9223372036854775808, seed: -1}\n")
    write("config", "types", "model: {layers: 4}\ntraining: [1, 2]\ndevice: {a: b}\n")
    write("config", "anchors", "a: &x {layers: [4, 3]}\nmodel: *x\nmodel2: *x\n")
    write("config", "unknown_key", "model: {layers: [4, 3]}\ntraining: {bach_size: 3}\n")
    write("config", "unicode",
          "model: {layers: [4, 3]}\noutput: {dir: \"\u00e9\u2603/\U0001F600\"}\n")
    write("config", "multi_doc", "model: {layers: [4, 3]}\n---\nmodel: {layers: [4, 3]}\n")
    write("config", "broken", "model: {layers: [4, 3]\n")
    write("config", "tags", "model: !!map {layers: !!seq [!!int 4, !!str 3]}\n")
    write("config", "nested", "model: " + "[" * 64 + "]" * 64 + "\n")
    write("config", "empty", "")
    write("config", "scalar", "just a string\n")


def main():
    for fn in (idx, csv, st, npy, config):
        fn()
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ROOT) for f in fs)
    print(f"corpus: {total} bytes under {ROOT}", file=sys.stderr)


if __name__ == "__main__":
    main()
