// Scaled dot-product attention against a plain double-loop reference (no mask, Bool and float masks,
// causal, scale, fully masked rows, dropout), its gradients, and nn::MultiheadAttention: PyTorch's names and
// initialisation, values against a loop reference, the key padding mask, batch_first, gradients, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "kiln/layers/attention.h"
#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class AttentionTest : public BackendTest {};

// q (B, L, E), k (B, S, E), v (B, S, Ev) row-major; allowed(b, i, j) and bias(b, i, j) describe the mask.
// Rows without any allowed key give zeros (kiln's documented choice).
std::vector<double> reference_attention(const std::vector<double>& q, const std::vector<double>& k,
                                        const std::vector<double>& v, int64_t B, int64_t L, int64_t S, int64_t E,
                                        int64_t Ev, double scale,
                                        const std::function<bool(int64_t, int64_t, int64_t)>& allowed = {},
                                        const std::function<double(int64_t, int64_t, int64_t)>& bias = {}) {
  std::vector<double> out(static_cast<size_t>(B * L * Ev), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> s(static_cast<size_t>(S));
      std::vector<bool> ok(static_cast<size_t>(S), true);
      double mx = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += q[(b * L + i) * E + e] * k[(b * S + j) * E + e];
        s[j] = dot * scale + (bias ? bias(b, i, j) : 0.0);
        ok[j] = (!allowed || allowed(b, i, j)) && std::isfinite(s[j]);
        if (ok[j]) mx = std::max(mx, s[j]);
      }
      if (mx == -INFINITY) continue;  // fully masked: zeros
      double z = 0;
      for (int64_t j = 0; j < S; ++j) z += ok[j] ? std::exp(s[j] - mx) : 0.0;
      for (int64_t j = 0; j < S; ++j) {
        const double p = ok[j] ? std::exp(s[j] - mx) / z : 0.0;
        for (int64_t e = 0; e < Ev; ++e) out[(b * L + i) * Ev + e] += p * v[(b * S + j) * Ev + e];
      }
    }
  }
  return out;
}

struct Qkv {
  int64_t B = 2, L = 3, S = 4, E = 5, Ev = 2;
  std::vector<double> q = uniform(B * L * E, -1, 1, 1), k = uniform(B * S * E, -1, 1, 2),
                      v = uniform(B * S * Ev, -1, 1, 3);
};

TEST_P(AttentionTest, SdpaMatchesLoopReferenceWithoutMask) {
  Qkv d;
  Tensor q = make(d.q, {d.B, d.L, d.E}, opts()), k = make(d.k, {d.B, d.S, d.E}, opts()),
         v = make(d.v, {d.B, d.S, d.Ev}, opts());
  expect_values(nn::scaled_dot_product_attention(q, k, v), {d.B, d.L, d.Ev},
                reference_attention(d.q, d.k, d.v, d.B, d.L, d.S, d.E, d.Ev, 1 / std::sqrt(5.0)), 1e-5, 1e-6);
  // A custom scale, and non-contiguous inputs.
  expect_values(nn::scaled_dot_product_attention(non_contiguous(q), k, non_contiguous(v), {.scale = 0.7}),
                {d.B, d.L, d.Ev}, reference_attention(d.q, d.k, d.v, d.B, d.L, d.S, d.E, d.Ev, 0.7), 1e-5, 1e-6);
}

