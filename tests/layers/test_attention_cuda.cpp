// scaled_dot_product_attention's fused GPU paths (cuDNN through cudnn-frontend, and kiln's own kernels for
// sequences of at most 128 with 64 per head, which take BERT's shapes) against the math path run in
// float64 on the CPU with the same (float16/bfloat16-rounded) inputs: outputs and dq/dk/dv for BERT-like
// shapes, L != S, causal, additive biases, Bool key-padding masks (fully masked rows too), scale, float16 and
// bfloat16, 3-d inputs and autocast; which path runs; dropout (mask fraction, scaling, gradients against the
// mask the kernel drew, same-seed replay); no cudaMalloc once warm. Skipped without a GPU or without
// cudnn-frontend in the build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "kiln/autograd/autocast.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/layers/attention.h"
#include "kiln/layers/cuda/short_attention.h"  // short_attention_supported
#include "kiln/layers/functional.h"            // nn::linear
#include "kiln/profiler/profiler.h"            // the ops a call runs
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/generator.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

constexpr Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_FUSED_ATTENTION()                                                 \
  do {                                                                                 \
    if (!::kiln::nn::fused_attention_available())                                      \
      GTEST_SKIP() << "needs a GPU and a build with cudnn-frontend (fused attention)"; \
  } while (false)

// A leaf on the GPU in `dtype` with values uniform in [lo, hi).
Tensor gpu_leaf(const Shape& shape, DType dtype, uint64_t seed, double lo = -1, double hi = 1) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  Tensor t = make(uniform(n, lo, hi, seed), shape, {.dtype = dtype, .device = kGpu});
  t.requires_grad_();
  return t;
}

// The same values as a float64 CPU leaf (the reference's input).
Tensor reference_leaf(const Tensor& t) {
  Tensor r = t.detach().cpu().to(DType::Float64);
  r.requires_grad_();
  return r;
}

// max |actual - expected| <= tol * max(max |expected|, 1e-2): a tolerance relative to the tensor's scale,
// which is what 16-bit rounding of inputs and outputs gives. NaN anywhere fails.
void expect_close(const Tensor& actual, const Tensor& expected, double tol, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << " is undefined";
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::vector<double> a = values(actual), e = values(expected);
  double err = 0, scale = 1e-2;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_FALSE(std::isnan(a[i])) << what << ": NaN at " << i;
    scale = std::max(scale, std::abs(e[i]));
    if (std::abs(a[i] - e[i]) > err) {
      err = std::abs(a[i] - e[i]);
      worst = i;
    }
  }
  EXPECT_LE(err, tol * scale) << what << ": worst element " << worst << " is " << a[worst] << ", expected " << e[worst]
                              << " (scale " << scale << ")";
}

struct Tolerance {
  double out, grad;
};
Tolerance tolerance(DType dtype) { return dtype == DType::BFloat16 ? Tolerance{3e-2, 5e-2} : Tolerance{8e-3, 2e-2}; }

// Runs the fused path (asserting it is the one chosen) and the float64 CPU math path on the same values,
// and compares the outputs and the gradients of q, k and v.
void compare_with_math(const Tensor& q, const Tensor& k, const Tensor& v, const nn::AttentionOptions& options,
                       const std::string& what) {
  std::string why;
  ASSERT_NE(nn::attention_backend(q, k, v, options, &why), nn::AttentionBackend::Math) << what << ": " << why;
  Tensor out = nn::scaled_dot_product_attention(q, k, v, options);
  ASSERT_EQ(out.dtype(), q.dtype()) << what;
  Tensor grad_out = make(uniform(out.numel(), -1, 1, 99), out.shape(), {.dtype = out.dtype(), .device = kGpu});
  out.backward(grad_out);

  Tensor q64 = reference_leaf(q), k64 = reference_leaf(k), v64 = reference_leaf(v);
  nn::AttentionOptions ref = options;
  if (ref.attn_mask.defined()) ref.attn_mask = ref.attn_mask.cpu();
  Tensor out64 = nn::scaled_dot_product_attention(q64, k64, v64, ref);
  out64.backward(grad_out.cpu().to(DType::Float64));

  const Tolerance tol = tolerance(q.dtype());
  expect_close(out, out64, tol.out, what + " output");
  expect_close(q.grad(), q64.grad(), tol.grad, what + " dq");
  expect_close(k.grad(), k64.grad(), tol.grad, what + " dk");
  expect_close(v.grad(), v64.grad(), tol.grad, what + " dv");
}

class CudaAttentionFused : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { SKIP_WITHOUT_FUSED_ATTENTION(); }
  DType dtype() const { return GetParam(); }
};

TEST_P(CudaAttentionFused, BertShapes) {
  // (N, H, L, E) = (2, 4, 128, 64), as one BERT-base-like layer with fewer heads.
  compare_with_math(gpu_leaf({2, 4, 128, 64}, dtype(), 1), gpu_leaf({2, 4, 128, 64}, dtype(), 2),
                    gpu_leaf({2, 4, 128, 64}, dtype(), 3), {}, "bert");
}

TEST_P(CudaAttentionFused, QueryAndKeyLengthsDifferAndValueDimDiffers) {
  compare_with_math(gpu_leaf({2, 3, 64, 32}, dtype(), 4), gpu_leaf({2, 3, 96, 32}, dtype(), 5),
                    gpu_leaf({2, 3, 96, 16}, dtype(), 6), {}, "L != S, Ev != E");
}

TEST_P(CudaAttentionFused, Causal) {
  compare_with_math(gpu_leaf({2, 2, 128, 64}, dtype(), 7), gpu_leaf({2, 2, 128, 64}, dtype(), 8),
                    gpu_leaf({2, 2, 128, 64}, dtype(), 9), {.is_causal = true}, "causal");
}

