// Peak GPU memory of a deep stack of layers, trained one step with and without gradient checkpointing.
//
//   bench_checkpoint_memory [--quick]
//
// The stack: h = gelu(h @ W_i + b_i) for 32 layers, h of shape (4096, 1024) float32, W_i (1024, 1024).
// Without checkpointing every layer keeps its input and its pre-activation for backward; with
// checkpoint() over segments of 4 layers only the segment boundaries stay, and one segment's activations
// exist at a time while backward recomputes it. Reported: the peak of memory held by tensors during
// forward + backward (kiln::cuda::memory_stats), minus what the parameters and input hold, and the time.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

namespace {

struct Result {
  double peak_mib;
  double ms;
};

Result run(bool checkpointed, int64_t batch, int64_t width, int layers, int segment) {
  const Device dev = Device::cuda(0);
  std::vector<Tensor> w, b;
  for (int i = 0; i < layers; ++i) {
    w.push_back((randn({width, width}, {.device = dev}) / std::sqrt(static_cast<double>(width))).requires_grad_());
    b.push_back(zeros({width}, {.device = dev}).requires_grad_());
  }
  Tensor x = randn({batch, width}, {.device = dev});
  auto layer = [&](const Tensor& h, int i) { return gelu(addmm(b[i], h, w[i])); };

  cuda::synchronize();
  const int64_t base = cuda::memory_stats().allocated_bytes;
  cuda::reset_peak_memory_stats();
  const auto t0 = std::chrono::steady_clock::now();
  Tensor h = x;
  if (!checkpointed) {
    for (int i = 0; i < layers; ++i) h = layer(h, i);
  } else {
    for (int s = 0; s < layers; s += segment) {
      h = autograd::checkpoint(
          [&, s](const Tensor& in) {
            Tensor t = in;
            for (int i = s; i < s + segment && i < layers; ++i) t = layer(t, i);
            return t;
          },
          h);
    }
  }
  h.square().mean().backward();
  cuda::synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  const int64_t peak = cuda::memory_stats().peak_allocated_bytes;
  return {static_cast<double>(peak - base) / (1 << 20), std::chrono::duration<double, std::milli>(t1 - t0).count()};
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::is_available()) {
    std::printf("bench_checkpoint_memory: no GPU visible\n");
    return 0;
  }
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int64_t batch = quick ? 256 : 4096, width = quick ? 256 : 1024;
  const int layers = 32, segment = 4;
  run(false, batch, width, layers, segment);  // warm up cuBLAS and the allocator
  const Result plain = run(false, batch, width, layers, segment);
  const Result ckpt = run(true, batch, width, layers, segment);
  std::printf("checkpointing: %d layers of gelu(h @ W + b), h (%lld, %lld) float32, segments of %d layers\n", layers,
              static_cast<long long>(batch), static_cast<long long>(width), segment);
  std::printf("  without: peak %8.1f MiB above parameters+input, %7.2f ms fwd+bwd\n", plain.peak_mib, plain.ms);
  std::printf("  with:    peak %8.1f MiB above parameters+input, %7.2f ms fwd+bwd\n", ckpt.peak_mib, ckpt.ms);
  std::printf("  ratio:   %.2fx less memory, %.2fx the time\n", plain.peak_mib / ckpt.peak_mib, ckpt.ms / plain.ms);
  return 0;
}