TEST_P(AttentionTest, SdpaBoolFloatAndCausalMasks) {
  Qkv d;
  Tensor q = make(d.q, {d.B, d.L, d.E}, opts()), k = make(d.k, {d.B, d.S, d.E}, opts()),
         v = make(d.v, {d.B, d.S, d.Ev}, opts());
  const double scale = 1 / std::sqrt(5.0);
  // Bool (L, S), broadcast over the batch: true = may attend.
  auto allowed = [](int64_t, int64_t i, int64_t j) { return (i + 2 * j) % 3 != 0; };
  std::vector<double> bm;
  for (int64_t i = 0; i < d.L; ++i)
    for (int64_t j = 0; j < d.S; ++j) bm.push_back(allowed(0, i, j) ? 1 : 0);
  Tensor bool_mask = make(bm, {d.L, d.S}, {.dtype = DType::Bool, .device = dev()});
  expect_values(nn::scaled_dot_product_attention(q, k, v, {.attn_mask = bool_mask}), {d.B, d.L, d.Ev},
                reference_attention(d.q, d.k, d.v, d.B, d.L, d.S, d.E, d.Ev, scale, allowed), 1e-5, 1e-6);
  // Float (B, L, S), added to the scores, with one -inf.
  std::vector<double> fm = uniform(d.B * d.L * d.S, -2, 2, 9);
  fm[5] = -INFINITY;
  auto bias = [&](int64_t b, int64_t i, int64_t j) { return fm[(b * d.L + i) * d.S + j]; };
  Tensor float_mask = make(fm, {d.B, d.L, d.S}, opts());
  expect_values(nn::scaled_dot_product_attention(q, k, v, {.attn_mask = float_mask}), {d.B, d.L, d.Ev},
                reference_attention(d.q, d.k, d.v, d.B, d.L, d.S, d.E, d.Ev, scale, {}, bias), 1e-5, 1e-6);
  // Causal: key j <= query i (top-left aligned), alone and combined with the Bool mask, with a scale.
  auto causal = [](int64_t, int64_t i, int64_t j) { return j <= i; };
  expect_values(nn::scaled_dot_product_attention(q, k, v, {.is_causal = true}), {d.B, d.L, d.Ev},
                reference_attention(d.q, d.k, d.v, d.B, d.L, d.S, d.E, d.Ev, scale, causal), 1e-5, 1e-6);
  auto both = [&](int64_t b, int64_t i, int64_t j) { return causal(b, i, j) && allowed(b, i, j); };
  expect_values(nn::scaled_dot_product_attention(q, k, v, {.attn_mask = bool_mask, .is_causal = true, .scale = 0.3}),
                {d.B, d.L, d.Ev}, reference_attention(d.q, d.k, d.v, d.B, d.L, d.S, d.E, d.Ev, 0.3, both), 1e-5, 1e-6);
}

TEST_P(AttentionTest, SdpaFourDimsWithPerSampleKeyMask) {
  // (N, H, L, E) with a (N, 1, 1, S) Bool mask, the shape BERT uses; compared per (n, h) slice.
  const int64_t N = 2, H = 2, L = 3, S = 3, E = 4;
  std::vector<double> qd = uniform(N * H * L * E, -1, 1, 4), kd = uniform(N * H * S * E, -1, 1, 5),
                      vd = uniform(N * H * S * E, -1, 1, 6);
  std::vector<double> md = {1, 1, 0, 1, 0, 0};  // sample 0 sees keys 0, 1; sample 1 only key 0
  Tensor out = nn::scaled_dot_product_attention(
      make(qd, {N, H, L, E}, opts()), make(kd, {N, H, S, E}, opts()), make(vd, {N, H, S, E}, opts()),
      {.attn_mask = make(md, {N, 1, 1, S}, {.dtype = DType::Bool, .device = dev()})});
  auto allowed = [&](int64_t b, int64_t, int64_t j) { return md[(b / H) * S + j] != 0; };  // b = n * H + h
  expect_values(out, {N, H, L, E}, reference_attention(qd, kd, vd, N * H, L, S, E, E, 0.5, allowed), 1e-5, 1e-6);
  // Sample 1 may see no key at all: every row of its heads is dead (zeros), found from the (N, 1, 1, S) mask alone;
  // alone and with a causal mask on top (which leaves sample 0's query 0 one key).
  const std::vector<double> dead_md = {1, 0, 1, 0, 0, 0};
  const Tensor dead_mask = make(dead_md, {N, 1, 1, S}, {.dtype = DType::Bool, .device = dev()});
  auto dead_allowed = [&](int64_t b, int64_t, int64_t j) { return dead_md[(b / H) * S + j] != 0; };
  auto causal_allowed = [&](int64_t b, int64_t i, int64_t j) { return dead_allowed(b, i, j) && j <= i; };
  const Tensor q = make(qd, {N, H, L, E}, opts()), k = make(kd, {N, H, S, E}, opts()),
               v = make(vd, {N, H, S, E}, opts());
  expect_values(nn::scaled_dot_product_attention(q, k, v, {.attn_mask = dead_mask}), {N, H, L, E},
                reference_attention(qd, kd, vd, N * H, L, S, E, E, 0.5, dead_allowed), 1e-5, 1e-6);
  expect_values(nn::scaled_dot_product_attention(q, k, v, {.attn_mask = dead_mask, .is_causal = true}), {N, H, L, E},
                reference_attention(qd, kd, vd, N * H, L, S, E, E, 0.5, causal_allowed), 1e-5, 1e-6);
}