TEST_P(CudaAttentionFused, CausalTopLeftWhenLAndSDiffer) {
  // Query i sees keys j <= i counted from the top-left corner, with L < S and L > S.
  compare_with_math(gpu_leaf({1, 2, 64, 64}, dtype(), 10), gpu_leaf({1, 2, 128, 64}, dtype(), 11),
                    gpu_leaf({1, 2, 128, 64}, dtype(), 12), {.is_causal = true}, "causal L < S");
  compare_with_math(gpu_leaf({1, 2, 128, 64}, dtype(), 13), gpu_leaf({1, 2, 64, 64}, dtype(), 14),
                    gpu_leaf({1, 2, 64, 64}, dtype(), 15), {.is_causal = true}, "causal L > S");
}

TEST_P(CudaAttentionFused, AdditiveBias) {
  // A full (N, H, L, S) bias, and one broadcast over the batch (1, H, L, S), in float32 (cast like the math
  // path does) with some -inf entries.
  const Shape qs{2, 2, 64, 64};
  Tensor full_bias = make(uniform(2 * 2 * 64 * 64, -2, 2, 20), {2, 2, 64, 64}, {.device = kGpu});
  compare_with_math(gpu_leaf(qs, dtype(), 21), gpu_leaf(qs, dtype(), 22), gpu_leaf(qs, dtype(), 23),
                    {.attn_mask = full_bias}, "bias (N, H, L, S)");
  std::vector<double> b = uniform(2 * 64 * 64, -1, 1, 24);
  for (size_t i = 0; i < b.size(); i += 7) b[i] = -kInf;  // never a whole row: 64 is not a multiple of 7
  Tensor head_bias = make(b, {1, 2, 64, 64}, {.device = kGpu});
  compare_with_math(gpu_leaf(qs, dtype(), 25), gpu_leaf(qs, dtype(), 26), gpu_leaf(qs, dtype(), 27),
                    {.attn_mask = head_bias}, "bias (1, H, L, S) with -inf");
  // The same for every query: (N, H, 1, S) and (N, 1, 1, S), which cuDNN broadcasts over the queries.
  std::vector<double> r = uniform(2 * 2 * 64, -2, 2, 28);
  for (size_t i = 0; i < r.size(); i += 5) r[i] = -kInf;
  compare_with_math(gpu_leaf(qs, dtype(), 29), gpu_leaf(qs, dtype(), 30), gpu_leaf(qs, dtype(), 31),
                    {.attn_mask = make(r, {2, 2, 1, 64}, {.device = kGpu})}, "bias (N, H, 1, S) with -inf");
  r.resize(2 * 64);
  compare_with_math(gpu_leaf(qs, dtype(), 32), gpu_leaf(qs, dtype(), 33), gpu_leaf(qs, dtype(), 34),
                    {.attn_mask = make(r, {2, 1, 1, 64}, {.device = kGpu})}, "bias (N, 1, 1, S) with -inf");
}

// A Bool key-padding mask (N, 1, 1, S): true = may attend. Batch 0 keeps its first `keep0` keys, batch 1 none.
Tensor key_padding(int64_t N, int64_t S, int64_t keep0, bool padded_at_start = false) {
  std::vector<double> allowed(static_cast<size_t>(N * S), 0.0);
  for (int64_t j = 0; j < keep0; ++j) allowed[padded_at_start ? S - 1 - j : j] = 1.0;
  return make(allowed, {N, 1, 1, S}, {.dtype = DType::Bool, .device = kGpu});
}

TEST_P(CudaAttentionFused, BoolKeyPaddingMaskWithFullyMaskedRows) {
  // Batch 1 has every key masked: the math path gives zero outputs and gradients there, and so must the
  // fused path.
  const Shape qs{2, 4, 128, 64};
  compare_with_math(gpu_leaf(qs, dtype(), 30), gpu_leaf(qs, dtype(), 31), gpu_leaf(qs, dtype(), 32),
                    {.attn_mask = key_padding(2, 128, 100)}, "key padding");
}

TEST_P(CudaAttentionFused, PaddingAtTheStartWithCausalLeavesDeadRows) {
  // Keys 0..39 padded and a causal mask: queries 0..39 see no key at all.
  const Shape qs{2, 2, 128, 64};
  compare_with_math(gpu_leaf(qs, dtype(), 33), gpu_leaf(qs, dtype(), 34), gpu_leaf(qs, dtype(), 35),
                    {.attn_mask = key_padding(2, 128, 88, /*padded_at_start=*/true), .is_causal = true},
                    "padding + causal");
}

TEST_P(CudaAttentionFused, Scale) {
  const Shape qs{2, 2, 64, 64};
  compare_with_math(gpu_leaf(qs, dtype(), 40), gpu_leaf(qs, dtype(), 41), gpu_leaf(qs, dtype(), 42), {.scale = 0.37},
                    "scale");
}

TEST_P(CudaAttentionFused, ThreeDimensionalInputsAndStridedViews) {
  // (N, L, E) inputs are (N, 1, L, E); and q as a transposed view of (N, L, H, E) memory, as
  // MultiheadAttention makes them.
  compare_with_math(gpu_leaf({3, 64, 32}, dtype(), 43), gpu_leaf({3, 80, 32}, dtype(), 44),
                    gpu_leaf({3, 80, 32}, dtype(), 45), {}, "3-d");
  Tensor base = gpu_leaf({2, 64, 4, 32}, dtype(), 46);
  Tensor q = base.detach().transpose(1, 2);  // (2, 4, 64, 32), rows contiguous, heads interleaved
  q.requires_grad_();
  compare_with_math(q, gpu_leaf({2, 4, 64, 32}, dtype(), 47), gpu_leaf({2, 4, 64, 32}, dtype(), 48), {}, "strided q");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAttentionFused, ::testing::Values(DType::Float16, DType::BFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return info.param == DType::Float16 ? std::string("Float16") : std::string("BFloat16");
                         });

// ---------------------------------------------------------------- which path runs

