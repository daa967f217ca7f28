// The math path of scaled_dot_product_attention on the GPU, where its probabilities (masked softmax, dead rows,
// dropout) run in one kernel each way (kiln/layers/cuda/attention_probs.cu): outputs, attention weights and the
// gradients of q, k and v against the CPU's math path (its unfused ops, in float32 on the values the dtype holds), with
// the same dropout mask for the same generator seed; no mask, Bool key padding with fully masked samples, causal,
// rows of 8 to 1024 keys (whole and partial 128-key chunks), float32, bfloat16 and float16; NaN and masked keys in
// backward; and that the kernels, not the unfused ops, ran. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kiln/layers/attention.h"
#include "kiln/profiler/profiler.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/generator.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

constexpr Device kGpu = Device::cuda(0);

// max |actual - expected| <= tol * max(max |expected|, 1e-3), and no NaN.
void expect_close(const Tensor& actual, const Tensor& expected, double tol, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::vector<double> a = values(actual), e = values(expected);
  double err = 0, scale = 1e-3;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_FALSE(std::isnan(a[i])) << what << ": NaN at " << i;
    scale = std::max(scale, std::abs(e[i]));
    if (std::abs(a[i] - e[i]) > err) err = std::abs(a[i] - e[i]), worst = i;
  }
  EXPECT_LE(err, tol * scale) << what << ": worst element " << worst << " is " << a[worst] << ", expected " << e[worst];
}

// (N, 1, 1, S) Bool: sample n may see its first `seen[n]` keys.
Tensor key_padding(const std::vector<int64_t>& seen, int64_t s, Device dev) {
  std::vector<double> m;
  for (int64_t n : seen)
    for (int64_t j = 0; j < s; ++j) m.push_back(j < n ? 1 : 0);
  return make(m, {static_cast<int64_t>(seen.size()), 1, 1, s}, {.dtype = DType::Bool, .device = dev});
}

size_t ops_named(const profiler::Result& r, const std::string& name) {
  size_t n = 0;
  for (const profiler::Event& e : r.events()) n += e.kind == trace::Kind::Op && e.name == name;
  return n;
}

struct Case {
  int64_t n, h, l, s;
  std::vector<int64_t> seen;  // empty: no mask; a 0 is a fully masked sample (dead rows)
  bool causal;
  double p;
};

// The GPU call and the CPU call with the same inputs (rounded to dtype), seed and upstream gradient.
void check_case(const Case& c, DType dtype) {
  SCOPED_TRACE(::testing::Message() << dtype << " (" << c.n << ", " << c.h << ", " << c.l << ", " << c.s << ")"
                                    << (c.seen.empty() ? "" : " key padding") << (c.causal ? " causal" : "")
                                    << " p = " << c.p);
  const int64_t e = 32;
  const Shape qs{c.n, c.h, c.l, e}, ks{c.n, c.h, c.s, e};
  auto leaf = [&](const Shape& shape, uint64_t seed, Device dev) {
    const int64_t count = shape[0] * shape[1] * shape[2] * shape[3];
    Tensor t = make(uniform(count, -2, 2, seed), shape, {.dtype = dtype, .device = kGpu}).to(dev);
    if (!dev.is_cuda()) t = t.to(DType::Float32);  // float32 numbers its dropout draws as the 16-bit types do
    return t.requires_grad_();
  };
  Tensor out_g, weights_g;
  std::vector<Tensor> grads_g;
  std::vector<Tensor> grads_c;
  Tensor out_c, weights_c;
  // float32 products in full float32 on the GPU too (TF32 would round q k^T's inputs to 10 bits), restored after.
  struct Float32Products {
    bool was = cuda::allow_tf32();
    Float32Products() { cuda::set_allow_tf32(false); }
    ~Float32Products() { cuda::set_allow_tf32(was); }
  } float32_products;
  for (const Device dev : {kGpu, Device::cpu()}) {
    Tensor q = leaf(qs, 1, dev), k = leaf(ks, 2, dev), v = leaf(ks, 3, dev);
    nn::AttentionOptions o{.dropout_p = c.p, .is_causal = c.causal};
    Generator gen(77);
    o.generator = &gen;
    if (!c.seen.empty()) o.attn_mask = key_padding(c.seen, c.s, dev);
    profiler::Profile prof;
    nn::AttentionResult r = nn::scaled_dot_product_attention_with_weights(q, k, v, o);
    Tensor upstream =
        make(uniform(r.output.numel(), -1, 1, 4), r.output.shape(), {.dtype = dtype, .device = kGpu}).to(dev);
    if (!dev.is_cuda()) upstream = upstream.to(r.output.dtype());
    r.output.backward(upstream);
    prof.stop();
    if (dev.is_cuda()) {
      EXPECT_EQ(ops_named(prof.result(), "attention_probs"), 1u) << "the forward kernel did not run";
      EXPECT_EQ(ops_named(prof.result(), "attention_probs_backward"), 1u) << "the backward kernel did not run";
      EXPECT_EQ(ops_named(prof.result(), "softmax"), 0u) << "the unfused softmax ran";
      out_g = r.output, weights_g = r.weights, grads_g = {q.grad(), k.grad(), v.grad()};
    } else {
      out_c = r.output, weights_c = r.weights, grads_c = {q.grad(), k.grad(), v.grad()};
    }
  }
  const double tol = dtype == DType::Float32 ? 1e-5 : dtype == DType::BFloat16 ? 2e-2 : 4e-3;
  expect_close(out_g, out_c, tol, "output");
  expect_close(weights_g, weights_c, tol, "weights");
  expect_close(grads_g[0], grads_c[0], 4 * tol, "dq");
  expect_close(grads_g[1], grads_c[1], 4 * tol, "dk");
  expect_close(grads_g[2], grads_c[2], 4 * tol, "dv");
  // The same dropout mask: a weight is 0 on the GPU exactly where it is on the CPU (no probability here underflows).
  const std::vector<double> wg = values(weights_g), wc = values(weights_c);
  size_t mismatched = 0, zeros = 0;
  for (size_t i = 0; i < wg.size(); ++i) {
    mismatched += (wg[i] == 0) != (wc[i] == 0);
    zeros += wc[i] == 0;
  }
  EXPECT_EQ(mismatched, 0u) << "of " << zeros << " zero weights on the CPU";
}

