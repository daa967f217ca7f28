// bench/gpu_timing.h — how the GPU benchmarks time a step: untimed warm-up steps, then each timed step between
// two CUDA events on the current stream; the median in milliseconds.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "kiln/tensor/cuda.h"

namespace kiln::bench {

inline double median_step_ms(int warmup, int steps, const std::function<void()>& step) {
  for (int i = 0; i < warmup; ++i) step();
  cuda::synchronize();
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    cuda::Event start(true), stop(true);
    start.record();
    step();
    stop.record();
    stop.synchronize();
    ms.push_back(start.elapsed_ms(stop));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace kiln::bench