TEST(CudaAttentionBackend, ChoosesTheFusedPathOnlyWhereItApplies) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU";
  const Shape qs{2, 2, 64, 64};
  Tensor q32 = gpu_leaf(qs, DType::Float32, 50), k32 = gpu_leaf(qs, DType::Float32, 51),
         v32 = gpu_leaf(qs, DType::Float32, 52);
  std::string why;
  // float32 outside autocast: cuDNN has no fused float32 attention, and kiln's own kernels take it only while TF32
  // products are allowed.
  const bool tf32 = cuda::allow_tf32();
  cuda::set_allow_tf32(false);
  EXPECT_EQ(nn::attention_backend(q32, k32, v32, {}, &why), nn::AttentionBackend::Math);
  EXPECT_FALSE(why.empty());
  cuda::set_allow_tf32(true);
  if (cuda::compute_capability(0) >= 80) {
    EXPECT_EQ(nn::attention_backend(q32, k32, v32, {}, &why), nn::AttentionBackend::ShortFused) << why;
  }
  Tensor q32e32 = gpu_leaf({2, 2, 64, 32}, DType::Float32, 66);
  EXPECT_EQ(nn::attention_backend(q32e32, q32e32, q32e32, {}, &why), nn::AttentionBackend::Math);
  cuda::set_allow_tf32(tf32);
  // CPU tensors never take it.
  EXPECT_EQ(nn::attention_backend(q32.cpu(), k32.cpu(), v32.cpu()), nn::AttentionBackend::Math);
  if (!nn::fused_attention_available()) return;
  // Inside a bfloat16 autocast region the same float32 tensors are cast and take it: kiln's kernels for sequences
  // of at most 128 with 64 per head.
  {
    autocast::Guard cast(DeviceType::CUDA, DType::BFloat16);
    EXPECT_EQ(nn::attention_backend(q32, k32, v32, {}, &why), nn::AttentionBackend::ShortFused) << why;
  }
  Tensor q = gpu_leaf(qs, DType::Float16, 53), k = gpu_leaf(qs, DType::Float16, 54),
         v = gpu_leaf(qs, DType::Float16, 55);
  EXPECT_EQ(nn::attention_backend(q, k, v, {}, &why), nn::AttentionBackend::ShortFused) << why;
  // 32 per head, or 192 tokens: cuDNN's.
  Tensor q32h = gpu_leaf({2, 2, 64, 32}, DType::Float16, 64), q192 = gpu_leaf({2, 2, 192, 64}, DType::Float16, 65);
  EXPECT_EQ(nn::attention_backend(q32h, q32h, q32h, {}, &why), nn::AttentionBackend::CudnnFused) << why;
  EXPECT_EQ(nn::attention_backend(q192, q192, q192, {}, &why), nn::AttentionBackend::CudnnFused) << why;
  // A head dim that is not a multiple of 8, a mask that requires grad, broadcast batch dims: math path.
  Tensor q20 = gpu_leaf({2, 2, 64, 20}, DType::Float16, 56), k20 = gpu_leaf({2, 2, 64, 20}, DType::Float16, 57);
  EXPECT_EQ(nn::attention_backend(q20, k20, v), nn::AttentionBackend::Math);
  Tensor mask = gpu_leaf({64, 64}, DType::Float16, 58);
  EXPECT_EQ(nn::attention_backend(q, k, v, {.attn_mask = mask}, &why), nn::AttentionBackend::Math);
  EXPECT_NE(why.find("requires grad"), std::string::npos) << why;
  Tensor k1 = gpu_leaf({1, 2, 64, 64}, DType::Float16, 59), v1 = gpu_leaf({1, 2, 64, 64}, DType::Float16, 60);
  EXPECT_EQ(nn::attention_backend(q, k1, v1), nn::AttentionBackend::Math);
}

TEST(CudaAttentionBackend, MathFallbackStillComputesTheRightValues) {
  // Head dim 20 (not a multiple of 8) in float16 on the GPU takes the math path: same values as float64.
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU";
  Tensor q = gpu_leaf({2, 2, 16, 20}, DType::Float16, 61), k = gpu_leaf({2, 2, 24, 20}, DType::Float16, 62),
         v = gpu_leaf({2, 2, 24, 20}, DType::Float16, 63);
  ASSERT_EQ(nn::attention_backend(q, k, v), nn::AttentionBackend::Math);
  Tensor out = nn::scaled_dot_product_attention(q, k, v, {.is_causal = true});
  Tensor out64 =
      nn::scaled_dot_product_attention(reference_leaf(q), reference_leaf(k), reference_leaf(v), {.is_causal = true});
  expect_close(out, out64, 1e-2, "math fallback");
}

TEST(CudaAttentionAutocast, Float32InputsUnderAutocastRunInBFloat16WithFloat32Gradients) {
  SKIP_WITHOUT_FUSED_ATTENTION();
  const Shape qs{2, 4, 64, 64};
  Tensor q = gpu_leaf(qs, DType::Float32, 70), k = gpu_leaf(qs, DType::Float32, 71),
         v = gpu_leaf(qs, DType::Float32, 72);
  Tensor out;
  {
    autocast::Guard cast(DeviceType::CUDA, DType::BFloat16);
    out = nn::scaled_dot_product_attention(q, k, v);
  }
  EXPECT_EQ(out.dtype(), DType::BFloat16);
  out.to(DType::Float32).sum().backward();
  EXPECT_EQ(q.grad().dtype(), DType::Float32);
  // Reference: float64 on the bfloat16-rounded inputs.
  auto rounded = [](const Tensor& t) { return reference_leaf(t.detach().to(DType::BFloat16)); };
  Tensor q64 = rounded(q), k64 = rounded(k), v64 = rounded(v);
  Tensor out64 = nn::scaled_dot_product_attention(q64, k64, v64);
  out64.sum().backward();
  expect_close(out, out64, 3e-2, "autocast output");
  expect_close(q.grad(), q64.grad(), 6e-2, "autocast dq");
  expect_close(v.grad(), v64.grad(), 6e-2, "autocast dv");
}

// ---------------------------------------------------------------- dropout

