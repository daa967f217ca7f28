// Autograd overhead: a long chain of tiny ops, forward plus backward, so that the time is the framework's
// own (graph recording, the engine, allocation, dispatch) rather than arithmetic.
//
//   bench_autograd [--quick]
//
// The chain: y = y * a + b, 1000 times, on 16-element float32 tensors (x, a, b require grad), then
// y.sum().backward(). Reported: microseconds per op (2000 ops) for forward plus backward, the median of
// several repetitions, on the CPU and (when a GPU is visible) on cuda:0. bench/pytorch_autograd.py runs the
// same chain through PyTorch eager.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

namespace {

double chain_us_per_op(Device device, int steps, int reps) {
  Tensor x = randn({16}, {.device = device}).requires_grad_();
  Tensor a = rand({16}, {.device = device}).requires_grad_();
  Tensor b = randn({16}, {.device = device}).requires_grad_();
  auto sync = [&] {
    if (device.is_cuda()) cuda::synchronize(device.index());
  };
  std::vector<double> times;
  for (int r = 0; r < reps + 1; ++r) {  // the first repetition warms caches and allocators up
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    Tensor y = x;
    for (int i = 0; i < steps; ++i) y = y * a + b;
    y.sum().backward();
    sync();
    const auto t1 = std::chrono::steady_clock::now();
    if (r > 0) times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / (2.0 * steps));
    x.mutable_grad() = Tensor();
    a.mutable_grad() = Tensor();
    b.mutable_grad() = Tensor();
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The same chain's forward without recording (NoGradGuard): the raw ops' own cost per op.
double raw_forward_us_per_op(Device device, int steps, int reps) {
  NoGradGuard no_grad;
  Tensor x = randn({16}, {.device = device});
  Tensor a = rand({16}, {.device = device});
  Tensor b = randn({16}, {.device = device});
  std::vector<double> times;
  for (int r = 0; r < reps + 1; ++r) {
    if (device.is_cuda()) cuda::synchronize(device.index());
    const auto t0 = std::chrono::steady_clock::now();
    Tensor y = x;
    for (int i = 0; i < steps; ++i) y = y * a + b;
    if (device.is_cuda()) cuda::synchronize(device.index());
    const auto t1 = std::chrono::steady_clock::now();
    if (r > 0) times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / (2.0 * steps));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int steps = quick ? 50 : 1000;
  const int reps = quick ? 2 : 20;
  std::printf("autograd overhead: y = y * a + b, %d times on 16 elements, then backward (us per op, fwd+bwd)\n", steps);
  std::printf("kiln cpu     %8.2f us/op   (forward alone, not recording: %.2f us/op)\n",
              chain_us_per_op(Device::cpu(), steps, reps), raw_forward_us_per_op(Device::cpu(), steps, reps));
  if (cuda::is_available()) {
    std::printf("kiln cuda:0  %8.2f us/op   (forward alone, not recording: %.2f us/op)\n",
                chain_us_per_op(Device::cuda(0), steps, reps), raw_forward_us_per_op(Device::cuda(0), steps, reps));
  } else {
    std::printf("kiln cuda:0  (no GPU visible)\n");
  }
  return 0;
}