TEST_P(AttentionTest, FullyMaskedRowsGiveZerosAndFiniteGradients) {
  Qkv d;
  Tensor q = make(d.q, {d.B, d.L, d.E}, opts()).requires_grad_();
  Tensor k = make(d.k, {d.B, d.S, d.E}, opts()).requires_grad_();
  Tensor v = make(d.v, {d.B, d.S, d.Ev}, opts()).requires_grad_();
  std::vector<double> bm(static_cast<size_t>(d.L * d.S), 1.0);
  for (int64_t j = 0; j < d.S; ++j) bm[1 * d.S + j] = 0;  // query 1 may attend to nothing
  Tensor mask = make(bm, {d.L, d.S}, {.dtype = DType::Bool, .device = dev()});
  Tensor out = nn::scaled_dot_product_attention(q, k, v, {.attn_mask = mask});
  std::vector<double> got = values(out);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t e = 0; e < d.Ev; ++e) EXPECT_EQ(got[(b * d.L + 1) * d.Ev + e], 0.0);
  out.sum().backward();
  for (const Tensor& t : {q, k, v}) EXPECT_TRUE(all(isfinite(t.grad())).item<bool>());
  std::vector<double> gq = values(q.grad());
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t e = 0; e < d.E; ++e) EXPECT_EQ(gq[(b * d.L + 1) * d.E + e], 0.0);
  // A float mask of -inf everywhere does the same.
  Tensor neg = full({d.L, d.S}, -INFINITY, opts());
  EXPECT_EQ(values(nn::scaled_dot_product_attention(q, k, v, {.attn_mask = neg}).abs().sum()), std::vector<double>{0});
}

TEST_P(AttentionTest, EmptyBatchGivesEmptyOutputAndGradients) {
  // No sequences at all (the last batch of a filtered dataset): nothing to compute, nothing to fail. BERT's shape on
  // the GPU is one the fused kernels would otherwise take.
  const Shape qs{0, 4, 128, 64};
  for (const DType dt : {DType::Float32, DType::BFloat16}) {
    Tensor q = internal::zeros(qs, {.dtype = dt, .device = dev()}).requires_grad_();
    Tensor k = internal::zeros(qs, {.dtype = dt, .device = dev()}).requires_grad_();
    Tensor v = internal::zeros(qs, {.dtype = dt, .device = dev()}).requires_grad_();
    Tensor out = nn::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.1});
    EXPECT_EQ(out.shape(), qs);
    out.sum().backward();
    for (const Tensor& t : {q, k, v}) {
      ASSERT_TRUE(t.grad().defined());
      EXPECT_EQ(t.grad().shape(), qs);
    }
  }
}

TEST_P(AttentionTest, DropoutZeroesAndRescalesProbabilities) {
  Qkv d;
  d.L = 8;
  d.S = 8;
  d.q = uniform(d.B * d.L * d.E, -1, 1, 1);
  d.k = uniform(d.B * d.S * d.E, -1, 1, 2);
  d.v = uniform(d.B * d.S * d.Ev, -1, 1, 3);
  Tensor q = make(d.q, {d.B, d.L, d.E}, opts()), k = make(d.k, {d.B, d.S, d.E}, opts()),
         v = make(d.v, {d.B, d.S, d.Ev}, opts());
  Generator g1(5), g2(5);
  auto plain = nn::scaled_dot_product_attention_with_weights(q, k, v);
  auto r1 = nn::scaled_dot_product_attention_with_weights(q, k, v, {.dropout_p = 0.5, .generator = &g1});
  Tensor again = nn::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.5, .generator = &g2});
  expect_values(again, r1.output.shape(), values(r1.output));  // same seed, same result
  expect_values(r1.output, r1.output.shape(), values(matmul(r1.weights, v)), 1e-5, 1e-6);
  std::vector<double> p = values(plain.weights), w = values(r1.weights);
  int64_t zeros_seen = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (w[i] == 0) {
      ++zeros_seen;
    } else {
      EXPECT_NEAR(w[i], 2 * p[i], 1e-5) << i;
    }
  }
  EXPECT_GT(zeros_seen, 20);
  EXPECT_LT(zeros_seen, 108);
}

KILN_INSTANTIATE_BACKENDS(AttentionTest);

