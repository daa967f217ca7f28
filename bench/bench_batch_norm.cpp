// Batch norm in training on a GPU, on the shapes of ResNet-50 at batch 256 (bf16, channels-last), beside
// PyTorch (bench/pytorch_batch_norm.py times torch's batch norm, cuDNN's, on the same cases).
//
//   bench_batch_norm [--quick]
//
// Per case: the forward (statistics, running-stat update, normalisation) and forward + backward with a given
// output gradient, median of 20 steps after 5, timed with CUDA events; GB/s counts the bytes the passes must
// move at the least: forward reads x twice and writes y (3 x the tensor), backward reads x and dy twice and
// writes dx (5 x). Plain batch norm (no fused ReLU), as torch.nn.BatchNorm2d.
#include <cstdio>
#include <cstring>

#include "gpu_timing.h"  // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

namespace {

struct Case {
  int64_t c, hw;
  int count;  // how many of ResNet-50's 53 batch norms have this shape
};
// ResNet-50's batch norms at 224^2 input: (channels, spatial size, layers of that shape).
constexpr Case kCases[] = {{64, 112, 1}, {64, 56, 6},   {256, 56, 4},  {128, 56, 1}, {128, 28, 7}, {512, 28, 5},
                           {256, 28, 1}, {256, 14, 11}, {1024, 14, 7}, {512, 14, 1}, {512, 7, 5},  {2048, 7, 4}};

void run(int64_t n, const Case& k, int warmup, int steps, double& fwd_sum, double& both_sum) {
  const Device dev = Device::cuda(0);
  Tensor x = randn({n, k.c, k.hw, k.hw}, {.dtype = DType::BFloat16, .device = dev})
                 .contiguous(MemoryFormat::ChannelsLast)
                 .requires_grad_();
  Tensor dy =
      randn({n, k.c, k.hw, k.hw}, {.dtype = DType::BFloat16, .device = dev}).contiguous(MemoryFormat::ChannelsLast);
  auto bn = std::make_shared<nn::BatchNorm2d>(k.c);
  bn->to(dev);
  const double fwd = bench::median_step_ms(warmup, steps, [&] {
    NoGradGuard no_grad;
    (void)(*bn)(x);
  });
  const double both = bench::median_step_ms(warmup, steps, [&] {
    x.mutable_grad() = Tensor();
    for (Tensor& p : bn->parameters()) p.mutable_grad() = Tensor();
    (*bn)(x).backward(dy);
  });
  const double bytes = static_cast<double>(x.numel()) * 2;
  std::printf(
      "kiln batch_norm bf16 NHWC %3lld x %4lld x %3lld x %3lld  fwd %7.3f ms %6.0f GB/s  fwd+bwd %7.3f ms  bwd %6.0f "
      "GB/s  (x%d in ResNet-50)\n",
      static_cast<long long>(n), static_cast<long long>(k.c), static_cast<long long>(k.hw),
      static_cast<long long>(k.hw), fwd, 3 * bytes / fwd / 1e6, both, 5 * bytes / (both - fwd) / 1e6, k.count);
  fwd_sum += fwd * k.count;
  both_sum += both * k.count;
  if (k.c == 64 && k.hw == 112) {  // where the time of one case goes, pass by pass (kiln's profiler)
    profiler::Profile prof;
    for (int i = 0; i < 5; ++i) {
      x.mutable_grad() = Tensor();
      (*bn)(x).backward(dy);
    }
    prof.stop();
    std::printf("%s", prof.result().table(8).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (!cuda::is_available()) {
    std::printf("bench_batch_norm: no GPU visible; nothing to measure\n");
    return 0;
  }
  double fwd = 0, both = 0;
  for (const Case& k : kCases) run(quick ? 8 : 256, k, quick ? 1 : 5, quick ? 3 : 20, fwd, both);
  std::printf("kiln batch_norm ResNet-50's 53 layers at batch %d: fwd %.2f ms, fwd+bwd %.2f ms\n", quick ? 8 : 256, fwd,
              both);
  return 0;
}
