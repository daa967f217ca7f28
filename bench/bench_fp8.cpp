// bench_fp8: the FP8 training kernels at BERT's shapes, against the device's copy bandwidth and bf16 products.
//
//   bench_fp8 [--quick]
//
// Quantisation reads x once and writes one byte per element per layout, so its ceiling is the memory bandwidth: the
// reference is a device-to-device copy of the same input in this program (read + write). Each line gives the median
// of 20 timed calls (bench/gpu_timing.h), the bytes moved per second, and that as a share of the copy's rate:
//   quantize       one layout (R, C)
//   quantize_pair  both layouts, (R, C) and (C, R), in one pass; "+ sums" also the column sums (a bias gradient);
//                  "of gelu(x)" with the GELU applied as x is read (fc2's input), beside the GELU kernel alone;
//                  "through gelu" the gradient through the GELU (fc1's output gradient), beside gelu_backward alone
// Then each FP8 product of a BERT Linear (fp8_gemm: forward with fast accumulation, the two backward products
// without) beside the bf16 matmul of the same shape, in TFLOP/s. Rows: 16384 = BERT-base's 128 x 128 tokens.
#include <kiln/kiln.h>
#include <kiln/tensor/cuda.h>
#include <kiln/tensor/fp8_ops.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gpu_timing.h"

namespace {

using kiln::DType;
using kiln::Tensor;

struct Shape2 {
  int64_t rows, cols;
  DType dtype;
  const char* what;
};

}  // namespace