TEST(CudaAttentionProbs, MatchTheCpuMathPath) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU";
  const std::vector<Case> cases = {
      {2, 3, 128, 128, {}, false, 0.0},          {2, 3, 128, 128, {100, 0}, false, 0.1},
      {2, 2, 64, 132, {130, 7}, true, 0.25},     {1, 2, 8, 8, {}, true, 0.5},
      {2, 1, 16, 1024, {1000, 513}, false, 0.1}, {2, 2, 32, 260, {}, false, 0.0},
  };
  for (const Case& c : cases) {
    for (const DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) check_case(c, dt);
  }
}

// Masked keys get exactly 0 gradient, and so do rows with no allowed key even where the upstream gradient is inf
// (as the unfused masked fills' backward gives), and a NaN score makes its row NaN (as softmax). With k and v the
// identity, q k^T is q itself and the output is the weights, so q's gradient is the scores' gradient.
TEST(CudaAttentionProbs, MaskedKeysAndDeadRowsGetZeroGradientAndNaNRowsStayNaN) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU";
  const int64_t s = 16;
  Tensor q = make(uniform(2 * s, -1, 1, 9), {2, 1, 1, s}, {.device = kGpu});
  q.requires_grad_();
  const Tensor mask = key_padding({8, 0}, s, kGpu);  // sample 0 sees 8 keys; sample 1 none
  std::vector<double> identity(s * s, 0.0);
  for (int64_t i = 0; i < s; ++i) identity[i * s + i] = 1;
  const Tensor eye = make(identity, {1, 1, s, s}, {.device = kGpu}).expand({2, 1, s, s});
  nn::AttentionResult r = nn::scaled_dot_product_attention_with_weights(q, eye, eye, {.attn_mask = mask, .scale = 1});
  std::vector<double> up = uniform(2 * s, -1, 1, 10);
  up[s + 3] = std::numeric_limits<double>::infinity();  // sample 1 (its rows are dead)
  r.output.backward(make(up, {2, 1, 1, s}, {.device = kGpu}));
  const std::vector<double> g = values(q.grad()), w = values(r.weights);
  for (int64_t j = 0; j < 8; ++j) EXPECT_NE(g[j], 0.0) << "allowed key " << j;
  for (int64_t j = 8; j < s; ++j) EXPECT_EQ(g[j], 0.0) << "masked key " << j;
  for (int64_t j = 0; j < s; ++j) {
    EXPECT_EQ(g[s + j], 0.0) << "dead row, key " << j;
    EXPECT_EQ(w[s + j], 0.0) << "dead row, key " << j;
  }
  // A NaN score among the allowed keys: the row's weights are NaN.
  std::vector<double> with_nan = values(q);
  with_nan[2] = std::nan("");
  const std::vector<double> wn =
      values(nn::scaled_dot_product_attention_with_weights(make(with_nan, {2, 1, 1, s}, {.device = kGpu}), eye, eye,
                                                           {.attn_mask = mask, .scale = 1})
                 .weights);
  for (int64_t j = 0; j < s; ++j) EXPECT_TRUE(std::isnan(wn[j])) << j;
}

}  // namespace
}  // namespace kiln::testing
