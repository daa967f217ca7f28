// kiln/layers/attention.h — scaled dot-product attention and nn::MultiheadAttention (PyTorch's semantics).
//
//   using namespace kiln;
//   // q (N, H, L, E), k (N, H, S, E), v (N, H, S, Ev) -> (N, H, L, Ev)
//   Tensor y = nn::scaled_dot_product_attention(q, k, v, {.is_causal = true});
//   y = nn::scaled_dot_product_attention(q, k, v, {.attn_mask = allowed /* Bool (N, 1, 1, S) */, .dropout_p = 0.1});
//
//   auto mha = nn::make<nn::MultiheadAttention>(256, 8);   // batch_first: (N, L, E)
//   auto [out, weights] = mha(x, x, x, padding /* Bool (N, S), true = padding */, Tensor(), true);
//   Tensor y = mha(x);                                      // self-attention without masks: (N, L, E)
//
// scaled_dot_product_attention is the one entry point, with three implementations chosen per call
// (attention_backend() says which one a call takes):
// - the math path composes differentiable ops (softmax(q k^T * scale + mask) -> dropout -> @ v), so its
//   gradients come from autograd. Every device and dtype; the reference.
// - cuDNN's fused flash attention (AttentionBackend::CudnnFused), on GPUs when kiln was built with
//   cudnn-frontend: after autocast (autocast_ops::attention(): float16/bfloat16 inside an autocast region) the inputs
//   must be Float16 or BFloat16 (cuDNN has no fused float32 attention: float32/float64 take the math path),
//   with 2 to 4 dims, q, k and v sharing their leading dims (no broadcasting), head dims E and Ev multiples
//   of 8 and at most 128, and an attn_mask that does not require grad. Differences from the math path:
//   * rows in which every key is masked still give zeros (and zero gradients): the fused path finds them
//     from the mask (a row of -inf after the causal mask) and zeroes them, matching the math path exactly;
//   * masked entries (Bool false, or -inf) become a large finite negative bias (-30000) inside cuDNN, and
//     floating mask values below -30000 are raised to it (exp(-30000) is 0 in float32 either way);
//   * dropout draws its mask from cuDNN's own Philox stream keyed by one draw of the generator: the same
//     generator state gives the same mask on the fused path, but not the mask the math path would draw
//     (as with PyTorch's fused kernels);
//   * the output is laid out (N, L, H, Ev) in memory (seen as (N, H, L, Ev)), so merging the heads is a view.
// - kiln's own fused kernels for short sequences (AttentionBackend::ShortFused, layers/cuda/short_attention.h), which
//   take the fused path's calls (and its differences from the math path) where they apply: GPUs of compute
//   capability 8.0 or later, Float16 or BFloat16 after autocast (or Float32 while TF32 products are allowed,
//   cuda::allow_tf32(): its products then run in TF32, as the math path's would), 4-d q, k and v of one shape
//   (N, H, L, 64) with L a
//   multiple of 16 up to 128 (BERT's 128 tokens), and no mask or a key padding mask (one row of keys per sequence).
//   One block per (batch, head) holds the whole score matrix: no extra passes over memory forward or backward.
//   Their dropout draws internal::dropout's mask from one draw of the generator: the math path with the same
//   generator state drops the same probabilities. They need no cudnn-frontend.
// Callers (MultiheadAttention, BERT) need not change.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kiln/layers/layers.h"     // nn::Linear
#include "kiln/layers/module.h"     // nn::Module
#include "kiln/tensor/generator.h"  // Generator
#include "kiln/tensor/tensor.h"     // Tensor

