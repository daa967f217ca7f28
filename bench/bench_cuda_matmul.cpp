// bench/bench_cuda_matmul.cpp — GPU matmul throughput through kiln (cuBLASLt underneath), to compare
// side by side with bench/pytorch_matmul.py, which times the same products the same way.
//
//   ./build/bench/bench_cuda_matmul               n = 8192: bfloat16, float16, float32 (TF32)
//   ./build/bench/bench_cuda_matmul --n 4096 --reps 20
//
// Each case: random (n, n) operands on cuda:0, 3 untimed products (cuBLASLt's algorithm choice, the
// workspace and the allocator's cache all settle there), then 5 trials of --reps products each,
// timed with CUDA events around the whole trial. TFLOP/s = 2 n^3 / (trial time / reps); the best and
// the median trial are printed. Without a GPU it prints "no GPU visible" and exits 0.
#include <kiln/kiln.h>
#include <kiln/tensor/cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Result {
  double best_ms = 0, median_ms = 0;
};

Result time_matmul(int64_t n, kiln::DType dtype, int reps) {
  using kiln::Tensor;
  const kiln::TensorOptions opts{.dtype = dtype, .device = kiln::Device::cuda(0)};
  Tensor a = kiln::randn({n, n}, opts), b = kiln::randn({n, n}, opts);
  for (int i = 0; i < 3; ++i) Tensor c = kiln::matmul(a, b);
  kiln::cuda::synchronize(0);
  std::vector<double> trials;
  for (int t = 0; t < 5; ++t) {
    kiln::cuda::Event start(true), stop(true);
    start.record();
    for (int i = 0; i < reps; ++i) Tensor c = kiln::matmul(a, b);
    stop.record();
    stop.synchronize();
    trials.push_back(static_cast<double>(start.elapsed_ms(stop)) / reps);
  }
  std::sort(trials.begin(), trials.end());
  return {trials.front(), trials[trials.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 8192;
  int reps = 10;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--n N] [--reps R]\n", argv[0]);
      return EXIT_FAILURE;
    }
    if (std::strcmp(argv[i], "--n") == 0) n = std::strtoll(argv[i + 1], nullptr, 10);
    else if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: %s [--n N] [--reps R]\n", argv[0]);
      return EXIT_FAILURE;
    }
  }
  if (!kiln::cuda::is_available()) {
    std::printf("no GPU visible\n");
    return 0;
  }
  kiln::manual_seed(0);
  struct Case {
    const char* name;
    kiln::DType dtype;
    bool tf32;
  };
  const Case cases[] = {{"bfloat16", kiln::DType::BFloat16, false},
                        {"float16", kiln::DType::Float16, false},
                        {"float32 (tf32)", kiln::DType::Float32, true}};
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  for (const Case& c : cases) {
    kiln::cuda::set_allow_tf32(c.tf32);
    const Result r = time_matmul(n, c.dtype, reps);
    std::printf("kiln  matmul %-15s n=%lld: best %8.3f ms %7.1f TFLOP/s | median %8.3f ms %7.1f TFLOP/s\n", c.name,
                static_cast<long long>(n), r.best_ms, flops / (r.best_ms * 1e-3) / 1e12, r.median_ms,
                flops / (r.median_ms * 1e-3) / 1e12);
  }
  kiln::cuda::set_allow_tf32(true);
  return 0;
}
