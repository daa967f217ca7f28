// Convolution and attention against golden values computed by PyTorch (tests/golden/make_golden.py).
#include <gtest/gtest.h>

#include "kiln/layers/attention.h"
#include "kiln/layers/conv.h"
#include "support/golden.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class GoldenConvAttentionTest : public GoldenBackendTest {};

// groups 2, stride (2, 1), padding (1, 0), dilation (1, 2), bias.
TEST_P(GoldenConvAttentionTest, Conv2dWithGroupsStrideDilationPadding) {
  const Golden g = load_golden("conv2d");
  Tensor x = in(g, "x"), w = in(g, "weight"), b = in(g, "bias");
  Tensor y = nn::conv2d(x, w, b,
                        {.stride = nn::Pair(2, 1), .padding = nn::Pair(1, 0), .dilation = nn::Pair(1, 2), .groups = 2});
  expect(y, g, "out");
  (y * plain(g, "grad_out")).sum().backward();
  expect(x.grad(), g, "grad_x");
  expect(w.grad(), g, "grad_weight");
  expect(b.grad(), g, "grad_bias");
}

TEST_P(GoldenConvAttentionTest, ScaledDotProductAttentionWithABoolMask) {
  const Golden g = load_golden("attention");
  Tensor q = in(g, "q"), k = in(g, "k"), v = in(g, "v");
  Tensor mask = plain(g, "mask") > 0.5;
  Tensor y = nn::scaled_dot_product_attention(q, k, v, {.attn_mask = mask});
  expect(y, g, "out");
  (y * plain(g, "grad_out")).sum().backward();
  expect(q.grad(), g, "grad_q");
  expect(k.grad(), g, "grad_k");
  expect(v.grad(), g, "grad_v");
}

KILN_INSTANTIATE_BACKENDS(GoldenConvAttentionTest);

}  // namespace
}  // namespace kiln::testing
