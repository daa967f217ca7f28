// Gradient checkpointing: gradients equal those without checkpointing bit for bit (dropout inside, so
// the random state must be replayed), nesting, inputs that do not require grad, captured parameters.
#include <gtest/gtest.h>

#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class CheckpointTest : public BackendTest {};

// Inverted dropout written with the tensor core's bernoulli: its mask comes from the device's default
// generator, so a recomputation that did not replay the random state would draw another mask.
Tensor dropout(const Tensor& x, double p) {
  Tensor keep = bernoulli(x.shape(), 1.0 - p, x.options());
  return x * keep / (1.0 - p);
}

// One "layer": tanh(x * w + b) followed by dropout.
Tensor layer(const Tensor& x, const Tensor& w, const Tensor& b) { return dropout(tanh(x * w + b), 0.3); }

struct Params {
  std::vector<Tensor> w, b;
};

Params make_params(int layers, const TensorOptions& options) {
  Params p;
  for (int i = 0; i < layers; ++i) {
    p.w.push_back(make(uniform(8, 0.5, 1.5, 10 + i), {8}, options).requires_grad_());
    p.b.push_back(make(uniform(8, -0.2, 0.2, 50 + i), {8}, options).requires_grad_());
  }
  return p;
}

TEST_P(CheckpointTest, GradientsEqualThoseWithoutCheckpointingBitForBit) {
  const int layers = 6;
  Params plain = make_params(layers, opts());
  Params ckpt = make_params(layers, opts());
  Tensor x0 = make(uniform(16, -1, 1, 3), {2, 8}, opts());

  manual_seed(1234);
  Tensor x = x0.clone().requires_grad_();
  Tensor h = x;
  for (int i = 0; i < layers; ++i) h = layer(h, plain.w[i], plain.b[i]);
  h.square().sum().backward();

  manual_seed(1234);
  Tensor xc = x0.clone().requires_grad_();
  Tensor hc = xc;
  for (int i = 0; i < layers; i += 2) {
    hc = autograd::checkpoint(
        [&, i](const Tensor& in) { return layer(layer(in, ckpt.w[i], ckpt.b[i]), ckpt.w[i + 1], ckpt.b[i + 1]); }, hc);
  }
  ASSERT_NE(hc.grad_fn(), nullptr);
  EXPECT_EQ(hc.grad_fn()->name(), "CheckpointBackward");
  EXPECT_TRUE(equal(h.detach(), hc.detach()));
  hc.square().sum().backward();

  EXPECT_TRUE(equal(x.grad(), xc.grad()));
  for (int i = 0; i < layers; ++i) {
    SCOPED_TRACE("layer " + std::to_string(i));
    ASSERT_TRUE(ckpt.w[i].grad().defined());
    EXPECT_TRUE(equal(plain.w[i].grad(), ckpt.w[i].grad()));
    EXPECT_TRUE(equal(plain.b[i].grad(), ckpt.b[i].grad()));
  }
}

// Under autocast the recomputation runs in the autocast dtypes of the first run, although backward itself runs
// with autocast off: the gradients equal those without checkpointing bit for bit, and the recomputed matmul is
// bfloat16 (a float32 recomputation would give other gradients).
TEST_P(CheckpointTest, RecomputationReplaysAutocast) {
  const TensorOptions o = opts();
  Tensor w_plain = make(uniform(64, -1, 1, 7), {8, 8}, o).requires_grad_();
  Tensor w_ckpt = make(uniform(64, -1, 1, 7), {8, 8}, o).requires_grad_();
  Tensor x = make(uniform(32, -1, 1, 8), {4, 8}, o);
  DType recomputed = DType::Float32;
  auto block = [&](const Tensor& in, const Tensor& w) {
    Tensor y = matmul(tanh(matmul(in, w)), w);  // autocast: bfloat16
    recomputed = y.dtype();
    return y.to(DType::Float32);
  };
  {
    autocast::Guard cast(dev().type(), DType::BFloat16);
    block(x, w_plain).square().sum().backward();
  }
  {
    autocast::Guard cast(dev().type(), DType::BFloat16);
    Tensor y = autograd::checkpoint([&](const Tensor& in) { return block(in, w_ckpt); }, x);
    recomputed = DType::Float32;
    y.square().sum().backward();  // the recomputation sets `recomputed`
  }
  EXPECT_EQ(recomputed, DType::BFloat16);
  EXPECT_TRUE(equal(w_plain.grad(), w_ckpt.grad()));
  EXPECT_FALSE(autocast::is_enabled(dev().type()));  // restored after backward and the guards
}

