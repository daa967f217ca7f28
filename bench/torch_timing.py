"""How the PyTorch side of the GPU benchmarks times a step, as bench/gpu_timing.h does for kiln: untimed
warm-up steps, then each timed step between two CUDA events; the median in milliseconds."""
import statistics

import torch


def median_step_ms(step, warmup, steps):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)