// With q = k = 0 every probability is 1/S, and with v the (S, S) identity the output is the dropped,
// rescaled probability matrix itself: out[..., i, j] = keep[..., i, j] / (S (1 - p)).
// with_grad: q, k and v require grad, so the call builds the same graphs as a training call of these shapes.
Tensor identity_values(const Shape& qs) {
  const int64_t S = qs[2];
  return internal::eye(S, S, {.dtype = DType::Float16, .device = kGpu}).expand({qs[0], qs[1], S, S}).contiguous();
}
Tensor dropout_probe(double p, uint64_t seed, const Shape& qs, bool with_grad = false) {
  Tensor q = internal::zeros(qs, {.dtype = DType::Float16, .device = kGpu});
  Tensor k = internal::zeros(qs, {.dtype = DType::Float16, .device = kGpu});
  Tensor v = identity_values(qs);
  if (with_grad) {
    q.requires_grad_();
    k.requires_grad_();
    v.requires_grad_();
  }
  Generator gen(seed);
  return nn::scaled_dot_product_attention(q, k, v, {.dropout_p = p, .generator = &gen}).detach();
}

TEST(CudaAttentionDropout, GraphReplaysDrawNewMasksAsEagerCallsWould) {
  SKIP_WITHOUT_FUSED_ATTENTION();
  const Shape qs{1, 2, 64, 64};
  Tensor q = internal::zeros(qs, {.dtype = DType::Float16, .device = kGpu});
  Tensor k = internal::zeros(qs, {.dtype = DType::Float16, .device = kGpu});
  Tensor v = identity_values(qs);
  Generator gen(11);
  Tensor out;
  cuda::Graph graph;
  graph.capture([&] { out = nn::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.25, .generator = &gen}); }, 1);
  std::vector<double> previous;
  for (int r = 0; r < 2; ++r) {
    const GeneratorState before = gen.state();
    graph.replay();
    const std::vector<double> got = values(out);
    gen.set_state(before);
    const std::vector<double> want =
        values(nn::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.25, .generator = &gen}));
    EXPECT_EQ(got, want) << "replay " << r;
    EXPECT_NE(got, previous) << "replay " << r << " repeated the previous mask";
    previous = got;
  }
}

TEST(CudaAttentionDropout, DropsAboutPAndRescalesTheRest) {
  SKIP_WITHOUT_FUSED_ATTENTION();
  const double p = 0.2;
  const Shape qs{2, 4, 128, 128};
  {
    Tensor q = internal::zeros(qs, {.dtype = DType::Float16, .device = kGpu});
    std::string why;
    ASSERT_EQ(nn::attention_backend(q, q, q, {.dropout_p = p}, &why), nn::AttentionBackend::CudnnFused) << why;
  }
  const std::vector<double> out = values(dropout_probe(p, 5, qs));
  const double kept_value = 1.0 / (128 * (1 - p));
  int64_t zeros = 0, off_value = 0;
  double sum = 0;
  for (double x : out) {
    sum += x;
    if (x == 0) {
      ++zeros;
    } else if (std::abs(x - kept_value) > 1e-2 * kept_value) {
      ++off_value;
    }
  }
  EXPECT_EQ(off_value, 0) << "kept probabilities must be 1/S scaled by 1/(1-p) = " << kept_value;
  const double n = static_cast<double>(out.size());
  // 131072 draws: the standard deviation of the fraction is 0.0011.
  EXPECT_NEAR(static_cast<double>(zeros) / n, p, 0.01);
  EXPECT_NEAR(sum / n, 1.0 / 128, 0.02 / 128);  // E[out] = 1/S: dropout keeps the mean
}

TEST(CudaAttentionDropout, SameGeneratorStateReplaysTheMaskAndOtherSeedsDiffer) {
  SKIP_WITHOUT_FUSED_ATTENTION();
  const Shape qs{1, 2, 64, 64};
  const std::vector<double> a = values(dropout_probe(0.3, 11, qs));
  const std::vector<double> b = values(dropout_probe(0.3, 11, qs));
  const std::vector<double> c = values(dropout_probe(0.3, 12, qs));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Two draws from one generator differ too (each call takes a fresh draw).
  Tensor q = internal::zeros(qs, {.dtype = DType::Float16, .device = kGpu});
  Tensor eye = identity_values(qs);
  Generator gen(13);
  const nn::AttentionOptions options{.dropout_p = 0.3, .generator = &gen};
  const std::vector<double> first = values(nn::scaled_dot_product_attention(q, q, eye, options));
  const std::vector<double> second = values(nn::scaled_dot_product_attention(q, q, eye, options));
  EXPECT_NE(first, second);
}

TEST(CudaAttentionDropout, GradientsMatchTheMathPathWithTheKernelsMask) {
  // The mask depends on the generator state and the positions only, so a probe with the same state and
  // shapes reveals the mask a real call uses; the reference applies that mask in float64.
  SKIP_WITHOUT_FUSED_ATTENTION();
  const double p = 0.25;
  const Shape qs{2, 2, 64, 64};
  const Tensor keep = internal::ne(dropout_probe(p, 21, qs, /*with_grad=*/true), 0);  // (N, H, L, S) Bool
  Tensor q = gpu_leaf(qs, DType::Float16, 80), k = gpu_leaf(qs, DType::Float16, 81),
         v = gpu_leaf(qs, DType::Float16, 82);
  Generator gen(21);
  Tensor out = nn::scaled_dot_product_attention(q, k, v, {.dropout_p = p, .generator = &gen});
  Tensor grad_out = make(uniform(out.numel(), -1, 1, 83), out.shape(), {.dtype = DType::Float16, .device = kGpu});
  out.backward(grad_out);

  Tensor q64 = reference_leaf(q), k64 = reference_leaf(k), v64 = reference_leaf(v);
  Tensor probs = softmax(mul(matmul(q64, transpose(k64, -2, -1)), 1.0 / 8.0), -1);  // (N, H, L, S)
  Tensor dropped = mul(mul(probs, keep.cpu().to(DType::Float64)), 1.0 / (1 - p));
  Tensor out64 = matmul(dropped, v64);
  out64.backward(grad_out.cpu().to(DType::Float64));
  expect_close(out, out64, 1e-2, "dropout output");
  expect_close(q.grad(), q64.grad(), 3e-2, "dropout dq");
  expect_close(k.grad(), k64.grad(), 3e-2, "dropout dk");
  expect_close(v.grad(), v64.grad(), 3e-2, "dropout dv");
}

