// Scaled dot-product attention and MultiheadAttention (attention.h), composed of differentiable ops.
#include "kiln/layers/attention.h"
#include "kiln/layers/autocast_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/autograd/autocast.h"    // autocast::inputs (the fused path casts its own inputs)
#include "kiln/autograd/function.h"    // autograd::Function for the fused path
#include "kiln/autograd/grad_mode.h"   // NoGradGuard for the fully-masked-row test
#include "kiln/layers/functional.h"    // nn::linear, nn::dropout
#include "kiln/layers/init.h"          // xavier_uniform_, zeros_
#include "kiln/tensor/capture.h"       // capture::Op: the op recorded for ONNX export
#include "kiln/tensor/cuda.h"          // cuda::is_available
#include "kiln/tensor/error.h"         // KILN_CHECK
#include "kiln/tensor/internal_ops.h"  // internal::* inside the fused path's forward and backward
#if KILN_WITH_CUDA
#include "kiln/autograd/column_sums.h"         // offer_column_sums: the QKV projection's bias gradient
#include "kiln/layers/cuda/attention_cudnn.h"  // cuDNN's fused attention (no CUDA header)
#include "kiln/layers/cuda/attention_probs.h"  // the math path's probabilities in one kernel each way
#include "kiln/layers/cuda/attention_rows.h"   // zero_flagged_rows
#include "kiln/layers/cuda/short_attention.h"  // the fused path for sequences of at most 128
#endif

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

#if KILN_WITH_CUDA
// The math path's probabilities on the GPU, forward and backward in one kernel each (cuda/attention_probs.h): the
// same values as the masked softmax, the zeroed dead rows and the dropout composed below (the same dropout mask for
// the same generator), without their passes over the (..., L, S) scores.
struct ProbsState {
  Tensor forbidden;  // Bool, expanded to the scores' shape, or undefined
  double p = 0;
  GeneratorState draw;
};

struct AttentionProbsFunction : autograd::Function<AttentionProbsFunction> {
  static Tensor forward(autograd::Context& ctx, const Tensor& scores, const ProbsState& state) {
    cuda_impl::AttentionProbs r = cuda_impl::attention_probs_forward(scores, state.forbidden, state.p, state.draw);
    ctx.save_for_backward({r.probs, r.keep, state.forbidden});
    ctx.set("p", state.p);
    return state.p > 0 ? r.dropped : r.probs;
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const autograd::TensorList saved = ctx.saved();
    return {cuda_impl::attention_probs_backward(grads[0], saved[0], saved[1], saved[2], ctx.get<double>("p"))};
  }
};
#endif

}  // namespace

AttentionResult scaled_dot_product_attention_with_weights(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                                          const AttentionOptions& options) {
  // One op of the autocast table: q, k, v cast by its policy, the ops inside with autocast off.
  auto [q, k, v] = autocast::inputs(autocast_ops::attention(), q_in, k_in, v_in);
  autocast::DisableGuard as_one_op;
  check_attention_inputs(q, k, v, options);
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1);
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(E)));
  // The scale goes on the smaller of q (..., L, E) and the scores (..., L, S).
  Tensor scores = E < S ? matmul(mul(q, scale), transpose(k, -2, -1))  // (..., L, E) x (..., E, S) -> (..., L, S)
                        : mul(matmul(q, transpose(k, -2, -1)), scale);
  if (options.attn_mask.defined())
    KILN_CHECK(broadcasts_to(options.attn_mask.shape(), scores.shape()), "scaled_dot_product_attention: attn_mask of ",
               "shape ", options.attn_mask.shape(), " does not broadcast to the scores' shape ", scores.shape(),
               " (..., L, S); give it shape (L, S) or (..., L, S) with 1 where it broadcasts");
  const bool bool_mask = options.attn_mask.defined() && options.attn_mask.dtype() == DType::Bool;
  const bool float_mask = options.attn_mask.defined() && !bool_mask;

  // The keys each query may not see, as a Bool tensor in the masks' own broadcast shape (e.g. BERT's (N, 1, 1, S)
  // key padding), never expanded to the scores': the Bool mask's false entries, and with is_causal the keys after
  // the query (allowed[i, j] = j <= i, top-left aligned).
  Tensor forbidden;
  {
    NoGradGuard no_grad;
    if (bool_mask) forbidden = logical_not(options.attn_mask);
    if (options.is_causal) {
      const TensorOptions index{.dtype = DType::Int64, .device = q.device()};
      const Tensor later = lt(unsqueeze(arange(L, index), 1), unsqueeze(arange(S, index), 0));  // (L, S): j > i
      forbidden = forbidden.defined() ? logical_or(forbidden, later) : later;
    }
  }

  // softmax of a row with every key masked would be NaN: such rows ("dead") get zero probabilities, so their output
  // and every gradient through them are zero.
  Tensor probs;
