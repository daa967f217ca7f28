// kiln/layers/cuda/short_attention.h — scaled dot-product attention for short sequences in one kernel each way
// (internal; nn::scaled_dot_product_attention takes it where it applies, cuDNN's fused attention elsewhere).
//
//   if (short_attention_supported(q, k, v, bias, causal)) {
//     ShortAttentionForward f = short_attention_forward(q, k, v, bias, {.scale = 0.125, .dropout_p = 0.1}, draw);
//     FusedAttentionGrads g = short_attention_backward(q, k, v, f.out, d_out, f.stats, f.keep, bias, {...});
//   }
//
// One block of 8 warps takes one (batch, head): Q, K and V (at most 128 rows of 64) sit in shared memory, each warp
// holds the scores of 16 queries against every key in registers, and nothing of the (L, S) scores goes to global
// memory. Forward: scores, masked softmax, dropout and the product with V, and each row's log-sum-exp (the
// statistics backward needs) and, with dropout, the mask as bits. Backward: the probabilities recomputed from the
// statistics, dropout's mask read from those bits, dP, dS; dQ, dK and dV from shared memory with no atomics and no pass
// of their own for rowsum(dO * O). At BERT's 128 tokens cuDNN's flash attention spends most of its time on those extra
// passes and on blocks of 64 x 64 that a 128 x 128 score matrix fills only once.
//
// Dropout: element (b, h, i, j) of the (B, H, L, S) scores is kept exactly where internal::dropout of a (B, H, L, S)
// float32 tensor with the same draw keeps it (word e % 4 of Philox block e / 4, e the row-major index), so the math
// path with that draw gives the same mask. draw comes from internal::draw_for (CUDA graph captures included). The
// forward stores the decisions as bits for its backward (2 KiB per (batch, head)), which reads them instead of drawing
// Philox again.
#pragma once

#include <string>

#include "kiln/layers/cuda/attention_cudnn.h"  // FusedAttentionGrads
#include "kiln/tensor/generator.h"             // GeneratorState
#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

// The longest sequence the kernels take, and the one head size.
inline constexpr int64_t kShortAttentionMaxLength = 128;
inline constexpr int64_t kShortAttentionHeadDim = 64;
// The bytes of one query row's keep bits (ShortAttentionForward::keep): one bit per key up to the longest sequence.
inline constexpr int64_t kShortAttentionKeepBytes = kShortAttentionMaxLength / 8;

struct ShortAttentionConfig {
  double scale = 0.125;    // applied to q k^T before the bias is added
  double dropout_p = 0.0;  // on the probabilities, [0, 1)
  bool causal = false;     // query i attends keys j <= i
};

// q, k, v (B, H, L, 64) on one GPU of compute capability 8.0 or later, all Float16, all BFloat16, or all Float32 where
// TF32 products are allowed (cuda::allow_tf32(): the products then run in TF32, as kiln's float32 products), with L ==
// S a multiple of 16 from 16 to 128, the last dim contiguous and every other stride a multiple of 8 elements (rows
// 16-byte aligned), B * H > 0; bias undefined or (B|1, 1, 1, S) contiguous in q's dtype (a key padding mask as a
// bias). False with the reason in *why_not otherwise. The bias must be finite: a row whose keys are all -inf has no
// softmax and comes out NaN (scaled_dot_product_attention clamps its masks and zeroes fully masked rows before it
// calls these kernels).
bool short_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, bool causal,
                               std::string* why_not = nullptr);

struct ShortAttentionForward {
  Tensor out;    // (B, H, L, 64), stored as (B, L, H, 64) so that merging the heads afterwards is a view
  Tensor stats;  // (B, H, L, 1) Float32 log-sum-exp of each row of scale q k^T + bias
  // With dropout: (B, H, L, kShortAttentionKeepBytes) UInt8, bit j % 8 of byte j / 8 of row i set where key j was kept
  // (bytes past S / 8 unused); undefined without dropout.
  Tensor keep;
};
ShortAttentionForward short_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                              const ShortAttentionConfig& cfg, const GeneratorState& draw);

// out, stats and (with dropout) keep from short_attention_forward with the same q, k, v, bias and cfg; d_out
// (B, H, L, 64) in any layout. Float32 runs in TF32 as its forward did, whatever cuda::allow_tf32() says by the time of
// the backward. Gradients as fused_attention_backward lays them out: the thirds of one (B, L, 3, H, 64) buffer when q,
// k and v are the thirds of one (then also that buffer's column sums as stored, packed_sums, for the fused QKV
// projection's bias), else each stored (B, L, H, 64).
FusedAttentionGrads short_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& d_out, const Tensor& stats, const Tensor& keep,
                                             const Tensor& bias, const ShortAttentionConfig& cfg);

// (B, H, X, D) over (B, X, H, D) memory: the layout of attention's outputs and gradients.
Tensor empty_bxhd(int64_t B, int64_t H, int64_t X, int64_t D, const TensorOptions& options);

// Whether q, k and v are the three thirds of one (B, L, 3, H, E) buffer, as a fused QKV projection leaves them
// (split into query, key and value and viewed as heads): then their gradients can be the thirds of one such buffer
// too, which is the projection's output gradient as it stands (autograd's split backward takes it without a copy).
bool packed_qkv(const Tensor& q, const Tensor& k, const Tensor& v);

// Gradients of q, k, v laid out as packed_qkv allows: the thirds of one new (B, L, 3, H, E) buffer, or each a new
// (B, H, X, E) over (B, X, H, E) memory.
FusedAttentionGrads empty_attention_grads(const Tensor& q, const Tensor& k, const Tensor& v, bool packed);

}  // namespace kiln::nn::cuda_impl
