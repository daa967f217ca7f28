// Scaled dot-product attention and MultiheadAttention (attention.h), composed of differentiable ops.
#include "kiln/layers/attention.h"

#include <cmath>
#include <limits>
#include <string>

#include "kiln/autograd/grad_mode.h"  // NoGradGuard for the fully-masked-row test
#include "kiln/layers/functional.h"   // nn::linear, nn::dropout
#include "kiln/layers/init.h"         // xavier_uniform_, zeros_
#include "kiln/tensor/error.h"        // KILN_CHECK

namespace kiln::nn {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

void check_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const char* op = "scaled_dot_product_attention";
  KILN_CHECK(q.defined() && k.defined() && v.defined(), op, ": query, key and value must all be defined tensors");
  KILN_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, op,
             ": expected query (..., L, E), key (..., S, E) and value (..., S, Ev) with at least 2 dims, got shapes ",
             q.shape(), ", ", k.shape(), " and ", v.shape());
  KILN_CHECK(q.is_floating_point() && q.dtype() == k.dtype() && q.dtype() == v.dtype(), op,
             ": query, key and value must share one floating dtype, got ", q.dtype(), ", ", k.dtype(), " and ",
             v.dtype(), "; cast them with .to(dtype)");
  KILN_CHECK(q.device() == k.device() && q.device() == v.device(), op,
             ": query, key and value must be on one device, got ", q.device(), ", ", k.device(), " and ", v.device());
  KILN_CHECK(k.size(-1) == q.size(-1), op, ": key's last dim (", k.size(-1),
             ") must equal query's embedding dim E = ", q.size(-1), "; shapes query ", q.shape(), ", key ", k.shape());
  KILN_CHECK(v.size(-2) == k.size(-2), op, ": value's sequence dim (", v.size(-2),
             ") must equal key's S = ", k.size(-2), "; shapes key ", k.shape(), ", value ", v.shape());
  KILN_CHECK(o.dropout_p >= 0 && o.dropout_p < 1, op, ": dropout_p must lie in [0, 1), got ", o.dropout_p);
  KILN_CHECK(!o.scale || std::isfinite(*o.scale), op, ": scale must be finite, got ", o.scale.value_or(0));
  if (o.attn_mask.defined()) {
    const Tensor& m = o.attn_mask;
    KILN_CHECK(m.dtype() == DType::Bool || m.is_floating_point(), op,
               ": attn_mask must be Bool (true = may attend) or floating (added to the scores), got ", m.dtype(),
               " of shape ", m.shape(), "; convert an integer 0/1 mask with ne(mask, 0)");
    KILN_CHECK(m.device() == q.device(), op, ": attn_mask is on ", m.device(), " but query is on ", q.device(),
               "; move it with .to(device)");
  }
}

// mask broadcastable to `shape` (trailing-aligned, each size 1 or equal, no more dims than shape)?
bool broadcasts_to(const Shape& mask, const Shape& shape) {
  if (mask.size() > shape.size()) return false;
  const size_t off = shape.size() - mask.size();
  for (size_t i = 0; i < mask.size(); ++i)
    if (mask[i] != 1 && mask[i] != shape[off + i]) return false;
  return true;
}

}  // namespace

