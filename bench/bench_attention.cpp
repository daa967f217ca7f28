// scaled_dot_product_attention forward + backward on a GPU, fused (cuDNN) and math paths, beside PyTorch
// (bench/pytorch_attention.py times torch's cuDNN, flash and math backends on the same shapes).
//
//   bench_attention [--quick]
//
// Shapes (batch x heads x tokens x head dim): BERT-base's 128 x 12 x 128 x 64 and 64 x 12 x 512 x 64, bf16,
// no mask, no dropout. q, k, v require grad; one step is out = sdpa(q, k, v), out.backward(dout). Median of 50
// steps after 10 warm-up steps, timed with CUDA events.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_timing.h"  // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

namespace {

void run(int64_t b, int64_t h, int64_t l, int64_t e, bool quick) {
  const TensorOptions o{.dtype = DType::BFloat16, .device = Device::cuda(0)};
  Tensor q = randn({b, h, l, e}, o).requires_grad_();
  Tensor k = randn({b, h, l, e}, o).requires_grad_();
  Tensor v = randn({b, h, l, e}, o).requires_grad_();
  Tensor dout = randn({b, h, l, e}, o);
  const int warmup = quick ? 1 : 10, steps = quick ? 3 : 50;
  auto step = [&] {
    q.mutable_grad() = Tensor();
    k.mutable_grad() = Tensor();
    v.mutable_grad() = Tensor();
    nn::scaled_dot_product_attention(q, k, v).backward(dout);
  };
  std::string why;
  const bool fused = nn::attention_backend(q, k, v, {}, &why) == nn::AttentionBackend::CudnnFused;
  const double t = bench::median_step_ms(warmup, steps, step);
  std::printf("kiln  sdpa bf16 fwd+bwd %3lld x %lld x %4lld x %lld  %-10s %8.3f ms%s%s\n", static_cast<long long>(b),
              static_cast<long long>(h), static_cast<long long>(l), static_cast<long long>(e), fused ? "cudnn" : "math",
              t, fused ? "" : "  (", fused ? "" : (why + ")").c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (!cuda::is_available()) {
    std::printf("bench_attention: no GPU visible; nothing to measure\n");
    return 0;
  }
  run(quick ? 8 : 128, 12, 128, 64, quick);
  run(quick ? 4 : 64, 12, 512, 64, quick);
  return 0;
}
