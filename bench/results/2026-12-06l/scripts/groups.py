#!/usr/bin/env python3
"""Sums a kernel_trace report (bench/kernel_trace.cpp, KILN_KERNEL_TRACE_TOP large enough to list every kernel) by
kind of work, in ms per step, for each profiler range of each log given: matrix products, attention, layer norm, FP8
quantisation, optimizer, the rest.

    python3 groups.py --steps 30 trace_base.log trace_large.log
"""
import argparse
import re

KINDS = [  # first match wins
    ("FP8 products", r"^nvjet_sm90_q"),
    ("16-bit products", r"^nvjet|gemm|cutlass|sm90_xmma|splitKreduce|Bgrad"),
    ("attention", r"sdpa|cudnn::fusion|flash"),
    ("layer norm", r"layer_norm"),
    ("FP8 quantisation", r"quantize|transpose_codes|update_scales"),
    ("GELU", r"gelu|Gelu"),
    ("optimizer", r"multi_tensor|Adam|adam"),
    ("loss", r"cross_entropy"),
]


def kind(name):
    for k, pattern in KINDS:
        if re.search(pattern, name):
            return k
    return "other"


def ranges(path):
    """Yields (header, [(ms, calls, name)]) per range in a log."""
    header, rows = None, []
    for line in open(path, errors="replace"):
        if line.startswith("kernel_trace range"):
            if header is not None:
                yield header, rows
            header, rows = line.strip(), []
            continue
        m = re.match(r"\s+([0-9.]+)\s+(\d+)\s+[0-9.]+%\s+(.*)$", line)
        if header is not None and m:
            rows.append((float(m.group(1)), int(m.group(2)), m.group(3)))
    if header is not None:
        yield header, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args()
    for path in a.logs:
        for header, rows in ranges(path):
            total = sum(r[0] for r in rows) / a.steps
            sums = {}
            for ms, calls, name in rows:
                k = kind(name)
                t, c = sums.get(k, (0.0, 0))
                sums[k] = (t + ms / a.steps, c + calls / a.steps)
            print(f"{path}: {header[:110]}")
            for k, (t, c) in sorted(sums.items(), key=lambda kv: -kv[1][0]):
                print(f"  {k:18s} {t:8.3f} ms  {c:7.1f} kernels  {100 * t / total:5.1f}%")
            print(f"  {'listed kernels':18s} {total:8.3f} ms")


if __name__ == "__main__":
    main()