#if KILN_WITH_CUDA
  if (!float_mask && cuda_impl::attention_probs_fusable(scores)) {
    ProbsState state{forbidden.defined() ? expand(forbidden, scores.shape()) : Tensor(), options.dropout_p, {}};
    if (state.p > 0) state.draw = internal::draw_for(options.generator, scores.device());
    probs = AttentionProbsFunction::apply(scores, state);
    return {matmul(probs, v), probs};
  }
#endif
  if (float_mask) {
    // Additive: dead rows are known only from the scores (a row of -inf), found after the mask is added.
    scores = scores + cast(options.attn_mask, scores.dtype());
    if (forbidden.defined()) scores = masked_fill(scores, forbidden, kNegInf);
    Tensor dead;  // (..., L, 1) Bool
    {
      NoGradGuard no_grad;
      dead = eq(amax(scores.detach(), {-1}, true), kNegInf);
    }
    probs = masked_fill(softmax(masked_fill(scores, dead, 0.0), -1), dead, 0.0);
  } else if (forbidden.defined()) {
    // Dead rows come from the mask alone (small): they are left unmasked, so their softmax stays finite, and their
    // probabilities are zeroed after it. One masked fill of the scores, one of the probabilities.
    Tensor dead, hidden;  // (..., Lm, 1) and the mask's shape, Bool
    {
      NoGradGuard no_grad;
      dead = internal::all(forbidden, {-1}, true);
      hidden = logical_and(forbidden, logical_not(dead));
    }
    probs = masked_fill(softmax(masked_fill(scores, hidden, kNegInf), -1), dead, 0.0);
  } else {
    probs = softmax(scores, -1);
  }
  if (options.dropout_p > 0) probs = dropout(probs, options.dropout_p, /*training=*/true, options.generator);
  return {matmul(probs, v), probs};  // (..., L, S) x (..., S, Ev) -> (..., L, Ev)
}

// ---------------------------------------------------------------- the fused GPU path
namespace {

#if KILN_WITH_CUDA
// Masked entries inside cuDNN: finite, so a row with every key masked gives finite probabilities (and
// gradients) that are then zeroed, never NaN; exp(-30000 - max) is exactly 0 in float32 for any real score.
constexpr double kMaskedBias = -30000.0;

// One call on the fused path: q, k, v as (B, H, L|S, E|Ev) after autocast, the mask as a bias, the rows to
// zero; or why the call takes the math path.
struct FusedCall {
  Tensor q, k, v;   // (B, H, L, E), (B, H, S, E), (B, H, S, Ev), differentiable views of the caller's tensors
  Tensor bias;      // (B|1, H|1, L|1, S) contiguous in q's dtype, or undefined
  Tensor dead;      // (B|1, H|1, L|1, 1) Bool: rows without any allowed key, zeroed; or undefined
  Shape out_shape;  // the caller's leading dims + (L, Ev)
  cuda_impl::FusedAttentionConfig cfg;
  Generator* generator = nullptr;
  bool short_kernel = false;  // kiln's own kernels (cuda/short_attention.h) run it, not cuDNN
  std::string why_not;        // empty: the fused path runs
};

// (..., X, D) with 0 to 2 leading dims -> (B, H, X, D): (N, X, D) is (N, 1, X, D), (X, D) is (1, 1, X, D).
Tensor to_4d(const Tensor& t) {
  if (t.dim() == 3) return unsqueeze(t, 1);
  if (t.dim() == 2) return unsqueeze(unsqueeze(t, 0), 0);
  return t;
}

// A differentiable copy of t with contiguous, 16-byte aligned rows when t's are not (cuDNN needs them).
Tensor rows_aligned(const Tensor& t) {
  bool ok = t.stride(-1) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int64_t d = 0; ok && d + 1 < t.dim(); ++d) {
    ok = t.size(d) == 1 || (t.stride(d) * static_cast<int64_t>(t.element_size())) % 16 == 0;
  }
  return ok ? t : clone(t, MemoryFormat::Contiguous);
}