AttentionResult scaled_dot_product_attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                                          const AttentionOptions& options) {
  check_attention_inputs(q, k, v, options);
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1);
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(E)));
  Tensor scores = mul(matmul(q, transpose(k, -2, -1)), scale);  // (..., L, E) x (..., E, S) -> (..., L, S)

  bool masked = false;
  if (options.attn_mask.defined()) {
    const Tensor& m = options.attn_mask;
    KILN_CHECK(broadcasts_to(m.shape(), scores.shape()), "scaled_dot_product_attention: attn_mask of shape ", m.shape(),
               " does not broadcast to the scores' shape ", scores.shape(),
               " (..., L, S); give it shape (L, S) or (..., L, S) with 1 where it broadcasts");
    scores = m.dtype() == DType::Bool ? masked_fill(scores, logical_not(m), kNegInf) : scores + cast(m, scores.dtype());
    masked = true;
  }
  if (options.is_causal) {
    // allowed[i, j] = j <= i: (L, 1) >= (1, S) -> (L, S).
    const TensorOptions index{.dtype = DType::Int64, .device = q.device()};
    Tensor allowed = ge(unsqueeze(arange(L, index), 1), unsqueeze(arange(S, index), 0));
    scores = masked_fill(scores, logical_not(allowed), kNegInf);
    masked = true;
  }

  Tensor probs;
  if (masked) {
    // softmax of a row that is all -inf is NaN. Such rows get finite stand-in scores, then zero probabilities,
    // so their output and every gradient through them are zero.
    Tensor dead;  // (..., L, 1) Bool
    {
      NoGradGuard no_grad;
      dead = eq(amax(scores.detach(), {-1}, true), kNegInf);
    }
    probs = masked_fill(softmax(masked_fill(scores, dead, 0.0), -1), dead, 0.0);
  } else {
    probs = softmax(scores, -1);
  }
  if (options.dropout_p > 0) probs = dropout(probs, options.dropout_p, /*training=*/true, options.generator);
  return {matmul(probs, v), probs};  // (..., L, S) x (..., S, Ev) -> (..., L, Ev)
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  // The place for a fused GPU kernel (cuDNN / flash attention), chosen per device, dtype and shape; until
  // then every device takes the math path.
  return scaled_dot_product_attention_with_weights(q, k, v, options).output;
}