namespace kiln::nn {

// Options of scaled_dot_product_attention, as torch.nn.functional.scaled_dot_product_attention's arguments.
struct AttentionOptions {
  // Bool: true = the query may attend to that key (PyTorch's sdpa convention); floating: added to the scores
  // (use -inf to forbid). Broadcastable to (..., L, S). Undefined: no mask.
  Tensor attn_mask{};
  // Dropout on the attention probabilities, applied whenever > 0 (as torch's functional sdpa: pass 0 in eval).
  double dropout_p = 0;
  // Query i may attend to keys j <= i (the top-left-aligned lower triangle, as PyTorch). Combines with
  // attn_mask when both are given (PyTorch refuses the combination; kiln applies both).
  bool is_causal = false;
  std::optional<double> scale{};   // default 1 / sqrt(E)
  Generator* generator = nullptr;  // for dropout; null: the default generator of q's device
};

// q (..., L, E), k (..., S, E), v (..., S, Ev) -> (..., L, Ev); the leading dims broadcast as in matmul.
// Rows in which every key is masked give zeros (and zero gradients), not NaN: this is PyTorch >= 2.5's
// math path (_safe_softmax) and what padding on both sides of a causal mask needs.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

// Masks shared by several attention calls (the layers of one transformer forward). On the fused GPU path each call
// turns a mask into the additive bias cuDNN reads and the flags of rows with no allowed key: a few small kernels.
// While a scope is open on this thread, the calls after the first with the same mask tensor (same storage and
// version), query dtype and device, shapes and causal flag reuse what the first prepared. BertModel::forward opens one
// around its encoder. Entries are freed when the outermost scope closes; nothing is kept outside a scope.
class AttentionMaskScope {
 public:
  AttentionMaskScope();
  ~AttentionMaskScope();
  AttentionMaskScope(const AttentionMaskScope&) = delete;
  AttentionMaskScope& operator=(const AttentionMaskScope&) = delete;
};

// Which implementation scaled_dot_product_attention takes for these arguments in the current grad and
// autocast mode (on a GPU this may build and cache cuDNN's graphs). With why_not, the reason the fused path
// was not taken.
enum class AttentionBackend { Math, CudnnFused, ShortFused };
// The implementation scaled_dot_product_attention would take for these arguments (see AttentionBackend); why_not,
// if given, receives why the fused path was not taken.
AttentionBackend attention_backend(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionOptions& options = {}, std::string* why_not = nullptr);
// Whether this build and machine can run the fused path at all (built with CUDA and cudnn-frontend, a GPU
// visible).
bool fused_attention_available();

// The same computation, also returning the attention probabilities (..., L, S) after dropout (what
// MultiheadAttention reports when asked for weights). Always the math path.
struct AttentionResult {
  Tensor output{};   // (..., L, Ev)
  Tensor weights{};  // (..., L, S)
};
// scaled_dot_product_attention's output together with the attention probabilities (see AttentionResult).
AttentionResult scaled_dot_product_attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                                          const AttentionOptions& options = {});

// ---------------------------------------------------------------- MultiheadAttention
struct MultiheadAttentionOptions {
  double dropout = 0;       // on the attention probabilities, in training mode only
  bool bias = true;         // "in_proj_bias" and "out_proj.bias"
  bool batch_first = true;  // (N, L, E); false: (L, N, E) as PyTorch's default
};

// PyTorch's nn.MultiheadAttention with kdim = vdim = embed_dim: parameters "in_proj_weight" (3E, E) (query,
// key and value projections stacked), "in_proj_bias" (3E), "out_proj.weight" (E, E), "out_proj.bias" (E).
// Init as PyTorch: xavier_uniform_ in_proj_weight, zero biases, out_proj.weight as Linear's default.
class MultiheadAttention : public Module {
 public:
  // kiln::Error unless embed_dim and num_heads are positive, num_heads divides embed_dim and 0 <= dropout < 1.
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, MultiheadAttentionOptions options = {});

  // What forward(query, key, value, ...) returns.
  struct Output {
    Tensor output{};   // (N, L, E) (or (L, N, E) without batch_first)
    Tensor weights{};  // need_weights: (N, L, S) averaged over heads, or (N, num_heads, L, S); else undefined
  };
  // query (N, L, E), key and value (N, S, E) (batch_first). key_padding_mask (N, S): Bool true = padding
  // (ignored key), or floating added to the scores. attn_mask (L, S) or (N * num_heads, L, S): Bool true =
  // NOT allowed, or floating added — PyTorch's MultiheadAttention convention, the opposite of sdpa's Bool.
  Output forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask = {},
                 const Tensor& attn_mask = {}, bool need_weights = false, bool average_attn_weights = true);
  // Self-attention without masks: forward(x, x, x).output.
  Tensor forward(const Tensor& x) override;
  // Re-initialises as at construction (see above), drawing from gen or the default generator.
  void reset_parameters(Generator* gen = nullptr);

  int64_t embed_dim;                  // E, the model dimension
  int64_t num_heads;                  // the number of attention heads
  int64_t head_dim;                   // embed_dim / num_heads
  MultiheadAttentionOptions options;  // as constructed
  Tensor in_proj_weight;              // (3E, E)
  Tensor in_proj_bias;                // (3E); undefined without bias
  Handle<Linear> out_proj;            // "out_proj": E -> E, after the heads are concatenated
};

}  // namespace kiln::nn