// The masks prepared inside AttentionMaskScopes on this thread (attention.h): the bias and dead-row flags of a mask
// for a query dtype and device, the scores' (L, S) and the causal flag.
struct PreparedMask {
  std::weak_ptr<TensorImpl> mask;
  uint64_t version = 0;
  const void* storage = nullptr;
  DType dtype = DType::Float32;
  Device device;
  Shape mask_shape;  // (B|1, H|1, L|1, S|1)
  int64_t L = 0, S = 0;
  bool causal = false;
  Tensor bias, dead;
};
struct PreparedMasks {
  int depth = 0;
  std::vector<PreparedMask> entries;
};
thread_local PreparedMasks prepared_masks;

// The entry for this mask and call, or null (outside a scope, or not prepared yet).
PreparedMask* find_prepared(const Tensor& mask, const Tensor& m4, DType dtype, Device device, int64_t L, int64_t S,
                            bool causal) {
  if (prepared_masks.depth == 0) return nullptr;
  for (PreparedMask& e : prepared_masks.entries) {
    if (e.mask.lock().get() == &mask.impl() && e.version == mask.version() &&
        e.storage == mask.impl().storage().get() && e.dtype == dtype && e.device == device &&
        e.mask_shape == m4.shape() && e.L == L && e.S == S && e.causal == causal) {
      return &e;
    }
  }
  return nullptr;
}