// ---------------------------------------------------------------- MultiheadAttention

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, MultiheadAttentionOptions options)
    : Module("MultiheadAttention"), embed_dim(embed_dim), num_heads(num_heads), head_dim(0), options(options) {
  KILN_CHECK(embed_dim > 0 && num_heads > 0, "MultiheadAttention: embed_dim and num_heads must be positive, got ",
             embed_dim, " and ", num_heads);
  KILN_CHECK(embed_dim % num_heads == 0, "MultiheadAttention: embed_dim (", embed_dim,
             ") must be divisible by num_heads (", num_heads, "); pick a num_heads that divides it");
  KILN_CHECK(options.dropout >= 0 && options.dropout < 1, "MultiheadAttention: dropout must lie in [0, 1), got ",
             options.dropout);
  head_dim = embed_dim / num_heads;
  in_proj_weight = register_parameter("in_proj_weight", empty({3 * embed_dim, embed_dim}));
  if (options.bias) in_proj_bias = register_parameter("in_proj_bias", empty({3 * embed_dim}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(embed_dim, embed_dim, LinearOptions{options.bias}));
  reset_parameters();
}

void MultiheadAttention::reset_parameters(Generator* gen) {
  // PyTorch's _reset_parameters: xavier_uniform_ over the whole (3E, E) matrix, zero biases; out_proj.weight
  // keeps Linear's default initialisation.
  init::xavier_uniform_(in_proj_weight, 1.0, gen);
  out_proj->reset_parameters(gen);
  if (in_proj_bias.defined()) init::zeros_(in_proj_bias);
  if (out_proj->bias.defined()) init::zeros_(out_proj->bias);
}

MultiheadAttention::Output MultiheadAttention::forward(const Tensor& query_in, const Tensor& key_in,
                                                       const Tensor& value_in, const Tensor& key_padding_mask,
                                                       const Tensor& attn_mask, bool need_weights,
                                                       bool average_attn_weights) {
  const char* layout = options.batch_first ? "(N, L, E)" : "(L, N, E)";
  for (const Tensor* t : {&query_in, &key_in, &value_in}) {
    KILN_CHECK(t->defined() && t->dim() == 3 && t->size(-1) == embed_dim, "MultiheadAttention: expected query, key ",
               "and value of shape ", layout, " with E = embed_dim = ", embed_dim, ", got shapes ",
               query_in.defined() ? query_in.shape() : Shape{}, ", ", key_in.defined() ? key_in.shape() : Shape{},
               " and ", value_in.defined() ? value_in.shape() : Shape{});
  }
  // Work batch first: (N, L, E).
  Tensor query = options.batch_first ? query_in : transpose(query_in, 0, 1);
  Tensor key = options.batch_first ? key_in : transpose(key_in, 0, 1);
  Tensor value = options.batch_first ? value_in : transpose(value_in, 0, 1);
  const int64_t N = query.size(0), L = query.size(1), S = key.size(1), E = embed_dim, H = num_heads;
  KILN_CHECK(key.size(0) == N && value.size(0) == N && value.size(1) == S,
             "MultiheadAttention: query, key and value must share the batch size and key/value the length S; got "
             "shapes ",
             query_in.shape(), ", ", key_in.shape(), " and ", value_in.shape(), " (layout ", layout, ")");

  // Projections: rows [0, E) of in_proj_weight for the query, [E, 2E) the key, [2E, 3E) the value.
  auto project = [&](const Tensor& x, int64_t i, int64_t len) {
    Tensor w = narrow(in_proj_weight, 0, i * E, E);
    Tensor b = in_proj_bias.defined() ? narrow(in_proj_bias, 0, i * E, E) : Tensor();
    // (N, len, E) -> (N, len, H, D) -> (N, H, len, D)
    return permute(reshape(linear(x, w, b), {N, len, H, head_dim}), {0, 2, 1, 3});
  };
  Tensor q = project(query, 0, L), k = project(key, 1, S), v = project(value, 2, S);

  // Both masks become one additive float mask broadcastable to (N, H, L, S).
  Tensor mask;
  const DType dtype = q.dtype();
  auto additive = [&](const Tensor& m, bool true_means_masked) {
    if (m.dtype() == DType::Bool) {
      Tensor blocked = true_means_masked ? m : logical_not(m);
      return masked_fill(zeros(m.shape(), {.dtype = dtype, .device = m.device()}), blocked, kNegInf);
    }
    KILN_CHECK(m.is_floating_point(), "MultiheadAttention: masks must be Bool or floating, got ", m.dtype(),
               " of shape ", m.shape());
    return cast(m, dtype);
  };
  if (key_padding_mask.defined()) {
    KILN_CHECK(key_padding_mask.shape() == (Shape{N, S}),
               "MultiheadAttention: key_padding_mask must have shape (N, S) = ", Shape{N, S}, " (true = padding), got ",
               key_padding_mask.shape());
    mask = reshape(additive(key_padding_mask, true), {N, 1, 1, S});
  }
  if (attn_mask.defined()) {
    Tensor m;
    if (attn_mask.dim() == 2) {
      KILN_CHECK(attn_mask.shape() == (Shape{L, S}),
                 "MultiheadAttention: a 2-D attn_mask must have shape (L, S) = ", Shape{L, S}, ", got ",
                 attn_mask.shape());
      m = additive(attn_mask, true);
    } else {
      KILN_CHECK(attn_mask.dim() == 3 && attn_mask.shape() == (Shape{N * H, L, S}),
                 "MultiheadAttention: attn_mask must have shape (L, S) = ", Shape{L, S},
                 " or (N * num_heads, L, S) = ", Shape{N * H, L, S}, ", got ", attn_mask.shape());
      m = reshape(additive(attn_mask, true), {N, H, L, S});
    }
    mask = mask.defined() ? mask + m : m;
  }

  AttentionOptions sdpa{.attn_mask = mask, .dropout_p = is_training() ? options.dropout : 0.0};
  Output out;
  Tensor attended;  // (N, H, L, D)
  if (need_weights) {
    AttentionResult r = scaled_dot_product_attention_with_weights(q, k, v, sdpa);
    attended = r.output;
    out.weights = average_attn_weights ? mean(r.weights, {1}) : r.weights;  // (N, L, S) or (N, H, L, S)
  } else {
    attended = scaled_dot_product_attention(q, k, v, sdpa);
  }
  // (N, H, L, D) -> (N, L, H, D) -> (N, L, E)
  Tensor merged = reshape(permute(attended, {0, 2, 1, 3}), {N, L, E});
  out.output = (*out_proj)(merged);
  if (!options.batch_first) out.output = transpose(out.output, 0, 1);
  return out;
}

Tensor MultiheadAttention::forward(const Tensor& x) { return forward(x, x, x).output; }

}  // namespace kiln::nn