// ---------------------------------------------------------------- kiln's kernels for short sequences

// Float32 takes them with TF32 products allowed (kiln's default), and is compared as float16 is.
class CudaShortAttention : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no GPU";
    if (cuda::compute_capability(0) < 80) GTEST_SKIP() << "kiln's short-sequence kernels need compute capability 8.0";
    tf32_ = cuda::allow_tf32();
    cuda::set_allow_tf32(true);
  }
  void TearDown() override { cuda::set_allow_tf32(tf32_); }
  DType dtype() const { return GetParam(); }

 private:
  bool tf32_ = true;
};

TEST_P(CudaShortAttention, LengthsBelow128WithKeyPaddingAgainstFloat64) {
  // One block holds 16 to 128 queries and keys: lengths that leave warps idle and key tiles unused, with a key
  // padding mask (batch 1 fully masked) and without.
  for (const int64_t L : {16, 48, 112}) {
    const Shape qs{2, 3, L, 64};
    const std::string what = "L = " + std::to_string(L);
    Tensor q = gpu_leaf(qs, dtype(), 100 + L), k = gpu_leaf(qs, dtype(), 200 + L), v = gpu_leaf(qs, dtype(), 300 + L);
    std::string why;
    ASSERT_EQ(nn::attention_backend(q, k, v, {}, &why), nn::AttentionBackend::ShortFused) << what << ": " << why;
    compare_with_math(q, k, v, {}, what);
    Tensor q2 = gpu_leaf(qs, dtype(), 400 + L), k2 = gpu_leaf(qs, dtype(), 500 + L),
           v2 = gpu_leaf(qs, dtype(), 600 + L);
    const nn::AttentionOptions masked{.attn_mask = key_padding(2, L, L - 8)};
    ASSERT_EQ(nn::attention_backend(q2, k2, v2, masked, &why), nn::AttentionBackend::ShortFused) << what << ": " << why;
    compare_with_math(q2, k2, v2, masked, what + " with key padding");
  }
}

TEST_P(CudaShortAttention, PackedProjectionGivesItsGradientAsOneBufferWithTheSameValues) {
  // q, k and v as the thirds of one (N, L, 3, H, 64) projection output, as BERT's fused QKV gives them: the
  // gradient lands in one buffer of that layout, bit for bit what separate q, k and v get.
  const int64_t N = 2, L = 128, H = 3;
  Tensor qkv = gpu_leaf({N, L, 3, H, 64}, dtype(), 700);
  auto third = [&](const Tensor& t, int64_t i) { return t.select(2, i).permute({0, 2, 1, 3}); };
  Tensor out = nn::scaled_dot_product_attention(third(qkv, 0), third(qkv, 1), third(qkv, 2));
  Tensor grad_out = make(uniform(out.numel(), -1, 1, 701), out.shape(), {.dtype = dtype(), .device = kGpu});
  out.backward(grad_out);

  Tensor q = third(qkv, 0).detach().contiguous(), k = third(qkv, 1).detach().contiguous(),
         v = third(qkv, 2).detach().contiguous();
  for (Tensor* t : {&q, &k, &v}) t->requires_grad_();
  std::string why;
  ASSERT_EQ(nn::attention_backend(q, k, v, {}, &why), nn::AttentionBackend::ShortFused) << why;
  Tensor out2 = nn::scaled_dot_product_attention(q, k, v);
  out2.backward(grad_out);
  EXPECT_EQ(values(out), values(out2));
  EXPECT_EQ(values(third(qkv.grad(), 0)), values(q.grad()));
  EXPECT_EQ(values(third(qkv.grad(), 1)), values(k.grad()));
  EXPECT_EQ(values(third(qkv.grad(), 2)), values(v.grad()));
}

TEST_P(CudaShortAttention, PackedGradientsComeWithTheirColumnSums) {
  // The backward of packed q, k, v also sums the gradient buffer's columns over every token, as stored: the fused
  // QKV projection's bias gradient, offered to its Linear. Against float64 sums of the buffer, and through a Linear
  // (whose bias gradient then is those sums) against float64 column sums of what its output received.
  const int64_t N = 3, L = 128, H = 2, D = 32;
  Tensor qkv = gpu_leaf({N, L, 3, H, 64}, dtype(), 710);
  auto third = [&](const Tensor& t, int64_t i) { return t.select(2, i).permute({0, 2, 1, 3}); };
  {
    NoGradGuard no_grad;
    const Tensor q = third(qkv.detach(), 0), k = third(qkv.detach(), 1), v = third(qkv.detach(), 2);
    const nn::cuda_impl::ShortAttentionConfig cfg{.scale = 0.125};
    const nn::cuda_impl::ShortAttentionForward f = nn::cuda_impl::short_attention_forward(q, k, v, {}, cfg, {});
    const Tensor d_out = make(uniform(f.out.numel(), -1, 1, 711), f.out.shape(), {.dtype = dtype(), .device = kGpu});
    const nn::cuda_impl::FusedAttentionGrads g =
        nn::cuda_impl::short_attention_backward(q, k, v, f.out, d_out, f.stats, f.keep, {}, cfg);
    ASSERT_TRUE(g.packed.defined() && g.packed_sums.defined());
    const Tensor ref = g.packed.cpu().to(DType::Float64).reshape({N * L, 3 * H * 64}).sum({0});
    expect_close(g.packed_sums, ref, 1e-5, "the buffer's column sums");
  }
  Tensor x = gpu_leaf({N, L, D}, dtype(), 712), w = gpu_leaf({3 * H * 64, D}, dtype(), 713, -0.3, 0.3),
         b = gpu_leaf({3 * H * 64}, dtype(), 714);
  Tensor y = nn::linear(x, w, b);  // (N, L, 3 H 64)
  y.retain_grad();
  Tensor y5 = y.view({N, L, 3, H, 64});
  Tensor out = nn::scaled_dot_product_attention(third(y5, 0), third(y5, 1), third(y5, 2));
  out.backward(make(uniform(out.numel(), -1, 1, 715), out.shape(), {.dtype = dtype(), .device = kGpu}));
  ASSERT_TRUE(y.grad().defined() && b.grad().defined());
  const Tensor want = y.grad().cpu().to(DType::Float64).reshape({N * L, 3 * H * 64}).sum({0});
  expect_close(b.grad(), want, dtype() == DType::BFloat16 ? 1e-2 : 2e-3, "the QKV bias gradient");
}

