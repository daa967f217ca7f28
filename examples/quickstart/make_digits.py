#!/usr/bin/env python3
"""Writes the quick start's data set: the UCI "Optical Recognition of Handwritten Digits" test set (1,797
8x8 images of the digits 0-9, 16 grey levels; Alpaydin & Kaynak, CC BY 4.0), as scikit-learn ships it
(sklearn/datasets/data/digits.csv.gz), converted to MNIST's IDX files so that kiln's data::MNIST reads it.

    python3 examples/quickstart/make_digits.py                 # from an installed scikit-learn
    python3 examples/quickstart/make_digits.py --wheel scikit_learn-*.whl   # from a downloaded wheel

A fixed shuffle (seed 0) splits it into 1,437 training and 360 test images; grey levels 0..16 become
0..255 (x 16, 256 clipped to 255). Output: examples/quickstart/data/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
"""
import argparse
import gzip
import io
import os
import random
import struct
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))


def read_csv_bytes(wheel):
    member = "sklearn/datasets/data/digits.csv.gz"
    if wheel:
        with zipfile.ZipFile(wheel) as z:
            return z.read(member)
    import sklearn  # noqa: imported only to find its data folder
    with open(os.path.join(os.path.dirname(sklearn.__file__), "datasets", "data", "digits.csv.gz"), "rb") as f:
        return f.read()


def write_idx(path, magic, dims, payload):
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims)
    # mtime=0: the same bytes on every run
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(header + bytes(payload))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wheel", help="a scikit-learn wheel to read digits.csv.gz from")
    p.add_argument("--out", default=os.path.join(HERE, "data"))
    args = p.parse_args()
    text = gzip.decompress(read_csv_bytes(args.wheel)).decode()
    rows = [list(map(float, line.split(","))) for line in text.strip().splitlines()]
    assert len(rows) == 1797 and all(len(r) == 65 for r in rows), "unexpected digits.csv layout"
    random.Random(0).shuffle(rows)
    os.makedirs(args.out, exist_ok=True)
    for name, part in (("train", rows[:1437]), ("t10k", rows[1437:])):
        pixels = [min(255, int(v) * 16) for r in part for v in r[:64]]
        labels = [int(r[64]) for r in part]
        write_idx(os.path.join(args.out, f"{name}-images-idx3-ubyte.gz"), 2051, (len(part), 8, 8), pixels)
        write_idx(os.path.join(args.out, f"{name}-labels-idx1-ubyte.gz"), 2049, (len(part),), labels)
        print(f"{name}: {len(part)} images, labels {sorted(set(labels))}")


if __name__ == "__main__":
    main()