TEST(Attention, SdpaGradients) {
  // A mask, when given, is the fourth input (not differentiated), so it travels with the others to each device.
  auto sdpa = [](nn::AttentionOptions o) {
    return [o](const TensorList& in) {
      nn::AttentionOptions with_mask = o;
      if (in.size() > 3) with_mask.attn_mask = in[3];
      return TensorList{nn::scaled_dot_product_attention(in[0], in[1], in[2], with_mask)};
    };
  };
  TensorList qkv = {make_input({2, 3, 4}, -1, 1, 1), make_input({2, 5, 4}, -1, 1, 2), make_input({2, 5, 3}, -1, 1, 3)};
  check_gradients(sdpa({}), qkv);
  check_gradients(sdpa({.is_causal = true, .scale = 0.8}), qkv);
  // Bool mask with a fully masked row, and a float mask.
  Tensor bm = make({1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}, {3, 5}, {.dtype = DType::Bool});
  check_gradients(sdpa({}), {qkv[0], qkv[1], qkv[2], bm});
  check_gradients(sdpa({}), {qkv[0], qkv[1], qkv[2], make(uniform(15, -1, 1, 4), {3, 5}, {.dtype = DType::Float64})});
  // A per-sample key mask (N, 1, S) whose second sample sees no key, alone and with a causal mask on top (rows dead
  // only once both apply: sample 0 may see keys 1 and 3, so its query 0 has none).
  Tensor key_mask = make({0, 1, 0, 1, 0, 0, 0, 0, 0, 0}, {2, 1, 5}, {.dtype = DType::Bool});
  check_gradients(sdpa({}), {qkv[0], qkv[1], qkv[2], key_mask});
  check_gradients(sdpa({.is_causal = true}), {qkv[0], qkv[1], qkv[2], key_mask});
}

TEST(Attention, SdpaBadInput) {
  expect_error(
      [] {
        nn::scaled_dot_product_attention(zeros({2, 3, 4}), zeros({2, 5, 3}), zeros({2, 5, 4}));
      },
      {"scaled_dot_product_attention", "E = 4", "[2, 5, 3]"});
  expect_error(
      [] {
        nn::scaled_dot_product_attention(zeros({2, 3, 4}), zeros({2, 5, 4}), zeros({2, 6, 4}));
      },
      {"scaled_dot_product_attention", "value", "S = 5"});
  expect_error(
      [] {
        nn::scaled_dot_product_attention(zeros({3, 4}), zeros({5, 4}, {.dtype = DType::Float64}), zeros({5, 4}));
      },
      {"scaled_dot_product_attention", "float32", "float64"});
  expect_error(
      [] {
        nn::scaled_dot_product_attention(zeros({3, 4}), zeros({5, 4}), zeros({5, 4}),
                                         {.attn_mask = ones({3, 5}, {.dtype = DType::Int64})});
      },
      {"scaled_dot_product_attention", "attn_mask", "int64"});
  expect_error(
      [] {
        nn::scaled_dot_product_attention(zeros({3, 4}), zeros({5, 4}), zeros({5, 4}), {.attn_mask = zeros({3, 4})});
      },
      {"scaled_dot_product_attention", "attn_mask", "[3, 4]", "[3, 5]"});
  expect_error(
      [] {
        nn::scaled_dot_product_attention(zeros({3, 4}), zeros({5, 4}), zeros({5, 4}), {.dropout_p = 1});
      },
      {"scaled_dot_product_attention", "dropout_p", "[0, 1)"});
  expect_error(
      [] {
        nn::scaled_dot_product_attention(zeros({4}), zeros({5, 4}), zeros({5, 4}));
      },
      {"scaled_dot_product_attention", "at least 2 dims"});
}

// ---------------------------------------------------------------- MultiheadAttention

// y (rows, out) = x (rows, in) W^T + b, row-major doubles.
std::vector<double> ref_linear(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                               int64_t rows, int64_t in, int64_t out, int64_t w_row0 = 0) {
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[w_row0 + o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[(w_row0 + o) * in + i];
      y[r * out + o] = s;
    }
  return y;
}

