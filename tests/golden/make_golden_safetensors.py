#!/usr/bin/env python3
"""Writes tests/golden/data/sample.safetensors, read by tests/io/test_safetensors.cpp (SafetensorsGolden).

Plain Python (struct + json) writes the file byte by byte, as the safetensors spec says: an 8-byte little-endian
header length, a JSON header padded with spaces to a multiple of 8 bytes, then the tensors' bytes. bfloat16 bits
are computed by hand (round to nearest even of the float32 bits). When `safetensors` and `torch` are importable
(the GPU machine), the file is also read back with safetensors.torch.load_file and compared.

The tensors (the C++ test has these values written out by hand):
  weight  F32  (2, 3)  [0.0, -1.5, 2.25, 3.140625, -100.0, 0.001]
  half    F16  (4,)    [1.0, -2.5, 65504.0, 1/3]        bits 0x3C00 0xC100 0x7BFF 0x3555
  bf      BF16 (2, 2)  [1.0, -3.0, 1/3, pi]             bits 0x3F80 0xC040 0x3EAB 0x4049
  ids     I64  (3,)    [-1, 0, 2**40 + 7]
  scalar  F32  ()      42.0
  empty   F32  (0, 3)  no bytes
  metadata {"format": "pt", "source": "kiln golden"}

Run: python3 tests/golden/make_golden_safetensors.py   (no third-party package needed)
"""
import json
import math
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sample.safetensors")


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bf16_bits(x):
    b = f32_bits(x)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even (no NaNs here)


TENSORS = [  # (name, dtype, shape, bytes)
    ("weight", "F32", [2, 3], struct.pack("<6f", 0.0, -1.5, 2.25, 3.140625, -100.0, 0.001)),
    ("half", "F16", [4], struct.pack("<4e", 1.0, -2.5, 65504.0, 1.0 / 3.0)),
    ("bf", "BF16", [2, 2], struct.pack("<4H", *(bf16_bits(v) for v in (1.0, -3.0, 1.0 / 3.0, math.pi)))),
    ("ids", "I64", [3], struct.pack("<3q", -1, 0, 2**40 + 7)),
    ("scalar", "F32", [], struct.pack("<f", 42.0)),
    ("empty", "F32", [0, 3], b""),
]
METADATA = {"format": "pt", "source": "kiln golden"}


def main():
    assert struct.unpack("<4H", TENSORS[1][3]) == (0x3C00, 0xC100, 0x7BFF, 0x3555)
    assert struct.unpack("<4H", TENSORS[2][3]) == (0x3F80, 0xC040, 0x3EAB, 0x4049)
    header = {"__metadata__": METADATA}
    offset = 0
    for name, dtype, shape, data in TENSORS:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, data in TENSORS:
            f.write(data)
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")

    try:
        import torch
        from safetensors import safe_open
        from safetensors.torch import load_file
    except ImportError:
        print("safetensors/torch not importable: skipped the cross-check with the reference reader")
        return
    loaded = load_file(OUT)
    assert list(loaded["weight"].shape) == [2, 3] and loaded["weight"].dtype == torch.float32
    assert loaded["weight"].flatten().tolist() == list(struct.unpack("<6f", TENSORS[0][3]))
    assert loaded["half"].dtype == torch.float16
    assert loaded["half"].view(torch.int16).tolist() == [0x3C00, 0xC100 - 0x10000, 0x7BFF, 0x3555]
    assert loaded["bf"].dtype == torch.bfloat16
    assert loaded["bf"].flatten().view(torch.int16).tolist() == [0x3F80, 0xC040 - 0x10000, 0x3EAB, 0x4049]
    assert loaded["ids"].tolist() == [-1, 0, 2**40 + 7]
    assert loaded["scalar"].dim() == 0 and loaded["scalar"].item() == 42.0
    assert list(loaded["empty"].shape) == [0, 3]
    with safe_open(OUT, framework="pt") as f:
        assert f.metadata() == METADATA
    print("safetensors", __import__("safetensors").__version__, "reads it identically")


if __name__ == "__main__":
    main()
