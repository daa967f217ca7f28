#!/usr/bin/env python3
"""Reads a kiln checkpoint with h5py and numpy and checks what kiln/io/README.md promises (its kiln header in
the HDF5 user block too).

    KILN_CHECKPOINT_SAMPLE=/tmp/sample.h5 ./build/tests/test_io --gtest_filter=IoCheckpoint.LayoutIsWhatH5pyReads
    python3 tests/golden/check_checkpoint_h5py.py /tmp/sample.h5

The sample is TinyNet (tests/io/checkpoint_test_util.h) after one AdamW step: its buffers hold known values of
every dtype. Exits non-zero with a message on the first difference.
"""
import struct
import sys
import zlib

import h5py
import numpy as np



def text(value):
    """kiln stores strings fixed-length (UTF-8); h5py gives those as bytes."""
    return value.decode("utf-8") if isinstance(value, bytes) else value

def check_kiln_header(path):
    # kiln's header in the 512-byte HDF5 user block (kiln/io/checkpoint_header.cpp), little-endian.
    with open(path, "rb") as fh:
        data = fh.read()
    magic, version, block, length, crc, header_crc = struct.unpack_from("<8sIIQII", data, 0)
    assert magic == b"KILNCKPT", magic
    assert (version, block) == (1, 512), (version, block)
    assert length == len(data), (length, len(data))
    assert crc == zlib.crc32(data[512:]), "file-level crc32"
    assert header_crc == zlib.crc32(data[:28]), "header crc32"
    assert data[512:520] == b"\x89HDF\r\n\x1a\n", "HDF5 superblock right after the user block"


def main(path):
    check_kiln_header(path)
    with h5py.File(path, "r") as f:
        assert f.userblock_size == 512, f.userblock_size
        assert text(f.attrs["format"]) == "kiln-checkpoint", f.attrs["format"]
        assert int(f.attrs["format_version"]) == 1
        assert int(f.attrs["complete"]) == 1
        m = f["model"]
        assert m["fc1.weight"].dtype == np.float32 and m["fc1.weight"].shape == (8, 4)
        assert m["fc2.bias"].shape == (3,)
        assert m["half"].dtype == np.float16, m["half"].dtype
        np.testing.assert_array_equal(m["half"][()], np.array([[0.5, -2.25], [65504, 1e-4]], dtype=np.float16))
        assert m["bhalf"].dtype == np.uint16 and text(m["bhalf"].attrs["dtype"]) == "bfloat16"
        # bfloat16 is float32's top half (torch: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)).
        bits = np.array([1.5, -3e38, 7.0], dtype=np.float32).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
        np.testing.assert_array_equal(m["bhalf"][()], rounded)
        assert m["mask"].dtype == np.bool_, m["mask"].dtype
        np.testing.assert_array_equal(m["mask"][()], [True, False, True])
        np.testing.assert_array_equal(m["steps"][()], np.array([1 << 40, -3], dtype=np.int64))
        np.testing.assert_array_equal(m["ints"][()], np.array([-7, 1 << 30], dtype=np.int32))
        np.testing.assert_array_equal(m["bytes"][()], np.array([0, 255, 7], dtype=np.uint8))
        np.testing.assert_array_equal(m["wide"][()], np.array([[1.0 / 3.0, -1e300]]))
        assert m["scalar"].shape == () and m["scalar"][()] == np.float32(2.5)
        assert m["nothing"].shape == (0, 3)
        assert text(f["optimizer"].attrs["type"]) == "AdamW"
        assert "0.exp_avg" in f["optimizer"]["state"]
        assert f["rng"]["cpu"].attrs["seed"].dtype == np.uint64
        checked = 0

        def check_crc(name, obj):
            nonlocal checked
            if isinstance(obj, h5py.Dataset):
                data = np.ascontiguousarray(obj[()]).tobytes()
                assert int(obj.attrs["crc32"]) == zlib.crc32(data), f"crc32 of {name}"
                checked += 1

        f.visititems(check_crc)
        assert checked >= 15, checked
    print(f"OK: {path} reads as promised ({checked} datasets checksummed)")


if __name__ == "__main__":
    main(sys.argv[1])
