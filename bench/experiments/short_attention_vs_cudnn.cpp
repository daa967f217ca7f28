// Experiment: kiln's attention kernels for short sequences (kiln/layers/cuda/short_attention.h) against cuDNN's
// fused attention on BERT's training shapes: q, k, v the thirds of one (B, 128, 3, H, 64) projection output, a key
// padding bias (B, 1, 1, 128) masking the last 16 keys of every other sequence, dropout 0.1, bf16. For each: forward
// (with the statistics) and backward, the median of 20 timings after 5 (bench::median_step_ms) of 10 calls back to
// back, divided by 10 (a lone call's time would include the host's work before its kernel starts), and the largest
// differences between the two paths' outputs and gradients (the dropout masks differ between the two, so those are
// compared with dropout off).
//
//   g++ -std=c++20 -O2 -I . -I build/include -I bench -I /usr/local/cuda/include \
//       bench/experiments/short_attention_vs_cudnn.cpp -L build/kiln -lkiln -L /usr/local/cuda/lib64 -lcudart \
//       -Wl,-rpath,'$ORIGIN' -o short_attention_vs_cudnn
//
// Not part of the build: a measurement, run where the short-sequence kernels are tuned or their use is decided.
#include <cstdio>

#include "gpu_timing.h"  // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/layers/cuda/attention_cudnn.h"
#include "kiln/layers/cuda/short_attention.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/internal_ops.h"

using namespace kiln;
namespace ci = kiln::nn::cuda_impl;

