// bench/bench_cuda_matmul.cpp — GPU matmul throughput through kiln (cuBLASLt underneath), to compare
// side by side with bench/pytorch_matmul.py, which times the same products the same way.
//
//   ./build/bench/bench_cuda_matmul               n = 8192: bfloat16, float16, float32 (TF32)
//   ./build/bench/bench_cuda_matmul --n 4096 --reps 20
//   ./build/bench/bench_cuda_matmul --linear-grads   a linear layer's gradients at BERT's shapes, each way kiln can
//                                                    compute them (below); --float32 for float32 (TF32) layers
//
// Each case: random (n, n) operands on cuda:0, 3 untimed products (cuBLASLt's algorithm choice, the
// workspace and the allocator's cache all settle there), then 5 trials of --reps products each,
// timed with CUDA events around the whole trial. TFLOP/s = 2 n^3 / (trial time / reps); the best and
// the median trial are printed. Without a GPU it prints "no GPU visible" and exits 0.
#include <kiln/kiln.h>
#include <kiln/tensor/cuda.h>

#include "kiln/tensor/backend.h"       // backend(device).matmul_epilogue
#include "kiln/tensor/internal_ops.h"  // internal::mm, internal::mm_with_row_sums, internal::sum: raw ops

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

template <typename F>
Result time_calls(F&& call, int reps) {
  for (int i = 0; i < 3; ++i) call();
  kiln::cuda::synchronize(0);
  std::vector<double> trials;
  for (int t = 0; t < 5; ++t) {
    kiln::cuda::Event start(true), stop(true);
    start.record();
    for (int i = 0; i < reps; ++i) call();
    stop.record();
    stop.synchronize();
    trials.push_back(static_cast<double>(start.elapsed_ms(stop)) / reps);
  }
  std::sort(trials.begin(), trials.end());
  return {trials.front(), trials[trials.size() / 2]};
}

Result time_matmul(int64_t n, kiln::DType dtype, int reps) {
  using kiln::Tensor;
  const kiln::TensorOptions opts{.dtype = dtype, .device = kiln::Device::cuda(0)};
  Tensor a = kiln::randn({n, n}, opts), b = kiln::randn({n, n}, opts);
  return time_calls([&] { Tensor c = kiln::matmul(a, b); }, reps);
}

