"""PyTorch eager on the chain of bench_autograd.cpp: y = y * a + b, 1000 times on 16 elements, then backward.

Prints microseconds per op (2000 ops) for forward plus backward, the median of 20 repetitions, on the CPU
and on cuda:0 when available, in the same format as bench_autograd.
"""
import statistics
import time

import torch


def chain_us_per_op(device, steps=1000, reps=20):
    x = torch.randn(16, device=device, requires_grad=True)
    a = torch.rand(16, device=device, requires_grad=True)
    b = torch.randn(16, device=device, requires_grad=True)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    times = []
    for r in range(reps + 1):
        sync()
        t0 = time.perf_counter()
        y = x
        for _ in range(steps):
            y = y * a + b
        y.sum().backward()
        sync()
        t1 = time.perf_counter()
        if r > 0:
            times.append((t1 - t0) * 1e6 / (2 * steps))
        x.grad = a.grad = b.grad = None
    return statistics.median(times)


def main():
    print(f"pytorch {torch.__version__}")
    print(f"torch cpu     {chain_us_per_op('cpu'):8.2f} us/op")
    if torch.cuda.is_available():
        print(f"torch cuda:0  {chain_us_per_op('cuda:0'):8.2f} us/op")


if __name__ == "__main__":
    main()