TEST_P(CudaShortAttention, DropoutDropsWhatTheMathPathDropsForTheSameGeneratorState) {
  // q = k = 0 and v = I: the output is the dropped, rescaled probabilities themselves. The CPU's math path with a
  // generator in the same state drops the same entries (internal::dropout's numbering over (N, H, L, S)).
  const double p = 0.3;
  const Shape qs{2, 2, 64, 64};
  Tensor q = internal::zeros(qs, {.dtype = dtype(), .device = kGpu});
  Tensor v = internal::eye(64, 64, {.dtype = dtype(), .device = kGpu}).expand(qs).contiguous();
  std::string why;
  ASSERT_EQ(nn::attention_backend(q, q, v, {.dropout_p = p}, &why), nn::AttentionBackend::ShortFused) << why;
  Generator gen(31);
  const std::vector<double> got =
      values(nn::scaled_dot_product_attention(q, q, v, {.dropout_p = p, .generator = &gen}));
  Generator cpu_gen(31);
  const std::vector<double> want = values(
      nn::scaled_dot_product_attention_with_weights(q.cpu().to(DType::Float32), q.cpu().to(DType::Float32),
                                                    v.cpu().to(DType::Float32), {.dropout_p = p, .generator = &cpu_gen})
          .output);
  ASSERT_EQ(got.size(), want.size());
  int64_t dropped = 0, differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    dropped += want[i] == 0;
    differ += (got[i] == 0) != (want[i] == 0);
  }
  EXPECT_EQ(differ, 0) << "entries the two paths drop differently";
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(got.size()), p, 0.03);
  const double kept = 1.0 / (64 * (1 - p));
  for (double x : got) {
    if (x != 0) {
      ASSERT_NEAR(x, kept, 1e-2 * kept);
    }
  }
}

TEST_P(CudaShortAttention, ForwardStoresTheKeepBitsItsBackwardReads) {
  // With dropout the forward keeps its mask as bits, one per score (bit j % 8 of byte j / 8 of each query row's 16),
  // and the backward reads them instead of drawing again. The bits must be internal::dropout's decisions for the same
  // draw, computed here on the CPU from the Philox block function: word e % 4 of block e / 4 keeps score e (row-major
  // over (B, H, L, S)) where (word >> 8) < ceil((1 - p) 2^24). The gradients must be those of float64 attention with
  // that mask, with a key padding bias and with lengths that leave warps idle.
  const double p = 0.3;
  const int64_t B = 2, H = 3;
  for (const int64_t L : {48, 128}) {
    const std::string what = "L = " + std::to_string(L);
    const Shape qs{B, H, L, 64};
    const Tensor q = gpu_leaf(qs, dtype(), 800 + L).detach(), k = gpu_leaf(qs, dtype(), 810 + L).detach(),
                 v = gpu_leaf(qs, dtype(), 820 + L).detach();
    Tensor bias = internal::zeros({B, 1, 1, L}, {.dtype = dtype(), .device = kGpu});
    bias.select(0, 1).narrow(2, L - 8, 8).fill_(-30000.0);
    Generator gen(830 + L);
    const GeneratorState draw = internal::draw_for(&gen, kGpu);
    const nn::cuda_impl::ShortAttentionConfig cfg{.scale = 0.125, .dropout_p = p};
    const nn::cuda_impl::ShortAttentionForward f = nn::cuda_impl::short_attention_forward(q, k, v, bias, cfg, draw);
    ASSERT_TRUE(f.keep.defined()) << what;
    ASSERT_EQ(f.keep.dtype(), DType::UInt8) << what;
    ASSERT_EQ(f.keep.shape(), (Shape{B, H, L, 16})) << what;

    const std::vector<double> bytes = values(f.keep);
    const philox::KeepThreshold threshold = philox::keep_threshold(1 - p);
    std::vector<double> mask(static_cast<size_t>(B * H * L * L));
    int64_t wrong = 0, kept = 0;
    for (int64_t e = 0; e < B * H * L * L; ++e) {
      uint32_t w[4];
      philox::block(draw.seed, static_cast<uint64_t>(e) / 4, draw.offset, w);
      const bool want = philox::keep_float(w[e % 4], threshold.below24);
      const int64_t row = e / L, j = e % L;
      const bool got = (static_cast<int64_t>(bytes[static_cast<size_t>(row * 16 + j / 8)]) >> (j % 8)) & 1;
      wrong += got != want;
      kept += want;
      mask[static_cast<size_t>(e)] = want ? 1.0 : 0.0;
    }
    EXPECT_EQ(wrong, 0) << what << ": keep bits that differ from internal::dropout's decisions";
    EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(mask.size()), 1 - p, 0.02) << what;

    const Tensor d_out = make(uniform(f.out.numel(), -1, 1, 840 + L), qs, {.dtype = dtype(), .device = kGpu});
    const nn::cuda_impl::FusedAttentionGrads g =
        nn::cuda_impl::short_attention_backward(q, k, v, f.out, d_out, f.stats, f.keep, bias, cfg);
    Tensor q64 = reference_leaf(q), k64 = reference_leaf(k), v64 = reference_leaf(v);
    const Tensor scores = add(mul(matmul(q64, transpose(k64, -2, -1)), 0.125), bias.cpu().to(DType::Float64));
    const Tensor dropped =
        mul(mul(softmax(scores, -1), make(mask, {B, H, L, L}, {.dtype = DType::Float64})), 1 / (1 - p));
    Tensor out64 = matmul(dropped, v64);
    out64.backward(d_out.cpu().to(DType::Float64));
    const Tolerance tol = tolerance(dtype());
    expect_close(f.out, out64, tol.out, what + " output");
    expect_close(g.dq, q64.grad(), tol.grad, what + " dq");
    expect_close(g.dk, k64.grad(), tol.grad, what + " dk");
    expect_close(g.dv, v64.grad(), tol.grad, what + " dv");
  }
  // A backward with dropout and no keep bits says what it needs.
  const Shape qs{1, 1, 32, 64};
  const Tensor q = gpu_leaf(qs, dtype(), 850).detach();
  const nn::cuda_impl::ShortAttentionConfig cfg{.scale = 0.125, .dropout_p = 0.1};
  const nn::cuda_impl::ShortAttentionForward f = nn::cuda_impl::short_attention_forward(q, q, q, {}, cfg, {});
  expect_error([&] { nn::cuda_impl::short_attention_backward(q, q, q, f.out, q, f.stats, {}, {}, cfg); },
               {"short_attention_backward", "keep bits", "undefined"});
  // Keep bits of another shape (half of each row's bytes) are refused, naming the shape expected and the one given.
  expect_error(
      [&] { nn::cuda_impl::short_attention_backward(q, q, q, f.out, q, f.stats, f.keep.narrow(3, 0, 8), {}, cfg); },
      {"short_attention_backward", "keep bits", "(1, 1, 32, 16)", "[1, 1, 32, 8]"});
}