// A bfloat16 (or float32, TF32 products) linear layer y = x W^T + b over 16384 tokens (BERT at batch 128, sequence
// 128), at each shape BERT-base has: the forward product with its bias, the input gradient g W, and the weight and
// bias gradients g^T x and the column sums of g computed four ways: as mm_with_row_sums does (one product with a
// column of ones beside x, or the epilogue), in one product whose epilogue sums (the backend's matmul_epilogue), or a
// plain product and a reduction of g or a product of g^T with a column of ones; each stored
// in bfloat16 or float32 (the widening product autocast's backward uses for float32 parameters). Also the weight
// gradient's transpose x^T g as a product, and that product transposed into W's layout.
void time_linear_grads(int reps, kiln::DType dtype) {
  using kiln::DType;
  using kiln::Tensor;
  namespace in = kiln::internal;
  const kiln::TensorOptions opts{.dtype = dtype, .device = kiln::Device::cuda(0)};
  const int64_t tokens = 16384;
  const std::pair<int64_t, int64_t> shapes[] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 30522}};
  for (const auto& [in_f, out_f] : shapes) {
    Tensor x = kiln::randn({tokens, in_f}, opts), w = kiln::randn({out_f, in_f}, opts);
    // g as a product's output is: rows padded to 16 bytes (30522 outputs: a pitch of 30528).
    const int64_t pitch = (out_f + 7) / 8 * 8;
    Tensor bias = kiln::randn({out_f}, opts), g = in::narrow(kiln::randn({tokens, pitch}, opts), 1, 0, out_f);
    const double flops = 2.0 * static_cast<double>(tokens) * static_cast<double>(in_f) * static_cast<double>(out_f);
    auto report = [&](const char* what, const Result& r) {
      std::printf("linear %5lld -> %5lld  %-34s median %7.3f ms %6.1f TFLOP/s (best %7.3f ms)\n",
                  static_cast<long long>(in_f), static_cast<long long>(out_f), what, r.median_ms,
                  flops / (r.median_ms * 1e-3) / 1e12, r.best_ms);
    };
    report("forward x W^T + b", time_calls([&] { Tensor y = kiln::nn::linear(x, w, bias); }, reps));
    report("input gradient g W", time_calls([&] { Tensor d = in::mm(g, w, dtype); }, reps));
    const Tensor ones = kiln::ones({tokens, 1}, opts);
    const std::vector<DType> outs = dtype == DType::Float32 ? std::vector<DType>{DType::Float32}
                                                            : std::vector<DType>{DType::BFloat16, DType::Float32};
    for (DType out : outs) {
      const std::string in_type = out == DType::Float32 ? ", float32" : ", bfloat16";
      auto named = [&](const char* what) { return std::string(what) + in_type; };
      const Tensor gt = in::transpose(g, 0, 1);  // (out, tokens): the row sums of g^T are the bias gradient
      report(named("dW, db: mm_with_row_sums").c_str(),
             time_calls([&] { auto r = in::mm_with_row_sums(gt, x, out); }, reps));
      {
        kiln::TensorOptions out_opts = opts;
        out_opts.dtype = out;
        Tensor d = in::empty({1, out_f, in_f}, out_opts), s = in::empty({out_f}, out_opts);
        const Tensor gt3 = in::unsqueeze(gt, 0);
        const Tensor x3 = in::unsqueeze(x, 0);
        if (kiln::backend(d.device()).matmul_epilogue(d, gt3, x3, {.bias = {}, .row_sums = s}))
          report(named("dW, db: epilogue sums").c_str(),
                 time_calls([&] { kiln::backend(d.device()).matmul_epilogue(d, gt3, x3, {.bias = {}, .row_sums = s}); },
                            reps));
      }
      report(named("dW, db: product + column sum").c_str(), time_calls(
                                                                [&] {
                                                                  Tensor d = in::mm(gt, x, out);
                                                                  Tensor s = in::sum(g, {0}, false, out);
                                                                },
                                                                reps));
      report(named("dW, db: product + ones product").c_str(), time_calls(
                                                                  [&] {
                                                                    Tensor d = in::mm(gt, x, out);
                                                                    Tensor s = in::mm(gt, ones, out);
                                                                  },
                                                                  reps));
      report(named("dW alone").c_str(), time_calls([&] { Tensor d = in::mm(gt, x, out); }, reps));
      const Tensor xt = in::transpose(x, 0, 1);
      report(named("dW^T = x^T g").c_str(), time_calls([&] { Tensor d = in::mm(xt, g, out); }, reps));
      report(named("dW^T = x^T g, transposed").c_str(), time_calls(
                                                            [&] {
                                                              Tensor d = in::mm(xt, g, out);
                                                              Tensor w = in::contiguous(in::transpose(d, 0, 1));
                                                            },
                                                            reps));
      report(named("db alone: column sum").c_str(), time_calls([&] { Tensor s = in::sum(g, {0}, false, out); }, reps));
      report(named("db alone: ones product").c_str(), time_calls([&] { Tensor s = in::mm(gt, ones, out); }, reps));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 8192;
  int reps = 10;
  bool linear_grads = false, float32 = false;
  for (int i = 1; i < argc; i += 2) {
    if (std::strcmp(argv[i], "--linear-grads") == 0 || std::strcmp(argv[i], "--float32") == 0) {
      bool& flag = std::strcmp(argv[i], "--float32") == 0 ? float32 : linear_grads;
      flag = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--n N] [--reps R] [--linear-grads [--float32]]\n", argv[0]);
      return EXIT_FAILURE;
    }
    if (std::strcmp(argv[i], "--n") == 0) n = std::strtoll(argv[i + 1], nullptr, 10);
    else if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: %s [--n N] [--reps R] [--linear-grads [--float32]]\n", argv[0]);
      return EXIT_FAILURE;
    }
  }
  if (float32 && !linear_grads) {
    std::fprintf(stderr, "%s: --float32 applies to --linear-grads (the n x n products already run every dtype)\n",
                 argv[0]);
    return EXIT_FAILURE;
  }
  if (!kiln::cuda::is_available()) {
    std::printf("no GPU visible\n");
    return 0;
  }
  kiln::manual_seed(0);
  if (linear_grads) {
    time_linear_grads(reps, float32 ? kiln::DType::Float32 : kiln::DType::BFloat16);
    return 0;
  }
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