// materialize = false only answers whether the fused path would run (the bias is left uninitialised).
FusedCall plan_fused(const Tensor& q0, const Tensor& k0, const Tensor& v0, const AttentionOptions& o,
                     bool materialize) {
  FusedCall c;
  if (!q0.is_cuda()) {
    c.why_not = "not on a GPU";
    return c;
  }
  auto [q, k, v] = autocast::inputs(autocast_ops::attention(), q0, k0, v0);
  // Float32 only where TF32 products are allowed, and only kiln's own kernels take it (below).
  const bool sixteen_bit = q.dtype() == DType::Float16 || q.dtype() == DType::BFloat16;
  if (!sixteen_bit && !(q.dtype() == DType::Float32 && cuda::allow_tf32())) {
    c.why_not = ::kiln::detail::str_cat("the fused attention takes Float16 or BFloat16 (or Float32 with TF32 products ",
                                        "allowed), not ", q.dtype());
    return c;
  }
  const int64_t lead = q.dim() - 2;
  if (lead > 2 || k.dim() != q.dim() || v.dim() != q.dim() ||
      !std::equal(q.shape().begin(), q.shape().begin() + lead, k.shape().begin()) ||
      !std::equal(q.shape().begin(), q.shape().begin() + lead, v.shape().begin())) {
    c.why_not = "query, key and value must share 0 to 2 leading dims (no broadcasting)";
    return c;
  }
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1);
  const Tensor& m = o.attn_mask;
  if (m.defined()) {
    if (m.requires_grad()) {
      c.why_not = "attn_mask requires grad (the fused path gives no mask gradient)";
      return c;
    }
    Shape scores(q.shape().begin(), q.shape().begin() + lead);
    scores.insert(scores.end(), {L, S});
    if (!broadcasts_to(m.shape(), scores)) {
      c.why_not = "attn_mask does not broadcast to the scores";  // the math path raises the error
      return c;
    }
  }
  c.q = rows_aligned(to_4d(q));
  c.k = rows_aligned(to_4d(k));
  c.v = rows_aligned(to_4d(v));
  c.out_shape = Shape(q.shape().begin(), q.shape().end() - 1);
  c.out_shape.push_back(v.size(-1));
  c.cfg.scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(E)));
  c.cfg.dropout_p = o.dropout_p;
  c.cfg.causal = o.is_causal;
  c.cfg.with_stats = GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  c.generator = o.generator;

  if (m.defined()) {
    NoGradGuard no_grad;
    Tensor m4 = m.detach();
    while (m4.dim() < q.dim()) m4 = m4.unsqueeze(0);
    m4 = to_4d(m4);  // (B|1, H|1, L|1, S|1)
    // A mask the same for every query (a key padding mask) stays one row per batch and head: cuDNN broadcasts it.
    const Shape bias_shape{m4.size(0), m4.size(1), m4.size(2), S};
    if (!materialize) {
      c.bias = internal::empty(bias_shape, c.q.options());
    } else if (const PreparedMask* e = find_prepared(m, m4, q.dtype(), q.device(), L, S, o.is_causal)) {
      c.bias = e->bias;
      c.dead = e->dead;
    } else {
      // -inf where a key is forbidden, the mask's values where it is floating: (B|1, H|1, L|1, S|1).
      Tensor additive = m4.dtype() == DType::Bool
                            ? internal::zeros(m4.shape(), c.q.options()).masked_fill(m4.logical_not(), kNegInf)
                            : m4.to(q.dtype());
      // Rows with no allowed key once the causal mask is applied too; the math path gives them zeros.
      Tensor scores = additive.expand({m4.size(0), m4.size(1), m4.size(2), S});
      if (o.is_causal) {
        const TensorOptions index{.dtype = DType::Int64, .device = q.device()};
        Tensor forbidden =
            internal::arange(S, index).unsqueeze(0).gt(internal::arange(L, index).unsqueeze(1));  // (L, S)
        scores = scores.expand({m4.size(0), m4.size(1), L, S}).masked_fill(forbidden, kNegInf);
      }
      c.dead = eq(amax(scores, {-1}, true), kNegInf);
      c.bias = additive.expand(bias_shape).clamp(kMaskedBias, std::nullopt).contiguous();
      if (prepared_masks.depth > 0) {
        prepared_masks.entries.push_back(PreparedMask{m.impl_ptr(), m.version(), m.impl().storage().get(), q.dtype(),
                                                      q.device(), m4.shape(), L, S, o.is_causal, c.bias, c.dead});
      }
    }
  }
  std::string why_not_short;
  if (cuda_impl::short_attention_supported(c.q, c.k, c.v, c.bias, c.cfg.causal, &why_not_short)) {
    c.short_kernel = true;
    return c;
  }
  if (!sixteen_bit) {
    c.why_not = ::kiln::detail::str_cat("kiln's own kernels do not apply (", why_not_short,
                                        "), and cuDNN's fused attention takes Float16 or BFloat16, not ", q.dtype());
    return c;
  }
  if (!cuda_impl::fused_attention_compiled()) {
    c.why_not = ::kiln::detail::str_cat("kiln was built without cudnn-frontend, and its own kernels do not apply (",
                                        why_not_short, ")");
    return c;
  }
  if (!cuda_impl::fused_attention_supported(c.q, c.k, c.v, c.bias, c.cfg, &c.why_not) && c.bias.defined()) {
    // Some cuDNN versions refuse a bias broadcast over the queries, the batch or the heads: try it expanded in
    // memory, over the queries first, then over everything.
    const Shape by_query{c.bias.size(0), c.bias.size(1), L, S}, full{c.q.size(0), c.q.size(1), L, S};
    for (const Shape& shape : {by_query, full}) {
      if (c.bias.shape() == shape) continue;
      NoGradGuard no_grad;
      Tensor expanded = materialize ? c.bias.expand(shape).contiguous() : internal::empty(shape, c.bias.options());
      std::string why_expanded;
      if (cuda_impl::fused_attention_supported(c.q, c.k, c.v, expanded, c.cfg, &why_expanded)) {
        c.bias = expanded;
        c.why_not.clear();
        break;
      }
    }
  }
  return c;
}

