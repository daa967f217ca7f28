// kiln/layers/cuda/attention_cudnn.h — cuDNN's fused scaled dot-product attention (flash attention) through
// the cudnn-frontend graph API, forward and backward (internal; called by nn::scaled_dot_product_attention).
//
//   FusedAttentionConfig cfg{.scale = 0.125, .causal = true, .with_stats = true};
//   if (fused_attention_supported(q, k, v, bias, cfg)) {
//     FusedAttentionForward f = fused_attention_forward(q, k, v, bias, cfg, {});   // f.out (B, H, L, Ev)
//     FusedAttentionGrads g = fused_attention_backward(q, k, v, f.out, d_out, f.stats, bias, cfg, {});
//   }
//
// Without cudnn-frontend (KILN_WITH_CUDNN_FRONTEND unset) fused_attention_supported() is false and the other
// two throw. Built graphs are cached per (shapes, strides, dtype, flags, device), unsupported ones too, so a
// second call with the same key neither builds nor probes again.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/tensor/tensor.h"  // Tensor

namespace kiln::nn::cuda_impl {

struct FusedAttentionConfig {
  double scale = 1.0;       // applied to q k^T before the bias is added
  double dropout_p = 0;     // on the probabilities (cuDNN's Philox dropout), 0: none
  bool causal = false;      // query i attends keys j <= i (top-left aligned)
  bool with_stats = false;  // also produce the softmax statistics (needed for backward); forward-only otherwise
};

// The Philox key and offset of one dropout draw (ignored when dropout_p == 0).
struct FusedAttentionDropout {
  int64_t seed = 0;
  int64_t offset = 0;
  // When defined: a (1, 1, 1, 1) Int64 GPU tensor holding the seed, read by cuDNN when it runs (CUDA graphs:
  // each replay writes a fresh one first), and `seed` is ignored.
  Tensor seed_device;
};

// q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev) on one GPU, all Float16 or all BFloat16, last dim
// contiguous and 16-byte aligned rows; bias undefined or (B|1, H|1, L|1, S) contiguous in q's dtype.
// True when cuDNN builds both the forward graph and (with cfg.with_stats) the backward graph for this case;
// otherwise false, with the reason in *why_not when given.
bool fused_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                               const FusedAttentionConfig& cfg, std::string* why_not = nullptr);

struct FusedAttentionForward {
  Tensor out;    // (B, H, L, Ev), stored as (B, L, H, Ev) so merging the heads afterwards is a view
  Tensor stats;  // (B, H, L, 1) Float32 log-sum-exp of each score row (with_stats only)
};
FusedAttentionForward fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                              const FusedAttentionConfig& cfg, FusedAttentionDropout dropout);

struct FusedAttentionGrads {
  Tensor dq, dk, dv;   // shaped as q, k, v: stored (B, L|S, H, E), or as q, k, v are when those are the thirds of
                       // one (B, L, 3, H, E) buffer (a fused QKV projection): then the thirds of one such buffer
  Tensor packed;       // that (B, L, 3, H, E) buffer, where the gradients are its thirds; else undefined
  Tensor packed_sums;  // (3 H E) Float32 column sums of `packed` as stored, where the kernels summed them (the fused
                       // QKV projection's bias gradient: autograd::offer_column_sums); else undefined
};
// out and stats from fused_attention_forward with the same q, k, v, bias, cfg and dropout; d_out (B, H, L, Ev)
// in any layout.
FusedAttentionGrads fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& d_out, const Tensor& stats, const Tensor& bias,
                                             const FusedAttentionConfig& cfg, FusedAttentionDropout dropout);

// Whether this build has cudnn-frontend (false: the GPU always takes the math path).
bool fused_attention_compiled();

}  // namespace kiln::nn::cuda_impl
