// amp::Autocast: per-thread nestable regions over autocast::Guard, the weight-cast cache (one cast per
// parameter per region, gradients still reach the float32 parameter), and the policy's output dtypes checked
// against casts done by hand with autocast off.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "kiln/autograd/amp.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class AmpAutocastTest : public BackendTest {
 protected:
  DeviceType type() const { return dev().type(); }
};

TEST_P(AmpAutocastTest, ParameterIsCastOncePerRegion) {
  Tensor x = make(uniform(12, -1, 1, 1), {3, 4}, opts());
  Tensor w = make(uniform(8, -1, 1, 2), {4, 2}, opts()).requires_grad_();
  Tensor loss;
  {
    amp::Autocast cast(DType::BFloat16, true, type());
    EXPECT_EQ(autocast::cache_size(), 0u);
    Tensor a = autocast::cast_to(w, DType::BFloat16);
    Tensor b = autocast::cast_to(w, DType::BFloat16);
    EXPECT_EQ(a.dtype(), DType::BFloat16);
    EXPECT_TRUE(a.is_same(b)) << "the second cast of a parameter must return the cached tensor";
    EXPECT_EQ(autocast::cache_size(), 1u);
    Tensor y1 = matmul(x, w);  // both matmuls take the cached bf16 weight
    Tensor y2 = matmul(x, w);
    EXPECT_EQ(y1.dtype(), DType::BFloat16);
    EXPECT_EQ(autocast::cache_size(), 1u);
    loss = (y1.sum() + y2.sum()).to(DType::Float32);
  }
  EXPECT_EQ(autocast::cache_size(), 0u) << "the outermost region's exit clears the cache";
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::Float32);
  // d/dw of sum(x w) used twice: grad[k][j] = 2 * sum_i x[i][k]   (4, 2)
  const std::vector<double> xv = values(x);
  std::vector<double> expected(8);
  for (int k = 0; k < 4; ++k) {
    double col = 0;
    for (int i = 0; i < 3; ++i) col += xv[i * 4 + k];
    expected[k * 2] = expected[k * 2 + 1] = 2 * col;
  }
  expect_values(w.grad(), {4, 2}, expected, 0.02, 0.02);  // bf16 accumulation of 3 terms
}

TEST_P(AmpAutocastTest, OnlyLeavesThatRequireGradAreCached) {
  Tensor x = make(uniform(6, -1, 1, 3), {2, 3}, opts()).requires_grad_();
  Tensor plain = make(uniform(6, -1, 1, 4), {2, 3}, opts());  // a leaf without requires_grad
  amp::Autocast cast(DType::BFloat16, true, type());
  Tensor h = x * 2.0;  // an activation
  EXPECT_FALSE(autocast::cast_to(h, DType::BFloat16).is_same(autocast::cast_to(h, DType::BFloat16)));
  EXPECT_FALSE(autocast::cast_to(plain, DType::BFloat16).is_same(autocast::cast_to(plain, DType::BFloat16)));
  {
    NoGradGuard no_grad;  // a cast without history must not be served to code that records the graph
    EXPECT_FALSE(autocast::cast_to(x, DType::BFloat16).is_same(autocast::cast_to(x, DType::BFloat16)));
  }
  // float32 targets (Policy::Float32) are not cached either: x is float32 already, so it is returned as is.
  EXPECT_TRUE(autocast::cast_to(x, DType::Float32).is_same(x));
  EXPECT_EQ(autocast::cache_size(), 0u);
}

TEST_P(AmpAutocastTest, InPlaceUpdateOfTheParameterInvalidatesItsCast) {
  Tensor w = make({1, 2, 3, 4}, {2, 2}, opts()).requires_grad_();
  amp::Autocast cast(DType::BFloat16, true, type());
  Tensor a = autocast::cast_to(w, DType::BFloat16);
  {
    NoGradGuard no_grad;
    w.mul_(2.0);  // what an optimizer step does: bumps the version counter
  }
  Tensor b = autocast::cast_to(w, DType::BFloat16);
  EXPECT_FALSE(a.is_same(b));
  expect_values(a, {2, 2}, {1, 2, 3, 4}, 0, 0);
  expect_values(b, {2, 2}, {2, 4, 6, 8}, 0, 0);
  EXPECT_TRUE(b.is_same(autocast::cast_to(w, DType::BFloat16)));
  EXPECT_EQ(autocast::cache_size(), 1u);
}