// MultiheadAttention by loops: project, split heads, attend (reference_attention per head), merge, project.
std::vector<double> reference_mha(nn::MultiheadAttention& mha, const std::vector<double>& x,
                                  const std::vector<double>& kv, int64_t N, int64_t L, int64_t S,
                                  const std::function<bool(int64_t, int64_t, int64_t)>& allowed = {}) {
  const int64_t E = mha.embed_dim, H = mha.num_heads, D = mha.head_dim;
  std::vector<double> w = values(mha.in_proj_weight), b = values(mha.in_proj_bias);
  std::vector<double> q = ref_linear(x, w, b, N * L, E, E, 0), k = ref_linear(kv, w, b, N * S, E, E, E),
                      v = ref_linear(kv, w, b, N * S, E, E, 2 * E);
  // (N, len, H, D) -> (N * H, len, D)
  auto heads = [&](const std::vector<double>& t, int64_t len) {
    std::vector<double> o(t.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < len; ++p)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t e = 0; e < D; ++e) o[((n * H + h) * len + p) * D + e] = t[(n * len + p) * E + h * D + e];
    return o;
  };
  auto per_head = [&](int64_t bh, int64_t i, int64_t j) { return !allowed || allowed(bh / H, i, j); };
  std::vector<double> a = reference_attention(heads(q, L), heads(k, S), heads(v, S), N * H, L, S, D, D,
                                              1 / std::sqrt(static_cast<double>(D)), per_head);
  std::vector<double> merged(static_cast<size_t>(N * L * E));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t p = 0; p < L; ++p)
        for (int64_t e = 0; e < D; ++e) merged[(n * L + p) * E + h * D + e] = a[((n * H + h) * L + p) * D + e];
  return ref_linear(merged, values(mha.out_proj->weight), values(mha.out_proj->bias), N * L, E, E);
}

TEST(MultiheadAttention, NamesShapesAndInitialisationAreTorchs) {
  nn::MultiheadAttention mha(8, 2);
  std::vector<std::pair<std::string, Shape>> got;
  for (const auto& [name, p] : mha.named_parameters()) got.emplace_back(name, p.shape());
  EXPECT_EQ(
      got,
      (std::vector<std::pair<std::string, Shape>>{
          {"in_proj_weight", {24, 8}}, {"in_proj_bias", {24}}, {"out_proj.weight", {8, 8}}, {"out_proj.bias", {8}}}));
  EXPECT_EQ(values(mha.in_proj_bias.abs().sum())[0], 0.0);
  EXPECT_EQ(values(mha.out_proj->bias.abs().sum())[0], 0.0);
  const double xavier = std::sqrt(6.0 / (8 + 24)) * (1 + 1e-6);  // fan_in 8, fan_out 24
  EXPECT_LE(values(mha.in_proj_weight.abs().max())[0], xavier);
  EXPECT_GT(values(mha.in_proj_weight.abs().max())[0], 0.8 * xavier);
  EXPECT_LE(values(mha.out_proj->weight.abs().max())[0], 1 / std::sqrt(8.0) * (1 + 1e-6));
  EXPECT_TRUE(nn::MultiheadAttention(8, 2, {.bias = false}).named_parameters().size() == 2);
}

TEST(MultiheadAttention, MatchesLoopReferenceAndKeyPaddingMask) {
  const int64_t N = 2, L = 3, S = 4, E = 6;
  nn::MultiheadAttention mha(E, 3);
  {
    NoGradGuard no_grad;
    Tensor b = make(uniform(3 * E, -0.5, 0.5, 11), {3 * E});
    mha.in_proj_bias.copy_(b);
    mha.out_proj->bias.copy_(make(uniform(E, -0.5, 0.5, 12), {E}));
  }
  std::vector<double> x = uniform(N * L * E, -1, 1, 13), kv = uniform(N * S * E, -1, 1, 14);
  Tensor xt = make(x, {N, L, E}), kvt = make(kv, {N, S, E});
  expect_values(mha.forward(xt, kvt, kvt).output, {N, L, E}, reference_mha(mha, x, kv, N, L, S), 1e-5, 1e-6);
  // key_padding_mask (N, S), true = padding: sample 0 pads its last key, sample 1 its last two.
  Tensor pad = make({0, 0, 0, 1, 0, 0, 1, 1}, {N, S}, {.dtype = DType::Bool});
  auto allowed = [](int64_t n, int64_t, int64_t j) { return j < (n == 0 ? 3 : 2); };
  auto out = mha.forward(xt, kvt, kvt, pad, {}, /*need_weights=*/true);
  expect_values(out.output, {N, L, E}, reference_mha(mha, x, kv, N, L, S, allowed), 1e-5, 1e-6);
  // Averaged weights: rows sum to one, padded keys get none.
  ASSERT_EQ(out.weights.shape(), (Shape{N, L, S}));
  std::vector<double> w = values(out.weights);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < L; ++i) {
      double s = 0;
      for (int64_t j = 0; j < S; ++j) {
        s += w[(n * L + i) * S + j];
        if (!allowed(n, i, j)) {
          EXPECT_EQ(w[(n * L + i) * S + j], 0.0);
        }
      }
      EXPECT_NEAR(s, 1.0, 1e-6);
    }
  EXPECT_EQ(mha.forward(xt, kvt, kvt, pad, {}, true, false).weights.shape(), (Shape{N, 3, L, S}));
  // Changing the padded keys' values changes nothing.
  std::vector<double> kv2 = kv;
  for (int64_t e = 0; e < E; ++e) kv2[(0 * S + 3) * E + e] += 5, kv2[(1 * S + 2) * E + e] -= 3;
  Tensor kvt2 = make(kv2, {N, S, E});
  expect_values(mha.forward(xt, kvt2, kvt2, pad).output, {N, L, E}, values(out.output), 1e-6, 1e-7);
  // A float key_padding_mask with -inf does the same; a Bool attn_mask (L, S) true = NOT allowed.
  Tensor fpad = masked_fill(zeros({N, S}), pad, -INFINITY);
  expect_values(mha.forward(xt, kvt, kvt, fpad).output, {N, L, E}, values(out.output), 1e-6, 1e-7);
  Tensor block = make({0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0}, {L, S}, {.dtype = DType::Bool});
  auto not_blocked = [](int64_t, int64_t i, int64_t j) { return !((i == 0 && j == 1) || (i == 1 && j == 2)); };
  expect_values(mha.forward(xt, kvt, kvt, {}, block).output, {N, L, E}, reference_mha(mha, x, kv, N, L, S, not_blocked),
                1e-5, 1e-6);
}