// The philox key of one dropout draw for cuDNN: kiln's (seed, offset) mixed into one 64-bit key (splitmix64),
// so consecutive draws use unrelated streams whatever cuDNN does with its offset (kept 0).
int64_t mixed_key(const GeneratorState& draw) {
  uint64_t z = draw.seed + 0x9E3779B97F4A7C15ULL * (draw.offset + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<int64_t>(z);
}

cuda_impl::FusedAttentionDropout dropout_draw(const FusedCall& c, Device device) {
  if (c.cfg.dropout_p <= 0 || c.short_kernel) return {};
  Generator& gen = c.generator != nullptr ? *c.generator : default_generator(device);
  if (!cuda::Graph::capturing()) {
    // The key in device memory, filled once here for the call's forward and backward (one fill, not one per pass).
    const int64_t key = mixed_key(gen.next_draw());
    return {key, 0, internal::full({1, 1, 1, 1}, key, {.dtype = DType::Int64, .device = device})};
  }
  // In a CUDA graph capture cuDNN reads the key from device memory that each replay fills with a fresh draw's key
  // first (one tensor for the forward and the backward of the call). It is a replay input, left unfilled: a fill
  // kernel, or an earlier temporary of the capture on the same memory, would be recorded in the graph and
  // overwrite the hook's key on every replay.
  KILN_CHECK_AS(NotImplementedError, !gen.rewound_in_capture(),
                "scaled_dot_product_attention: dropout in a CUDA graph capture after the generator was rewound "
                "(gradient checkpointing): replays could not draw the same numbers again; capture without "
                "checkpointing, or with attention dropout off");
  const uint64_t captured_seed = gen.seed();
  Tensor seed = cuda::Graph::replay_input({1, 1, 1, 1}, {.dtype = DType::Int64, .device = device});
  Generator* source = &gen;
  cuda::Graph::on_replay([source, seed, captured_seed]() mutable {
    const GeneratorState next = source->next_draw();
    KILN_CHECK(next.seed == captured_seed, "cuda::Graph::replay: the generator of an attention dropout in this graph ",
               "was seeded again after the capture; capture the step again after seeding");
    seed.fill_(mixed_key(next));
  });
  return {0, 0, seed};
}

// What the node keeps besides its saved tensors.
struct FusedState {
  Tensor bias, dead;
  cuda_impl::FusedAttentionConfig cfg;
  cuda_impl::FusedAttentionDropout dropout;  // cuDNN's draw
  bool short_kernel = false;                 // cuda/short_attention.h runs it, with `draw` for its dropout
  GeneratorState draw;
};

cuda_impl::ShortAttentionConfig short_config(const cuda_impl::FusedAttentionConfig& cfg) {
  return {.scale = cfg.scale, .dropout_p = cfg.dropout_p, .causal = cfg.causal};
}

struct FusedAttention : autograd::Function<FusedAttention> {
  // q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev) -> (B, H, L, Ev)
  static Tensor forward(autograd::Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const FusedState& state) {
    cuda_impl::FusedAttentionForward f;
    Tensor keep;  // kiln's kernels with dropout: the mask as bits, for backward
    if (state.short_kernel) {
      cuda_impl::ShortAttentionForward s =
          cuda_impl::short_attention_forward(q, k, v, state.bias, short_config(state.cfg), state.draw);
      f = {s.out, s.stats};
      keep = s.keep;
    } else {
      f = cuda_impl::fused_attention_forward(q, k, v, state.bias, state.cfg, state.dropout);
    }
    // Rows without an allowed key: zeros, as the math path (written only where a row is flagged). Backward then
    // must give those rows no gradient: their log-sum-exp becomes +inf, so that backward's probabilities
    // exp(score - stats) are 0 there, and so are the rows' contributions to dQ, dK and dV; and rowsum(dO * O)
    // reads the zeroed O. dO itself is left as it is.
    if (state.dead.defined()) cuda_impl::zero_flagged_rows(f.out, state.dead, f.stats);
    ctx.save_for_backward({q, k, v, f.out, f.stats, keep});
    ctx.set("state", state);
    return f.out;
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const autograd::TensorList saved = ctx.saved();
    const auto state = ctx.get<FusedState>("state");
    const Tensor& d_out = grads[0];
    cuda_impl::FusedAttentionGrads g =
        state.short_kernel
            ? cuda_impl::short_attention_backward(saved[0], saved[1], saved[2], saved[3], d_out, saved[4], saved[5],
                                                  state.bias, short_config(state.cfg))
            : cuda_impl::fused_attention_backward(saved[0], saved[1], saved[2], saved[3], d_out, saved[4], state.bias,
                                                  state.cfg, state.dropout);
    if (g.packed_sums.defined()) {
      // The fused QKV projection's output gradient is that buffer as (B, L, 3 H E): its bias gradient is these sums.
      const Tensor& buffer = g.packed;
      autograd::offer_column_sums(
          buffer.view({buffer.size(0), buffer.size(1), buffer.size(2) * buffer.size(3) * buffer.size(4)}),
          g.packed_sums);
    }
    return {g.dq, g.dk, g.dv};
  }
};
#endif  // KILN_WITH_CUDA

// scaled_dot_product_attention's options as a capture record holds them (the mask is an input).
std::vector<capture::Attr> attention_attrs(const AttentionOptions& o) {
  std::vector<capture::Attr> attrs{{"dropout_p", o.dropout_p}, {"is_causal", int64_t{o.is_causal}}};
  if (o.scale) attrs.push_back({"scale", *o.scale});
  return attrs;
}

}  // namespace