int main(int argc, char** argv) {
  if (!kiln::cuda::is_available()) {
    std::printf("no GPU visible\n");
    return 0;
  }
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int warmup = 3, steps = quick ? 3 : 20;
  const int64_t rows = quick ? 1024 : 16384;
  const kiln::Device gpu = kiln::Device::cuda(0);
  kiln::Generator gen(1);
  const kiln::TensorOptions f32{.dtype = DType::Float32, .device = gpu};
  const Tensor scale = kiln::full({1}, 0.5, f32), amax = kiln::zeros({1}, f32);

  std::printf("%-44s %9s %9s %7s\n", "kernel", "ms", "GB/s", "copy%");
  const std::vector<Shape2> shapes = {{rows, 768, DType::Float32, "x of q/k/v, fc1 (float32 residual stream)"},
                                      {rows, 768, DType::BFloat16, "dY of attention-out, fc2"},
                                      {rows, 2304, DType::BFloat16, "dY of stacked q/k/v"},
                                      {rows, 3072, DType::BFloat16, "x of fc2 (GELU out), dY of fc1"}};
  for (const Shape2& s : shapes) {
    const Tensor x = kiln::randn({s.rows, s.cols}, f32, &gen).to(s.dtype);
    const double n = static_cast<double>(s.rows * s.cols);
    const double in_bytes = n * static_cast<double>(kiln::element_size(s.dtype));
    Tensor y = kiln::empty_like(x);
    const double copy_ms = kiln::bench::median_step_ms(warmup, steps, [&] { y.copy_(x); });
    const double copy_bw = 2 * in_bytes / (copy_ms * 1e-3) / 1e9;
    std::printf("%s (%lld, %lld) %s\n", s.what, static_cast<long long>(s.rows), static_cast<long long>(s.cols),
                std::string(kiln::dtype_name(s.dtype)).c_str());
    auto report = [&](const char* name, double ms, double bytes) {
      const double bw = bytes / (ms * 1e-3) / 1e9;
      std::printf("  %-42s %9.4f %9.1f %6.1f%%\n", name, ms, bw, 100 * bw / copy_bw);
    };
    report("copy (read + write)", copy_ms, 2 * in_bytes);
    Tensor q, qt, sums;
    report("quantize e4m3",
           kiln::bench::median_step_ms(warmup, steps,
                                       [&] { q = kiln::internal::fp8_quantize(x, DType::Float8_e4m3fn, scale, amax); }),
           in_bytes + n);
    report("quantize_pair e4m3",
           kiln::bench::median_step_ms(
               warmup, steps,
               [&] { std::tie(q, qt) = kiln::internal::fp8_quantize_pair(x, DType::Float8_e4m3fn, scale, amax); }),
           in_bytes + 2 * n);
    report("quantize_pair e5m2 + sums",
           kiln::bench::median_step_ms(
               warmup, steps,
               [&] { std::tie(q, qt) = kiln::internal::fp8_quantize_pair(x, DType::Float8_e5m2, scale, amax, &sums); }),
           in_bytes + 2 * n);
    if (s.dtype != DType::Float32 && s.cols == 3072) {
      // fc2's input: the GELU of fc1's output, applied in the quantisation, against the GELU kernel alone (which the
      // fused pass replaces together with the quantisation of its output).
      report("gelu (read + write, the unfused op)",
             kiln::bench::median_step_ms(warmup, steps, [&] { y = kiln::internal::gelu(x); }), 2 * in_bytes);
      // fc1's output gradient: the gradient through the GELU taken in the quantisation, against gelu_backward alone.
      const Tensor h = kiln::randn({s.rows, s.cols}, f32, &gen).to(s.dtype);
      report("gelu_backward (2 reads + write, the unfused op)",
             kiln::bench::median_step_ms(warmup, steps, [&] { y = kiln::internal::gelu_backward(x, h); }),
             3 * in_bytes);
      report("quantize_pair e5m2 + sums through gelu, fused",
             kiln::bench::median_step_ms(warmup, steps,
                                         [&] {
                                           std::tie(q, qt) = kiln::internal::fp8_quantize_pair_through_gelu(
                                               x, h, false, DType::Float8_e5m2, scale, amax, &sums);
                                         }),
             2 * in_bytes + 2 * n);
      report("quantize_pair e4m3 of gelu(x), fused",
             kiln::bench::median_step_ms(warmup, steps,
                                         [&] {
                                           std::tie(q, qt) = kiln::internal::fp8_quantize_pair(
                                               x, DType::Float8_e4m3fn, scale, amax, nullptr,
                                               kiln::internal::Fp8Activation::Gelu);
                                         }),
             in_bytes + 2 * n);
    }
  }

  // The products of BERT-base's Linears: (M, K) x (N, K)^T.
  std::printf("\n%-44s %9s %9s %9s\n", "product (M, N, K)", "fp8 ms", "bf16 ms", "fp8 TF/s");
  struct Gemm {
    int64_t m, n, k;
    bool fast;
    const char* what;
  };
  const std::vector<Gemm> gemms = {
      {rows, 2304, 768, true, "q/k/v forward"}, {rows, 3072, 768, true, "fc1 forward"},
      {rows, 768, 3072, true, "fc2 forward"},   {rows, 768, 3072, false, "fc1 dX"},
      {3072, 768, rows, false, "fc1 dW"},       {rows, 768, 768, true, "attention-out forward"}};
  const Tensor one = kiln::ones({1}, f32);
  for (const Gemm& g : gemms) {
    const Tensor a = kiln::internal::fp8_quantize(kiln::randn({g.m, g.k}, f32, &gen), DType::Float8_e4m3fn, one, amax);
    const Tensor b = kiln::internal::fp8_quantize(kiln::randn({g.n, g.k}, f32, &gen), DType::Float8_e4m3fn, one, amax);
    const Tensor a16 = kiln::randn({g.m, g.k}, f32, &gen).to(DType::BFloat16);
    const Tensor b16 = kiln::randn({g.k, g.n}, f32, &gen).to(DType::BFloat16);
    Tensor out;
    const double fp8_ms = kiln::bench::median_step_ms(warmup, steps, [&] {
      out = kiln::internal::fp8_gemm(a, b, one, one, DType::BFloat16, Tensor(), nullptr, g.fast);
    });
    const double bf16_ms = kiln::bench::median_step_ms(warmup, steps, [&] { out = kiln::matmul(a16, b16); });
    const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
    char label[96];
    std::snprintf(label, sizeof label, "%s (%lld, %lld, %lld)%s", g.what, static_cast<long long>(g.m),
                  static_cast<long long>(g.n), static_cast<long long>(g.k), g.fast ? " fast" : "");
    std::printf("%-44s %9.4f %9.4f %9.1f  (%.2fx bf16)\n", label, fp8_ms, bf16_ms, flops / (fp8_ms * 1e-3) / 1e12,
                bf16_ms / fp8_ms);
  }
  return 0;
}