TEST_P(CudaShortAttention, SaysWhyItDoesNotApply) {
  auto why_not = [&](const Shape& qs, const Tensor& bias = {}) {
    Tensor q = internal::zeros(qs, {.dtype = dtype(), .device = kGpu});
    std::string why;
    EXPECT_FALSE(nn::cuda_impl::short_attention_supported(q, q, q, bias, false, &why)) << qs[2] << " x " << qs[3];
    return why;
  };
  EXPECT_NE(why_not({2, 2, 64, 32}).find("64 per head"), std::string::npos);
  EXPECT_NE(why_not({2, 2, 144, 64}).find("up to 128"), std::string::npos);
  EXPECT_NE(why_not({2, 2, 40, 64}).find("multiple of 16"), std::string::npos);
  EXPECT_NE(why_not({0, 2, 64, 64}).find("empty input"), std::string::npos);
  const Tensor per_query = internal::zeros({2, 1, 64, 64}, {.dtype = dtype(), .device = kGpu});
  EXPECT_NE(why_not({2, 2, 64, 64}, per_query).find("one row of keys"), std::string::npos);
  Tensor q64 = internal::zeros({2, 2, 64, 64}, {.dtype = DType::Float64, .device = kGpu});
  std::string why;
  EXPECT_FALSE(nn::cuda_impl::short_attention_supported(q64, q64, q64, {}, false, &why));
  EXPECT_NE(why.find("float16, bfloat16 or float32"), std::string::npos) << why;
  // Float32 runs its products in TF32: only while those are allowed.
  Tensor q32 = internal::zeros({2, 2, 64, 64}, {.dtype = DType::Float32, .device = kGpu});
  const bool tf32 = cuda::allow_tf32();
  cuda::set_allow_tf32(false);
  EXPECT_FALSE(nn::cuda_impl::short_attention_supported(q32, q32, q32, {}, false, &why));
  EXPECT_NE(why.find("TF32"), std::string::npos) << why;
  cuda::set_allow_tf32(true);
  EXPECT_TRUE(nn::cuda_impl::short_attention_supported(q32, q32, q32, {}, false, &why)) << why;
  cuda::set_allow_tf32(tf32);
}