AttentionMaskScope::AttentionMaskScope() {
#if KILN_WITH_CUDA
  ++prepared_masks.depth;
#endif
}

AttentionMaskScope::~AttentionMaskScope() {
#if KILN_WITH_CUDA
  if (--prepared_masks.depth == 0) prepared_masks.entries.clear();
#endif
}

AttentionBackend attention_backend(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                   std::string* why_not) {
  check_attention_inputs(q, k, v, options);
#if KILN_WITH_CUDA
  const FusedCall c = plan_fused(q, k, v, options, /*materialize=*/false);
  if (why_not != nullptr) *why_not = c.why_not;
  if (!c.why_not.empty()) return AttentionBackend::Math;
  return c.short_kernel ? AttentionBackend::ShortFused : AttentionBackend::CudnnFused;
#else
  if (why_not != nullptr) *why_not = "kiln was built without CUDA";
  return AttentionBackend::Math;
#endif
}

bool fused_attention_available() {
#if KILN_WITH_CUDA
  return cuda_impl::fused_attention_compiled() && cuda::is_available();
#else
  return false;
#endif
}

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const AttentionOptions& options) {
  capture::Op cap("scaled_dot_product_attention");
  const auto describe = [&] { return capture::Args{{q_in, k_in, v_in, options.attn_mask}, attention_attrs(options)}; };
  // One op of the autocast table: q, k, v cast by its policy, the ops inside (either path) with autocast off.
  auto [q, k, v] = autocast::inputs(autocast_ops::attention(), q_in, k_in, v_in);
  autocast::DisableGuard as_one_op;
#if KILN_WITH_CUDA
  if (q.defined() && q.is_cuda()) {
    check_attention_inputs(q, k, v, options);
    FusedCall c = plan_fused(q, k, v, options, /*materialize=*/true);
    if (c.why_not.empty()) {
      FusedState state{c.bias, c.dead, c.cfg, dropout_draw(c, q.device())};
      if (c.short_kernel) {
        state.short_kernel = true;
        if (c.cfg.dropout_p > 0) state.draw = internal::draw_for(c.generator, q.device());
      }
      Tensor out = FusedAttention::apply(c.q, c.k, c.v, state);  // (B, H, L, Ev)
      return cap.done(out.shape() == c.out_shape ? out : reshape(out, c.out_shape), describe);
    }
  }
#endif
  return cap.done(scaled_dot_product_attention_with_weights(q, k, v, options).output, describe);
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
  out.output = out_proj(merged);
  if (!options.batch_first) out.output = transpose(out.output, 0, 1);
  return out;
}

Tensor MultiheadAttention::forward(const Tensor& x) { return forward(x, x, x).output; }

}  // namespace kiln::nn