TEST_P(AmpAutocastTest, NestedRegionsShareTheCacheAndRestoreTheOuterState) {
  Tensor w = make(uniform(4, -1, 1, 5), {2, 2}, opts()).requires_grad_();
  amp::Autocast outer(DType::BFloat16, true, type());
  Tensor a = autocast::cast_to(w, DType::BFloat16);
  {
    amp::Autocast inner(DType::Float16, true, type());
    EXPECT_EQ(autocast::get_dtype(type()), DType::Float16);
    EXPECT_TRUE(autocast::cast_to(w, DType::BFloat16).is_same(a)) << "the outer region's entry is still there";
    Tensor h = autocast::cast_to(w, DType::Float16);  // another dtype: its own entry
    EXPECT_EQ(h.dtype(), DType::Float16);
    EXPECT_TRUE(h.is_same(autocast::cast_to(w, DType::Float16)));
    EXPECT_EQ(autocast::cache_size(), 2u);
    {
      amp::Autocast off(DType::BFloat16, false, type());
      EXPECT_FALSE(autocast::is_enabled(type()));
    }
    EXPECT_TRUE(autocast::is_enabled(type()));
    EXPECT_EQ(autocast::get_dtype(type()), DType::Float16);
  }
  EXPECT_EQ(autocast::get_dtype(type()), DType::BFloat16);
  EXPECT_TRUE(autocast::is_enabled(type()));
  EXPECT_EQ(autocast::cache_size(), 2u) << "only the outermost exit clears the cache";
  EXPECT_TRUE(autocast::cast_to(w, DType::BFloat16).is_same(a));
}

TEST_P(AmpAutocastTest, RegionStateIsRestoredOnException) {
  Tensor w = make(uniform(4, -1, 1, 6), {2, 2}, opts()).requires_grad_();
  try {
    amp::Autocast cast(DType::BFloat16, true, type());
    autocast::cast_to(w, DType::BFloat16);
    throw Error("boom");
  } catch (const Error&) {
  }
  EXPECT_FALSE(autocast::is_enabled(type()));
  EXPECT_EQ(autocast::cache_size(), 0u);
}

TEST_P(AmpAutocastTest, DisabledRegionChangesNothing) {
  Tensor x = make(uniform(12, -1, 1, 7), {3, 4}, opts());
  Tensor w = make(uniform(8, -1, 1, 8), {4, 2}, opts()).requires_grad_();
  const Tensor control = matmul(x, w);
  {
    amp::Autocast off(DType::BFloat16, false, type());
    EXPECT_FALSE(autocast::is_enabled(type()));
    Tensor y = matmul(x, w);
    EXPECT_EQ(y.dtype(), DType::Float32);
    expect_values(y, {3, 2}, values(control), 0, 0);
    EXPECT_EQ(autocast::cache_size(), 0u);
  }
  {
    amp::Autocast on(DType::BFloat16, true, type());
    {
      amp::Autocast off(DType::BFloat16, false, type());  // turns autocast off inside an enabled region
      expect_values(matmul(x, w), {3, 2}, values(control), 0, 0);
    }
    EXPECT_EQ(matmul(x, w).dtype(), DType::BFloat16);
  }
  EXPECT_FALSE(autocast::is_enabled(type()));
}

TEST_P(AmpAutocastTest, OtherDeviceTypeIsUnaffected) {
  const DeviceType other = dev().is_cpu() ? DeviceType::CUDA : DeviceType::CPU;
  Tensor x = make(uniform(12, -1, 1, 9), {3, 4}, opts());
  Tensor w = make(uniform(8, -1, 1, 10), {4, 2}, opts());
  amp::Autocast cast(DType::BFloat16, true, other);
  EXPECT_EQ(matmul(x, w).dtype(), DType::Float32);
}

TEST(AmpAutocast, RejectsNonHalfDtypes) {
  expect_error([] { amp::Autocast cast(DType::Float64, true, DeviceType::CPU); }, {"autocast", "Float16 or BFloat16"});
  EXPECT_FALSE(autocast::is_enabled(DeviceType::CPU));
}

TEST(AmpAutocast, PlainGuardDoesNotCache) {
  Tensor w = make({1, 2}, {2}).requires_grad_();
  autocast::Guard guard(DeviceType::CPU, DType::BFloat16);
  EXPECT_FALSE(autocast::cast_to(w, DType::BFloat16).is_same(autocast::cast_to(w, DType::BFloat16)));
}