TEST_P(CudaShortAttention, BackwardFollowsItsForwardWhenTf32IsTurnedOffBetween) {
  // A float32 forward ran in TF32; TF32 turned off before the backward (a scope that ended) leaves that backward
  // as it was: the same gradients as with TF32 still on, not an error.
  const Shape qs{2, 2, 64, 64};
  Tensor q = gpu_leaf(qs, dtype(), 730), k = gpu_leaf(qs, dtype(), 731), v = gpu_leaf(qs, dtype(), 732);
  std::string why;
  ASSERT_EQ(nn::attention_backend(q, k, v, {}, &why), nn::AttentionBackend::ShortFused) << why;
  const Tensor grad_out = make(uniform(q.numel(), -1, 1, 733), qs, {.dtype = dtype(), .device = kGpu});
  nn::scaled_dot_product_attention(q, k, v).backward(grad_out);
  Tensor q2 = gpu_leaf(qs, dtype(), 730), k2 = gpu_leaf(qs, dtype(), 731), v2 = gpu_leaf(qs, dtype(), 732);
  Tensor out = nn::scaled_dot_product_attention(q2, k2, v2);
  cuda::set_allow_tf32(false);  // TearDown restores it
  out.backward(grad_out);
  EXPECT_EQ(values(q2.grad()), values(q.grad()));
  EXPECT_EQ(values(k2.grad()), values(k.grad()));
  EXPECT_EQ(values(v2.grad()), values(v.grad()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaShortAttention, ::testing::Values(DType::Float16, DType::BFloat16, DType::Float32),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return info.param == DType::Float16    ? std::string("Float16")
                                  : info.param == DType::BFloat16 ? std::string("BFloat16")
                                                                  : std::string("Float32Tf32");
                         });

// ---------------------------------------------------------------- memory

// The GPU ops that turn a mask into cuDNN's bias and the dead-row flags (the profiler's op names).
size_t mask_preparation_ops(const profiler::Result& r) {
  size_t n = 0;
  for (const profiler::Event& e : r.events()) {
    if (e.kind == trace::Kind::Op && (e.name == "eq" || e.name == "max" || e.name == "clamp")) ++n;
  }
  return n;
}

// Inside an AttentionMaskScope, calls with the same mask prepare it once: the second call runs none of the mask's
// ops and gives what a call outside the scope gives, bit for bit (output and gradients); a mask changed in place, or
// another mask, is prepared again. Padding at the start with a causal mask leaves dead rows, so the reused flags
// matter.
TEST(CudaAttentionMaskScope, CallsWithOneMaskPrepareItOnce) {
  SKIP_WITHOUT_FUSED_ATTENTION();
  const Shape qs{2, 2, 128, 64};
  Tensor mask = key_padding(2, 128, 88, /*padded_at_start=*/true);
  const nn::AttentionOptions opts{.attn_mask = mask, .is_causal = true};
  auto run = [&](uint64_t seed, bool scoped_second, profiler::Result* second_profile) {
    Tensor q = gpu_leaf(qs, DType::BFloat16, seed), k = gpu_leaf(qs, DType::BFloat16, seed + 1),
           v = gpu_leaf(qs, DType::BFloat16, seed + 2);
    std::vector<double> out;
    {
      std::optional<nn::AttentionMaskScope> scope;
      if (scoped_second) scope.emplace();
      Tensor first = nn::scaled_dot_product_attention(q, k, v, opts);
      profiler::Profile prof;
      Tensor second = nn::scaled_dot_product_attention(q, k, v, opts);
      prof.stop();
      if (second_profile != nullptr) *second_profile = prof.result();
      (first.to(DType::Float32).sum() + second.to(DType::Float32).sum()).backward();
      out = values(second);
    }
    for (const Tensor& t : {q, k, v}) {
      const std::vector<double> g = values(t.grad());
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  };
  profiler::Result scoped, plain;
  const std::vector<double> with_scope = run(40, true, &scoped), without = run(40, false, &plain);
  EXPECT_EQ(with_scope, without);
  EXPECT_GT(mask_preparation_ops(plain), 0u) << "the mask's preparation ops were not found in the profile";
  EXPECT_EQ(mask_preparation_ops(scoped), 0u) << "the second call inside the scope prepared the mask again";
  // A mask changed in place, or another mask: prepared again, with the values of a call outside any scope.
  NoGradGuard no_grad;
  Tensor q = gpu_leaf(qs, DType::BFloat16, 50), k = gpu_leaf(qs, DType::BFloat16, 51),
         v = gpu_leaf(qs, DType::BFloat16, 52);
  std::vector<double> changed;
  {
    nn::AttentionMaskScope scope;
    (void)nn::scaled_dot_product_attention(q, k, v, opts);
    mask.copy_(key_padding(2, 128, 100, /*padded_at_start=*/true));
    profiler::Profile prof;
    {
      nn::AttentionMaskScope inner;  // an inner scope shares the outer one's entries
      changed = values(nn::scaled_dot_product_attention(q, k, v, opts));
      (void)nn::scaled_dot_product_attention(q, k, v, {.attn_mask = key_padding(2, 128, 60), .is_causal = true});
    }
    prof.stop();
    EXPECT_GE(mask_preparation_ops(prof.result()), 2 * mask_preparation_ops(plain));
  }
  EXPECT_EQ(changed, values(nn::scaled_dot_product_attention(q, k, v, opts)));
}

// A key padding mask (N, 1, 1, S) reaches cuDNN as a bias of that shape, broadcast over the heads and the queries
// inside the kernels, forward and backward: never an (N, 1, L, S) tensor in memory (L times the bytes to read).
TEST(CudaAttentionMaskScope, KeyPaddingMaskIsOneBiasRowPerSequence) {
  SKIP_WITHOUT_FUSED_ATTENTION();
  const Shape qs{2, 4, 128, 64};
  Tensor q = gpu_leaf(qs, DType::BFloat16, 60), k = gpu_leaf(qs, DType::BFloat16, 61),
         v = gpu_leaf(qs, DType::BFloat16, 62);
  profiler::Profile prof;
  Tensor out = nn::scaled_dot_product_attention(q, k, v, {.attn_mask = key_padding(2, 128, 100)});
  out.to(DType::Float32).sum().backward();
  prof.stop();
  std::vector<std::string> seen;
  for (const profiler::Event& e : prof.result().events()) {
    // cuDNN's kernels, or kiln's own for BERT's 128 tokens with 64 per head (this shape)
    if (e.name == "cudnn_attention_forward" || e.name == "cudnn_attention_backward" ||
        e.name == "short_attention_forward" || e.name == "short_attention_backward") {
      seen.push_back(e.shapes);
    }
  }
  ASSERT_EQ(seen.size(), 2u) << "expected one fused forward and one fused backward";
  for (const std::string& shapes : seen) EXPECT_NE(shapes.find("[2, 1, 1, 128] bf16"), std::string::npos) << shapes;
}

TEST(CudaAttentionMemory, NoDeviceMallocOnceWarm) {
  SKIP_WITHOUT_FUSED_ATTENTION();
  const Shape qs{2, 4, 128, 64};
  Tensor q = gpu_leaf(qs, DType::BFloat16, 90), k = gpu_leaf(qs, DType::BFloat16, 91),
         v = gpu_leaf(qs, DType::BFloat16, 92);
  Tensor mask = key_padding(2, 128, 100);
  auto step = [&] {
    q.mutable_grad() = Tensor();
    k.mutable_grad() = Tensor();
    v.mutable_grad() = Tensor();
    Tensor out = nn::scaled_dot_product_attention(q, k, v, {.attn_mask = mask, .dropout_p = 0.1, .is_causal = true});
    out.sum().backward();
  };
  for (int i = 0; i < 3; ++i) step();
  cuda::synchronize();
  const int64_t before = cuda::memory_stats().num_device_mallocs;
  for (int i = 0; i < 5; ++i) step();
  cuda::synchronize();
  EXPECT_EQ(cuda::memory_stats().num_device_mallocs, before);
}

}  // namespace
}  // namespace kiln::testing
