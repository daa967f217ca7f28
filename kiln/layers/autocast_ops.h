// kiln/layers/autocast_ops.h — the layers' and losses' autocast ops, declared here rather than in autograd.
//
//   auto [x, w, b] = autocast::inputs(nn::autocast_ops::linear(), input, weight, bias);
//   autocast::set_policy(nn::autocast_ops::layer_norm(), autocast::Policy::Keep);  // as for any op
//
// Each is registered with autograd's policy table (autocast::register_op) on first use, with its default policy:
// matrix products run in the lower precision, normalisations and losses in float32, the rest keeps its dtypes.
#pragma once

#include "kiln/autograd/autocast.h"

namespace kiln::nn::autocast_ops {

#define KILN_LAYER_AUTOCAST_OP(function, name, default_policy)                                    \
  inline autocast::Op function() {                                                                \
    static const autocast::Op op = autocast::register_op(name, autocast::Policy::default_policy); \
    return op;                                                                                    \
  }
KILN_LAYER_AUTOCAST_OP(linear, "linear", LowerPrecision)
KILN_LAYER_AUTOCAST_OP(conv, "conv", LowerPrecision)
KILN_LAYER_AUTOCAST_OP(attention, "scaled_dot_product_attention", LowerPrecision)
KILN_LAYER_AUTOCAST_OP(batch_norm, "batch_norm", Keep)
KILN_LAYER_AUTOCAST_OP(layer_norm, "layer_norm", Float32)
KILN_LAYER_AUTOCAST_OP(group_norm, "group_norm", Float32)
KILN_LAYER_AUTOCAST_OP(dropout, "dropout", Keep)
KILN_LAYER_AUTOCAST_OP(cross_entropy, "cross_entropy", Float32)
KILN_LAYER_AUTOCAST_OP(nll_loss, "nll_loss", Float32)
KILN_LAYER_AUTOCAST_OP(mse_loss, "mse_loss", Float32)
KILN_LAYER_AUTOCAST_OP(binary_cross_entropy_with_logits, "binary_cross_entropy_with_logits", Float32)
#undef KILN_LAYER_AUTOCAST_OP

}  // namespace kiln::nn::autocast_ops