namespace {

// The GPU time of one call of f: the median of 20 timings of kCalls calls back to back (the host queues them while
// the GPU runs the first), divided by kCalls.
constexpr int kCalls = 10;
template <typename F>
double per_call_ms(F&& f) {
  return bench::median_step_ms(5, 20,
                               [&] {
                                 for (int i = 0; i < kCalls; ++i) f();
                               }) /
         kCalls;
}

double max_diff(const Tensor& a, const Tensor& b) {
  return abs(sub(a.to(DType::Float32), b.to(DType::Float32))).max().item<double>();
}

void run(const char* name, int64_t B, int64_t H, int layers) {
  const int64_t L = 128, D = 64;
  const Device dev = Device::cuda(0);
  const TensorOptions bf{.dtype = DType::BFloat16, .device = dev};
  manual_seed(3);
  NoGradGuard no_grad;
  const Tensor qkv = randn({B, L, 3, H, D}, bf);
  auto third = [&](int64_t i) { return qkv.select(2, i).permute({0, 2, 1, 3}); };
  const Tensor q = third(0), k = third(1), v = third(2);
  Tensor bias = zeros({B, 1, 1, L}, bf);
  for (int64_t b = 1; b < B; b += 2) bias.select(0, b).narrow(2, L - 16, 16).fill_(-30000.0);
  Tensor d_out = ci::empty_bxhd(B, H, L, D, bf);
  d_out.copy_(randn({B, H, L, D}, bf));
  Generator gen(5);
  const GeneratorState draw = internal::draw_for(&gen, dev);
  std::printf("%s: batch %lld, %lld heads, 128 tokens, 64 per head (x%d layers)\n", name, static_cast<long long>(B),
              static_cast<long long>(H), layers);
  for (const double p : {0.0, 0.1}) {
    const ci::ShortAttentionConfig sc{.scale = 0.125, .dropout_p = p};
    const ci::FusedAttentionConfig fc{.scale = 0.125, .dropout_p = p, .with_stats = true};
    ci::FusedAttentionDropout fd;
    if (p > 0) fd = {12345, 0, full({1, 1, 1, 1}, 12345, {.dtype = DType::Int64, .device = dev})};
    if (!ci::fused_attention_supported(q, k, v, bias, fc)) {
      std::printf("  cuDNN does not take this case\n");
      return;
    }
    ci::ShortAttentionForward sf = ci::short_attention_forward(q, k, v, bias, sc, draw);
    ci::FusedAttentionForward ff = ci::fused_attention_forward(q, k, v, bias, fc, fd);
    ci::FusedAttentionGrads sg = ci::short_attention_backward(q, k, v, sf.out, d_out, sf.stats, sf.keep, bias, sc);
    ci::FusedAttentionGrads fg = ci::fused_attention_backward(q, k, v, ff.out, d_out, ff.stats, bias, fc, fd);
    const double s_fwd = per_call_ms([&] { sf = ci::short_attention_forward(q, k, v, bias, sc, draw); });
    const double c_fwd = per_call_ms([&] { ff = ci::fused_attention_forward(q, k, v, bias, fc, fd); });
    const double s_bwd =
        per_call_ms([&] { sg = ci::short_attention_backward(q, k, v, sf.out, d_out, sf.stats, sf.keep, bias, sc); });
    const double c_bwd =
        per_call_ms([&] { fg = ci::fused_attention_backward(q, k, v, ff.out, d_out, ff.stats, bias, fc, fd); });
    cuda::synchronize();
    std::printf(
        "  dropout %.1f: kiln forward %.4f backward %.4f ms | cuDNN forward %.4f backward %.4f ms | "
        "%.3f ms a step saved over %d layers\n",
        p, s_fwd, s_bwd, c_fwd, c_bwd, (c_fwd + c_bwd - s_fwd - s_bwd) * layers, layers);
    if (p == 0.0) {
      std::printf("    differences: out %.3g, stats %.3g, dq %.3g, dk %.3g, dv %.3g (of max |out| %.3g, |dq| %.3g)\n",
                  max_diff(sf.out, ff.out), max_diff(sf.stats, ff.stats), max_diff(sg.dq, fg.dq),
                  max_diff(sg.dk, fg.dk), max_diff(sg.dv, fg.dv), abs(ff.out.to(DType::Float32)).max().item<double>(),
                  abs(fg.dq.to(DType::Float32)).max().item<double>());
    }
  }
}

// float32 (TF32 products): kiln's kernels against the math path (batched products and the probability kernels), the
// forward and backward of one call through autograd, timed together; where the build has the TF32 kernels.
void run_float32(const char* name, int64_t B, int64_t H, int layers) {
  const int64_t L = 128, D = 64;
  const Device dev = Device::cuda(0);
  const TensorOptions f32{.dtype = DType::Float32, .device = dev};
  manual_seed(4);
  Tensor q = randn({B, H, L, D}, f32).requires_grad_(), k = randn({B, H, L, D}, f32).requires_grad_(),
         v = randn({B, H, L, D}, f32).requires_grad_();
  Tensor mask = ones({B, 1, 1, L}, {.dtype = DType::Bool, .device = dev});
  for (int64_t b = 1; b < B; b += 2) mask.select(0, b).narrow(2, L - 16, 16).fill_(false);
  const Tensor d_out = randn({B, H, L, D}, f32);
  std::string why;
  const nn::AttentionOptions o{.attn_mask = mask, .dropout_p = 0.1};
  const bool fused = nn::attention_backend(q, k, v, o, &why) == nn::AttentionBackend::ShortFused;
  std::printf("%s float32 (TF32): kiln's kernels %s%s\n", name, fused ? "take it" : "do not take it: ", why.c_str());
  auto step = [&](bool math) {
    const Tensor out = math ? nn::scaled_dot_product_attention_with_weights(q, k, v, o).output
                            : nn::scaled_dot_product_attention(q, k, v, o);
    out.backward(d_out);
  };
  const double t_math = bench::median_step_ms(3, 10, [&] { step(true); });
  if (!fused) {
    std::printf("  math path forward + backward %.4f ms\n", t_math);
    return;
  }
  const double t_kiln = bench::median_step_ms(3, 10, [&] { step(false); });
  std::printf("  forward + backward: kiln %.4f ms, math path %.4f ms: %.3f ms a step saved over %d layers\n", t_kiln,
              t_math, (t_math - t_kiln) * layers, layers);
}

}  // namespace

int main() {
  if (!cuda::is_available()) {
    std::printf("no CUDA device\n");
    return 1;
  }
  run("BERT-base", 128, 12, 12);
  run("BERT-large", 64, 16, 24);
  run_float32("BERT-base", 128, 12, 12);
  return 0;
}
