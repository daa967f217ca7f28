#!/usr/bin/env python3
"""The products of bench_cuda_matmul.cpp through PyTorch, timed the same way, for a side-by-side view.

    python3 bench/pytorch_matmul.py              # n = 8192: bfloat16, float16, float32 (TF32)
    python3 bench/pytorch_matmul.py --n 4096 --reps 20

Each case: random (n, n) operands on cuda:0, 3 untimed products, then 5 trials of --reps products,
timed with CUDA events around the whole trial; TFLOP/s = 2 n^3 / (trial time / reps).
"""
import argparse
import statistics

import torch


def time_matmul(n, dtype, reps):
    a = torch.randn(n, n, dtype=dtype, device="cuda:0")
    b = torch.randn(n, n, dtype=dtype, device="cuda:0")
    for _ in range(3):
        torch.matmul(a, b)
    torch.cuda.synchronize(0)
    trials = []
    for _ in range(5):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            torch.matmul(a, b)
        stop.record()
        stop.synchronize()
        trials.append(start.elapsed_time(stop) / reps)
    trials.sort()
    return trials[0], trials[len(trials) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU visible")
        return
    torch.manual_seed(0)
    flops = 2.0 * args.n ** 3
    for name, dtype, tf32 in (("bfloat16", torch.bfloat16, False), ("float16", torch.float16, False),
                              ("float32 (tf32)", torch.float32, True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        best, median = time_matmul(args.n, dtype, max(1, args.reps))
        print(f"torch matmul {name:<15} n={args.n}: best {best:8.3f} ms {flops / (best * 1e-3) / 1e12:7.1f} TFLOP/s"
              f" | median {median:8.3f} ms {flops / (median * 1e-3) / 1e12:7.1f} TFLOP/s")


if __name__ == "__main__":
    main()