// Each op's output dtype follows the policy table, and its values equal the same op computed with autocast off
// on inputs cast by hand to the dtype the policy chose.
TEST_P(AmpAutocastTest, OutputDtypesAndValuesMatchHandCastControl) {
  const DType low = DType::BFloat16;
  Tensor x = make(uniform(24, -1, 1, 11), {4, 6}, opts());                   // (N, in)
  Tensor w = make(uniform(18, -1, 1, 12), {3, 6}, opts()).requires_grad_();  // (out, in)
  Tensor b = make(uniform(3, -1, 1, 13), {3}, opts()).requires_grad_();
  Tensor img = make(uniform(2 * 2 * 5 * 5, -1, 1, 14), {2, 2, 5, 5}, opts());  // (N, C, H, W)
  Tensor k = make(uniform(3 * 2 * 3 * 3, -1, 1, 15), {3, 2, 3, 3}, opts()).requires_grad_();
  Tensor target = make({0, 2, 1, 0}, {4}, opts(DType::Int64));
  Tensor pos = make(uniform(24, 0.5, 2, 16), {4, 6}, opts());

  struct Result {
    Tensor got, control;
    DType dtype;
    const char* what;
  };
  std::vector<Result> results;
  {
    amp::Autocast cast(low, true, type());
    Tensor hl = x.to(low);  // a low-precision activation, as a matmul would give
    results.push_back({matmul(x, w.transpose(0, 1)), Tensor(), low, "matmul"});
    results.push_back({nn::linear(x, w, b), Tensor(), low, "linear"});
    results.push_back({nn::conv2d(img, k), Tensor(), low, "conv2d"});
    results.push_back({softmax(hl, -1), Tensor(), DType::Float32, "softmax"});
    results.push_back({log_softmax(hl, -1), Tensor(), DType::Float32, "log_softmax"});
    results.push_back({nn::layer_norm(hl, {6}), Tensor(), DType::Float32, "layer_norm"});
    results.push_back({nn::cross_entropy(hl, target), Tensor(), DType::Float32, "cross_entropy"});
    results.push_back({nn::mse_loss(hl, x), Tensor(), DType::Float32, "mse_loss"});
    results.push_back({sum(hl), Tensor(), DType::Float32, "sum"});
    results.push_back({exp(hl), Tensor(), DType::Float32, "exp"});
    results.push_back({log(pos.to(low)), Tensor(), DType::Float32, "log"});
    results.push_back({hl + x, Tensor(), DType::Float32, "add (bf16 + f32 promotes)"});
    results.push_back({hl + hl, Tensor(), low, "add (bf16 + bf16 keeps)"});
  }
  ASSERT_FALSE(autocast::is_enabled(type()));
  const Tensor xl = x.to(low), hl = x.to(low), h32 = hl.to(DType::Float32);
  Tensor controls[] = {
      matmul(xl, w.to(low).transpose(0, 1)),
      nn::linear(xl, w.to(low), b.to(low)),
      nn::conv2d(img.to(low), k.to(low)),
      softmax(h32, -1),
      log_softmax(h32, -1),
      nn::layer_norm(h32, {6}),
      nn::cross_entropy(h32, target),
      nn::mse_loss(h32, x),
      sum(h32),
      exp(h32),
      log(pos.to(low).to(DType::Float32)),
      h32 + x,
      hl + hl,
  };
  ASSERT_EQ(results.size(), std::size(controls));
  for (size_t i = 0; i < results.size(); ++i) {
    SCOPED_TRACE(results[i].what);
    EXPECT_EQ(results[i].got.dtype(), results[i].dtype);
    EXPECT_EQ(controls[i].dtype(), results[i].dtype);
    // Exact, except the fused CUDA cross-entropy: under autocast it reads the bf16 logits directly (8 per 16-byte
    // load) while the control reads float32 (4 per load), so its row sums add in another order (1 ulp apart).
    const bool fused_ce = std::string(results[i].what) == "cross_entropy" && dev().is_cuda();
    const double tol = fused_ce ? 1e-6 : 0;
    expect_values(results[i].got, controls[i].shape(), values(controls[i]), tol, tol);
  }
}

// Two models trained in two regions per step (a generator and a discriminator, say), the regions made through
// std::optional::emplace (one constructor call site for both): each region starts with an empty cache and casts
// only what its own forward uses, and the gradients reach each model's float32 parameters.
TEST_P(AmpAutocastTest, EachRegionCastsOnlyWhatItUses) {
  const DType low = DType::BFloat16;
  Tensor a = make(uniform(6, -1, 1, 27), {2, 3}, opts()).requires_grad_();
  Tensor b = make(uniform(4, -1, 1, 28), {2, 2}, opts()).requires_grad_();
  auto sum_of = [&](const Tensor& p) { return autocast::cast_to(p, low).sum().to(DType::Float32); };
  for (int step = 0; step < 2; ++step) {
    Tensor la, lb;
    for (int model = 0; model < 2; ++model) {
      std::optional<amp::Autocast> region;
      region.emplace(low, true, type());
      EXPECT_EQ(autocast::cache_size(), 0u) << "step " << step << ", model " << model;
      (model == 0 ? la : lb) = sum_of(model == 0 ? a : b);
      EXPECT_EQ(autocast::cache_size(), 1u) << "step " << step << ", model " << model;
    }
    (la + lb).backward();
  }
  expect_values(a.grad(), {2, 3}, std::vector<double>(6, 2.0), 0, 0);
  expect_values(b.grad(), {2, 2}, std::vector<double>(4, 2.0), 0, 0);
}

KILN_INSTANTIATE_BACKENDS(AmpAutocastTest);

}  // namespace
}  // namespace kiln::testing
