// Autocast, op by op: every op of the policy table that kiln has (all of autocast::Op but Cast, which names no kiln op,
// and the layers' ops, kiln/layers/autocast_ops.h) run under autocast gives the dtype and the exact values of the same
// op run with autocast off on inputs cast by hand as the policy says (LowerPrecision: to the autocast dtype; Float32:
// to float32; Promote: to the promoted dtype of the floating inputs; Keep: as they are). Inputs are chosen so that each
// policy has work to do: float32 inputs for LowerPrecision ops, bfloat16 inputs for Float32 ops, and mixed bfloat16 /
// float32 inputs for Keep and Promote ops.
#include <gtest/gtest.h>

#include <string_view>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/layers/autocast_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using autocast::Op;
namespace lops = nn::autocast_ops;  // the layers' autocast ops
using autocast::Policy;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct Case {
  Op op;
  std::string name;
  std::vector<Tensor> inputs;  // float32 floating inputs (re-typed per policy below) and integer/bool ones
  Fn fn;
};

class AutocastTableTest : public BackendTest {
 protected:
  Tensor f(const Shape& shape, double lo = -1, double hi = 1, uint64_t seed = 1) {
    return make(uniform(numel(shape), lo, hi, seed), shape, opts(DType::Float32));
  }
  Tensor idx(const std::vector<double>& v, const Shape& shape) { return make(v, shape, opts(DType::Int64)); }
  Tensor mask(const Shape& shape) {
    std::vector<double> v(static_cast<size_t>(numel(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = (i % 3 == 0) ? 1 : 0;
    return make(v, shape, opts(DType::Bool));
  }

  std::vector<Case> cases() {
    const Tensor a = f({3, 4}, -1, 1, 1), b = f({3, 4}, -1, 1, 2), pos = f({3, 4}, 0.5, 2, 3);
    const Tensor m = mask({3, 4});
    auto unary = [&](Op op, const char* name, Tensor (*fn)(const Tensor&), const Tensor& x) {
      return Case{op, name, {x}, [fn](const std::vector<Tensor>& in) { return fn(in[0]); }};
    };
    std::vector<Case> c = {
        {Op::Gelu, "gelu", {a}, [](const auto& in) { return gelu(in[0]); }},
        unary(Op::Square, "square", &kiln::square, a),
  // the unary table's ops (kiln/tensor/unary_ops.h), on inputs in their domains
#define KILN_X(Enum, name, result, policy_, save, derivative, reference, domain, bool_advice)            \
  unary(Op::Enum, #name, &kiln::name,                                                                 \
        std::string_view(#domain) == "Positive" || std::string_view(#domain) == "AboveMinusOne" ? pos : a),
        KILN_UNARY_OPS(KILN_X)
#undef KILN_X
  // the binary table's ops and predicates (kiln/tensor/binary_ops.h), on inputs in their domains
#define KILN_X(Enum, name, result, policy_, forms, grad_a, reads_a, grad_b, reads_b, both, reference, domain, ...) \
  {Op::Enum, #name,                                                                                               \
   {std::string_view(#domain) == "PositiveBase" ? pos : a,                                                        \
    std::string_view(#domain) == "All" || std::string_view(#domain) == "PositiveBase" ? b : pos},                 \
   [](const auto& in) { return kiln::name(in[0], in[1]); }},
        KILN_BINARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Enum, name, ...) {Op::Enum, #name, {a, b}, [](const auto& in) { return kiln::name(in[0], in[1]); }},
        KILN_BINARY_PREDICATES(KILN_X)
#undef KILN_X
        {Op::Clamp, "clamp", {a}, [](const auto& in) { return clamp(in[0], Scalar(-0.5), Scalar(0.5)); }},
        {Op::Where, "where", {m, a, b}, [](const auto& in) { return where(in[0], in[1], in[2]); }},
        {Op::MaskedFill, "masked_fill", {a, m}, [](const auto& in) { return masked_fill(in[0], in[1], 0.25); }},
        {Op::Lerp, "lerp", {a, b}, [](const auto& in) { return lerp(in[0], in[1], 0.3); }},
        {Op::Sum, "sum", {a}, [](const auto& in) { return sum(in[0], {1}); }},
        {Op::Mean, "mean", {a}, [](const auto& in) { return mean(in[0], {0}); }},
        {Op::Prod, "prod", {pos}, [](const auto& in) { return prod(in[0], {1}); }},
        {Op::Amax, "amax", {a}, [](const auto& in) { return amax(in[0], {1}); }},
        {Op::Amin, "amin", {a}, [](const auto& in) { return amin(in[0], {1}); }},
        {Op::MaxMin, "max(dim)", {a}, [](const auto& in) { return std::get<0>(max(in[0], 1)); }},
        {Op::Var, "var", {a}, [](const auto& in) { return var(in[0], {1}); }},
        {Op::Std, "std", {a}, [](const auto& in) { return kiln::std(in[0], {1}); }},
        {Op::Norm, "norm", {a}, [](const auto& in) { return norm(in[0], 2, {1}); }},
        {Op::LogSumExp, "logsumexp", {a}, [](const auto& in) { return logsumexp(in[0], {1}); }},
        {Op::Softmax, "softmax", {a}, [](const auto& in) { return softmax(in[0], -1); }},
        {Op::LogSoftmax, "log_softmax", {a}, [](const auto& in) { return log_softmax(in[0], -1); }},
        {Op::Matmul, "matmul", {a, f({4, 5}, -1, 1, 4)}, [](const auto& in) { return matmul(in[0], in[1]); }},
        {Op::Mm, "mm", {a, f({4, 5}, -1, 1, 4)}, [](const auto& in) { return mm(in[0], in[1]); }},
        {Op::Bmm, "bmm", {f({2, 3, 4}), f({2, 4, 5}, -1, 1, 5)}, [](const auto& in) { return bmm(in[0], in[1]); }},
        {Op::Addmm, "addmm", {f({5}), a, f({4, 5}, -1, 1, 4)},
         [](const auto& in) { return addmm(in[0], in[1], in[2]); }},
        {Op::Dot, "dot", {f({6}), f({6}, -1, 1, 6)}, [](const auto& in) { return dot(in[0], in[1]); }},
        {Op::Outer, "outer", {f({3}), f({4}, -1, 1, 6)}, [](const auto& in) { return outer(in[0], in[1]); }},
        {Op::View, "reshape", {a}, [](const auto& in) { return reshape(in[0], {4, 3}); }},
        {Op::Cat, "cat", {a, b}, [](const auto& in) { return cat({in[0], in[1]}, 0); }},
        {Op::Stack, "stack", {a, b}, [](const auto& in) { return stack({in[0], in[1]}, 0); }},
        {Op::IndexSelect, "index_select", {a, idx({2, 0}, {2})},
         [](const auto& in) { return index_select(in[0], 0, in[1]); }},
        {Op::Gather, "gather", {a, idx({0, 3, 1, 1, 2, 0}, {3, 2})},
         [](const auto& in) { return gather(in[0], 1, in[1]); }},
        {Op::Scatter, "scatter", {a, idx({0, 3, 1, 1, 2, 0}, {3, 2}), f({3, 2}, -1, 1, 7)},
         [](const auto& in) { return scatter(in[0], 1, in[1], in[2]); }},
        {Op::ScatterAdd, "scatter_add", {a, idx({0, 3, 1, 1, 2, 0}, {3, 2}), f({3, 2}, -1, 1, 7)},
         [](const auto& in) { return scatter_add(in[0], 1, in[1], in[2]); }},
        {Op::IndexAdd, "index_add", {a, idx({2, 0}, {2}), f({2, 4}, -1, 1, 8)},
         [](const auto& in) { return index_add(in[0], 0, in[1], in[2]); }},
        {Op::Embedding, "embedding", {f({5, 3}), idx({4, 0, 2}, {3})},
         [](const auto& in) { return embedding(in[0], in[1]); }},
        {Op::MaskedSelect, "masked_select", {a, m}, [](const auto& in) { return masked_select(in[0], in[1]); }},
        {Op::Sort, "sort", {a}, [](const auto& in) { return std::get<0>(sort(in[0], 1)); }},
        {Op::Topk, "topk", {a}, [](const auto& in) { return std::get<0>(topk(in[0], 2, 1)); }},
        {Op::Tril, "tril", {a}, [](const auto& in) { return tril(in[0]); }},
        {Op::Triu, "triu", {a}, [](const auto& in) { return triu(in[0]); }},
        // Layers and losses.
        {lops::linear(), "linear", {a, f({2, 4}, -1, 1, 9), f({2}, -1, 1, 10)},
         [](const auto& in) { return nn::linear(in[0], in[1], in[2]); }},
        {lops::conv(), "conv2d", {f({1, 2, 5, 5}), f({3, 2, 3, 3}, -1, 1, 11), f({3}, -1, 1, 12)},
         [](const auto& in) { return nn::conv2d(in[0], in[1], in[2], {.padding = 1}); }},
        {lops::batch_norm(), "batch_norm", {f({4, 3, 2}), f({3}, 0.5, 1.5, 13), f({3}, -1, 1, 14)},
         [](const auto& in) { return nn::batch_norm(in[0], {}, {}, in[1], in[2], /*training=*/true); }},
        {lops::layer_norm(), "layer_norm", {a, f({4}, 0.5, 1.5, 15), f({4}, -1, 1, 16)},
         [](const auto& in) { return nn::layer_norm(in[0], {4}, in[1], in[2]); }},
        {lops::group_norm(), "group_norm", {f({2, 4, 3}), f({4}, 0.5, 1.5, 17), f({4}, -1, 1, 18)},
         [](const auto& in) { return nn::group_norm(in[0], 2, in[1], in[2]); }},
        {lops::dropout(), "dropout", {a},
         [](const auto& in) {
           Generator gen(5);
           return nn::dropout(in[0], 0.3, /*training=*/true, &gen);
         }},
        {lops::attention(), "scaled_dot_product_attention",
         {f({2, 3, 4}), f({2, 5, 4}, -1, 1, 19), f({2, 5, 4}, -1, 1, 20)},
         [](const auto& in) { return nn::scaled_dot_product_attention(in[0], in[1], in[2]); }},
        {lops::cross_entropy(), "cross_entropy", {a, idx({1, 3, 0}, {3})},
         [](const auto& in) { return nn::cross_entropy(in[0], in[1]); }},
        {lops::nll_loss(), "nll_loss", {a, idx({1, 3, 0}, {3})},
         [](const auto& in) { return nn::nll_loss(in[0], in[1]); }},
        {lops::mse_loss(), "mse_loss", {a, b}, [](const auto& in) { return nn::mse_loss(in[0], in[1]); }},
        {lops::binary_cross_entropy_with_logits(), "binary_cross_entropy_with_logits", {a, f({3, 4}, 0, 1, 21)},
         [](const auto& in) { return nn::binary_cross_entropy_with_logits(in[0], in[1]); }},
    };
    return c;
  }
};

// The floating inputs as the case feeds them under autocast: float32 for LowerPrecision, bfloat16 for Float32,
// the first floating input bfloat16 and the rest float32 for Keep and Promote.
std::vector<Tensor> typed_inputs(const std::vector<Tensor>& in, Policy p) {
  std::vector<Tensor> out;
  bool first = true;
  for (const Tensor& t : in) {
    if (!t.is_floating_point()) {
      out.push_back(t);
      continue;
    }
    DType d = DType::Float32;
    if (p == Policy::Float32 || ((p == Policy::Keep || p == Policy::Promote) && first)) d = DType::BFloat16;
    out.push_back(t.to(d));
    first = false;
  }
  return out;
}

// What the policy makes of those inputs, cast by hand.
std::vector<Tensor> hand_cast(const std::vector<Tensor>& in, Policy p, DType low) {
  std::optional<DType> target;
  if (p == Policy::LowerPrecision) target = low;
  if (p == Policy::Float32) target = DType::Float32;
  if (p == Policy::Promote) {
    for (const Tensor& t : in) {
      if (t.is_floating_point()) target = target ? promote_types(*target, t.dtype()) : t.dtype();
    }
  }
  std::vector<Tensor> out;
  for (const Tensor& t : in) out.push_back(target && t.is_floating_point() ? t.to(*target) : t);
  return out;
}

TEST_P(AutocastTableTest, EveryOpMatchesItsHandCastControl) {
  const DType low = DType::BFloat16;
  size_t checked = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Policy p = autocast::policy(c.op);
    const std::vector<Tensor> in = typed_inputs(c.inputs, p);
    Tensor got;
    {
      autocast::Guard guard(dev().type(), low);
      got = c.fn(in);
    }
    const Tensor expected = c.fn(hand_cast(in, p, low));
    ASSERT_EQ(got.dtype(), expected.dtype());
    if (p == Policy::LowerPrecision) {
      EXPECT_EQ(got.dtype(), low);
    }
    if (p == Policy::Float32) {
      EXPECT_EQ(got.dtype(), DType::Float32);
    }
    // Exact, but for the fused CUDA cross-entropy, which reads the bf16 logits directly (8 per 16-byte load) where
    // the control reads float32 ones (4 per load): its sums add in another order.
    const double tol = c.op == lops::cross_entropy() && dev().is_cuda() ? 1e-6 : 0;
    expect_values(got, expected.shape(), values(expected), tol, tol);
    ++checked;
  }
  // Every op of autocast::Op but Cast, which names no kiln op, and the 11 ops kiln/layers registers.
  EXPECT_EQ(checked, static_cast<size_t>(Op::kCount) - 1 + 11);
}

KILN_INSTANTIATE_BACKENDS(AutocastTableTest);

// The layers' ops (kiln/layers/autocast_ops.h) are registered with autograd's table under their names, with the
// default policies they had as values of autocast::Op, and set_policy changes them as any other op's.
TEST(AutocastLayerOps, RegisteredWithTheirDefaultPolicies) {
  namespace ops = nn::autocast_ops;
  const std::vector<std::tuple<Op, std::string, Policy>> expected = {
      {ops::linear(), "linear", Policy::LowerPrecision},
      {ops::conv(), "conv", Policy::LowerPrecision},
      {ops::attention(), "scaled_dot_product_attention", Policy::LowerPrecision},
      {ops::batch_norm(), "batch_norm", Policy::Keep},
      {ops::layer_norm(), "layer_norm", Policy::Float32},
      {ops::group_norm(), "group_norm", Policy::Float32},
      {ops::dropout(), "dropout", Policy::Keep},
      {ops::cross_entropy(), "cross_entropy", Policy::Float32},
      {ops::nll_loss(), "nll_loss", Policy::Float32},
      {ops::mse_loss(), "mse_loss", Policy::Float32},
      {ops::binary_cross_entropy_with_logits(), "binary_cross_entropy_with_logits", Policy::Float32},
  };
  for (const auto& [op, name, policy] : expected) {
    EXPECT_GE(static_cast<size_t>(op), static_cast<size_t>(Op::kCount)) << name;
    EXPECT_EQ(autocast::registered_name(op), name);
    EXPECT_EQ(autocast::policy(op), policy) << name;
  }
  // set_policy reaches the layer: linear kept in float32 under autocast, then back to bfloat16.
  const Tensor x = make(uniform(6, -1, 1, 1), {2, 3}, {.dtype = DType::Float32});
  const Tensor w = make(uniform(6, -1, 1, 2), {2, 3}, {.dtype = DType::Float32});
  autocast::Guard guard(DeviceType::CPU, DType::BFloat16);
  EXPECT_EQ(nn::linear(x, w).dtype(), DType::BFloat16);
  autocast::set_policy(ops::linear(), Policy::Keep);
  EXPECT_EQ(nn::linear(x, w).dtype(), DType::Float32);
  autocast::set_policy(ops::linear(), Policy::LowerPrecision);
  EXPECT_EQ(nn::linear(x, w).dtype(), DType::BFloat16);
}


}  // namespace
}  // namespace kiln::testing
