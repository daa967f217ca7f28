// Experiment: ResNet-50's stem convolution (7x7, stride 2, padding 3, 64 filters, batch 256, 224x224, channels-last)
// with its 3 input channels as they are, and zero-padded to 4 and to 8, in bf16 and fp16, through kiln's conv2d on a
// GPU: the forward alone, and the forward with the weight's gradient (the stem's input needs none), median of 20
// steps after 5 (bench::median_step_ms), with nn::set_cudnn_benchmark on as bench_train runs. Also the zero-padding
// copy itself (3 -> 4 and 3 -> 8 channels, channels-last). Whether cuDNN's engines for a 3-channel 16-bit input are
// slower than those for an aligned channel count by more than the padding costs. Last, the same stem as a
// space-to-depth convolution (4x4, stride 1, on 12 or 16 channels of 115 x 115), the layout change left out.
//
//   g++ -std=c++20 -O2 -I . -I build/include -I bench bench/experiments/stem_channels.cpp -L build/kiln -lkiln \
//       -Wl,-rpath,'$ORIGIN' -o stem_channels
//
// Not part of the build: a measurement, run where the choice of padding a convolution's channels is to be made.
#include <cstdio>

#include "gpu_timing.h"  // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

namespace {

constexpr int64_t kN = 256, kHW = 224, kOut = 64;

Tensor pad_channels(const Tensor& x, int64_t c) {
  if (x.size(1) == c) return x;
  const Tensor zeros_part =
      zeros({x.size(0), c - x.size(1), x.size(2), x.size(3)}, {.dtype = x.dtype(), .device = x.device()});
  return cat({x, zeros_part}, 1).contiguous(MemoryFormat::ChannelsLast);
}

struct Times {
  double fwd, fwd_dw;  // ms: the forward alone; the forward with w's gradient from dy
};

Times time_conv(const Tensor& x, Tensor& w, const Tensor& dy, const nn::Conv2dOptions& opt) {
  const double fwd = bench::median_step_ms(5, 20, [&] {
    NoGradGuard no_grad;
    (void)nn::conv2d(x, w, {}, opt);
  });
  const double fwd_dw = bench::median_step_ms(5, 20, [&] {
    w.mutable_grad() = Tensor();
    nn::conv2d(x, w, {}, opt).backward(dy);
  });
  return {fwd, fwd_dw};
}

void run(DType dtype, const char* name) {
  const Device dev = Device::cuda(0);
  const Tensor x3 = randn({kN, 3, kHW, kHW}, {.dtype = dtype, .device = dev}).contiguous(MemoryFormat::ChannelsLast);
  const Tensor w3 = randn({kOut, 3, 7, 7}, {.dtype = dtype, .device = dev}).contiguous(MemoryFormat::ChannelsLast);
  const Tensor dy =
      randn({kN, kOut, kHW / 2, kHW / 2}, {.dtype = dtype, .device = dev}).contiguous(MemoryFormat::ChannelsLast);
  const nn::Conv2dOptions opt{.stride = 2, .padding = 3, .bias = false};
  for (int64_t c : {3, 4, 8}) {
    const Tensor x = pad_channels(x3, c);
    Tensor w = pad_channels(w3, c).requires_grad_();
    const Times t = time_conv(x, w, dy, opt);
    const double pad = c == 3 ? 0.0 : bench::median_step_ms(5, 20, [&] { (void)pad_channels(x3, c); });
    std::printf("stem %s c_in %lld: fwd %.4f ms  fwd+dw %.4f ms  padding copy %.4f ms\n", name,
                static_cast<long long>(c), t.fwd, t.fwd_dw, pad);
    std::fflush(stdout);
  }
  // The same convolution as space-to-depth: the input padded by 3 to 230 x 230 and its 2 x 2 blocks made channels
  // (115 x 115 x 12), the kernel padded to 8 x 8 and split likewise (4 x 4 x 12): a 4 x 4 stride-1 convolution with
  // the same outputs (112 x 112), on 12 channels or zero-padded to 16.
  for (int64_t c : {12, 16}) {
    const Tensor x = randn({kN, c, 115, 115}, {.dtype = dtype, .device = dev}).contiguous(MemoryFormat::ChannelsLast);
    Tensor w = randn({kOut, c, 4, 4}, {.dtype = dtype, .device = dev}).contiguous(MemoryFormat::ChannelsLast);
    w.requires_grad_();
    const Times t = time_conv(x, w, dy, {.stride = 1, .padding = 0, .bias = false});
    std::printf("stem %s space-to-depth c_in %lld: fwd %.4f ms  fwd+dw %.4f ms\n", name, static_cast<long long>(c),
                t.fwd, t.fwd_dw);
    std::fflush(stdout);
  }
}

}  // namespace

int main() {
  if (!cuda::is_available()) {
    std::printf("stem_channels: no CUDA device\n");
    return 1;
  }
  nn::set_cudnn_benchmark(true);
  run(DType::BFloat16, "bf16");
  run(DType::Float16, "fp16");
  return 0;
}