TEST(MultiheadAttention, SequenceFirstLayoutMatchesBatchFirst) {
  nn::MultiheadAttention a(4, 2), b(4, 2, {.batch_first = false});
  ASSERT_TRUE(b.load_state_dict(a.state_dict()).missing_keys.empty());
  Tensor x = make(uniform(2 * 3 * 4, -1, 1, 21), {2, 3, 4});  // (N, L, E)
  Tensor ya = a(x);
  Tensor yb = b(transpose(x, 0, 1));  // (L, N, E)
  expect_values(transpose(yb, 0, 1), ya.shape(), values(ya), 1e-6, 1e-7);
}

TEST(MultiheadAttention, Gradients) {
  // Gradients for query, key, value and every parameter: the parameters enter as inputs (float64) and are
  // bound to the module for the call.
  auto mha = std::make_shared<nn::MultiheadAttention>(4, 2);
  Tensor pad = make({0, 0, 1, 0, 0, 0}, {2, 3}, {.dtype = DType::Bool});
  auto fn = [mha, pad](const TensorList& in) {
    mha->in_proj_weight = in[3];
    mha->in_proj_bias = in[4];
    mha->out_proj->weight = in[5];
    mha->out_proj->bias = in[6];
    return TensorList{mha->forward(in[0], in[1], in[2], pad.to(in[0].device())).output};
  };
  check_gradients(fn, {make_input({2, 2, 4}, -1, 1, 1), make_input({2, 3, 4}, -1, 1, 2),
                       make_input({2, 3, 4}, -1, 1, 3), make_input({12, 4}, -1, 1, 4), make_input({12}, -1, 1, 5),
                       make_input({4, 4}, -1, 1, 6), make_input({4}, -1, 1, 7)});
}

TEST(MultiheadAttention, BadInput) {
  expect_error([] { nn::MultiheadAttention(10, 3); }, {"MultiheadAttention", "embed_dim (10)", "num_heads (3)"});
  nn::MultiheadAttention mha(4, 2);
  expect_error(
      [&] {
        mha.forward(zeros({2, 3, 5}), zeros({2, 3, 4}), zeros({2, 3, 4}));
      },
      {"MultiheadAttention", "embed_dim = 4", "[2, 3, 5]"});
  expect_error(
      [&] {
        mha.forward(zeros({2, 3, 4}), zeros({2, 3, 4}), zeros({2, 3, 4}), zeros({2, 4}, {.dtype = DType::Bool}));
      },
      {"MultiheadAttention", "key_padding_mask", "[2, 3]", "[2, 4]"});
  expect_error(
      [&] {
        mha.forward(zeros({2, 3, 4}), zeros({2, 3, 4}), zeros({2, 3, 4}), {}, zeros({2, 2}));
      },
      {"MultiheadAttention", "attn_mask", "[3, 3]", "[2, 2]"});
}

}  // namespace
}  // namespace kiln::testing