TEST_P(CheckpointTest, RecomputationLeavesTheGeneratorWhereBackwardFoundIt) {
  Params p = make_params(1, opts());
  manual_seed(7);
  Tensor x = make(uniform(8, -1, 1, 3), {8}, opts()).requires_grad_();
  Tensor y = autograd::checkpoint([&](const Tensor& in) { return layer(in, p.w[0], p.b[0]); }, x);
  const GeneratorState before = default_generator(dev()).state();
  y.sum().backward();
  EXPECT_EQ(default_generator(dev()).state(), before);
}

TEST_P(CheckpointTest, Nested) {
  Params plain = make_params(4, opts());
  Params ckpt = make_params(4, opts());
  Tensor x0 = make(uniform(8, -1, 1, 5), {8}, opts());

  manual_seed(99);
  Tensor x = x0.clone().requires_grad_();
  Tensor h = x;
  for (int i = 0; i < 4; ++i) h = layer(h, plain.w[i], plain.b[i]);
  h.sum().backward();

  manual_seed(99);
  Tensor xc = x0.clone().requires_grad_();
  auto inner = [&](int i) {
    return [&, i](const Tensor& in) { return layer(layer(in, ckpt.w[i], ckpt.b[i]), ckpt.w[i + 1], ckpt.b[i + 1]); };
  };
  Tensor hc = autograd::checkpoint(
      [&](const Tensor& in) { return autograd::checkpoint(inner(2), autograd::checkpoint(inner(0), in)); }, xc);
  hc.sum().backward();
  EXPECT_TRUE(equal(x.grad(), xc.grad()));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(equal(plain.w[i].grad(), ckpt.w[i].grad())) << "layer " << i;
}

// The first segment of a network sees data that does not require grad; the parameters inside must
// still get their gradients.
TEST_P(CheckpointTest, InputsThatDoNotRequireGrad) {
  Params plain = make_params(1, opts());
  Params ckpt = make_params(1, opts());
  Tensor data = make(uniform(8, -1, 1, 9), {8}, opts());
  Tensor mask = make(uniform(8, 0, 1, 11), {8}, opts());  // a second input, also without grad

  manual_seed(5);
  (layer(data, plain.w[0], plain.b[0]) * mask).sum().backward();
  manual_seed(5);
  TensorList out = autograd::checkpoint(
      [&](const TensorList& in) { return TensorList{layer(in[0], ckpt.w[0], ckpt.b[0]) * in[1]}; }, {data, mask});
  ASSERT_TRUE(out[0].requires_grad());
  out[0].sum().backward();
  EXPECT_TRUE(equal(plain.w[0].grad(), ckpt.w[0].grad()));
  EXPECT_TRUE(equal(plain.b[0].grad(), ckpt.b[0].grad()));
  EXPECT_FALSE(data.grad().defined());

  // Nothing requires grad at all: the result is a plain tensor.
  Tensor z = autograd::checkpoint([](const Tensor& in) { return in * 2; }, data);
  EXPECT_FALSE(z.requires_grad());
}

TEST_P(CheckpointTest, MixedInputsGetTheirOwnGradients) {
  Tensor a = make({1, 2, 3}, {3}, opts()).requires_grad_();
  Tensor b = make({4, 5, 6}, {3}, opts());
  Tensor c = make({7, 8, 9}, {3}, opts()).requires_grad_();
  TensorList out = autograd::checkpoint(
      [](const TensorList& in) {
        return TensorList{in[0] * in[1] * in[2], in[0] + in[2]};
      },
      {a, b, c});
  (out[0].sum() + out[1].sum() * 2).backward();
  expect_values(a.grad(), {3}, {4 * 7 + 2, 5 * 8 + 2, 6 * 9 + 2});
  expect_values(c.grad(), {3}, {1 * 4 + 2, 2 * 5 + 2, 3 * 6 + 2});
  EXPECT_FALSE(b.grad().defined());
}

TEST_P(CheckpointTest, UnderNoGradItJustRunsFn) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  NoGradGuard no_grad;
  Tensor y = autograd::checkpoint([](const Tensor& in) { return in * 3; }, a);
  EXPECT_FALSE(y.requires_grad());
  expect_values(y, {2}, {3, 6});
}

TEST_P(CheckpointTest, SecondBackwardNeedsRetainGraph) {
  Tensor a = make({1, 2}, {2}, opts()).requires_grad_();
  Tensor y = autograd::checkpoint([](const Tensor& in) { return in * in; }, a).sum();
  y.backward({}, /*retain_graph=*/true);
  y.backward();
  expect_values(a.grad(), {2}, {4, 8});
  expect_error([&] { y.backward(); }, {"CheckpointBackward", "retain_graph=true"});
}

KILN_INSTANTIATE_BACKENDS(CheckpointTest);

}  // namespace
}  // namespace kiln::testing
