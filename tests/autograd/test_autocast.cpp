// The autocast hook: one policy table keyed by autocast::Op decides each op's compute dtype; gradients
// flow back to float32 parameters in float32.
#include <gtest/gtest.h>

#include <string_view>

#include "kiln/tensor/cuda.h"      // compute_capability
#include "support/grad_support.h"  // linear_gradients
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class AutocastTest : public BackendTest {};

TEST(AutocastPolicy, TableClasses) {
  EXPECT_EQ(autocast::policy(autocast::Op::Matmul), autocast::Policy::LowerPrecision);
  EXPECT_EQ(autocast::policy(autocast::Op::Softmax), autocast::Policy::Float32);
  EXPECT_EQ(autocast::policy(autocast::Op::Add), autocast::Policy::Keep);
  EXPECT_EQ(autocast::policy(autocast::Op::Cat), autocast::Policy::Promote);
  autocast::set_policy(autocast::Op::Add, autocast::Policy::Float32);
  EXPECT_EQ(autocast::policy(autocast::Op::Add), autocast::Policy::Float32);
  autocast::set_policy(autocast::Op::Add, autocast::Policy::Keep);
}

// An op another module registers gets an id of the same table: its default policy, set_policy and policy, its
// name; registering the name again gives the same id, and with another default policy is an error.
TEST(AutocastPolicy, RegisteredOpsHaveTheirOwnEntries) {
  const autocast::Op a = autocast::register_op("test_registered_a", autocast::Policy::LowerPrecision);
  const autocast::Op b = autocast::register_op("test_registered_b", autocast::Policy::Float32);
  EXPECT_NE(a, b);
  EXPECT_GE(static_cast<size_t>(a), static_cast<size_t>(autocast::Op::kCount));
  EXPECT_EQ(autocast::registered_name(a), "test_registered_a");
  EXPECT_EQ(autocast::registered_name(b), "test_registered_b");
  EXPECT_EQ(autocast::registered_name(autocast::Op::Matmul), "");
  EXPECT_EQ(autocast::policy(a), autocast::Policy::LowerPrecision);
  EXPECT_EQ(autocast::policy(b), autocast::Policy::Float32);
  EXPECT_EQ(autocast::register_op("test_registered_a", autocast::Policy::LowerPrecision), a);
  expect_error([] { autocast::register_op("test_registered_a", autocast::Policy::Keep); },
               {"test_registered_a", "registered already", "another default policy"});
  expect_error([] { autocast::register_op("", autocast::Policy::Keep); }, {"register_op", "name"});
  autocast::set_policy(a, autocast::Policy::Keep);
  EXPECT_EQ(autocast::policy(a), autocast::Policy::Keep);
  EXPECT_EQ(autocast::policy(b), autocast::Policy::Float32);  // its own entry only
  autocast::set_policy(a, autocast::Policy::LowerPrecision);
  // The policy decides the dtype of a registered op as of any other.
  Tensor x = make(uniform(4, -1, 1, 1), {4}, {.dtype = DType::Float32});
  {
    autocast::Guard cast(DeviceType::CPU, DType::BFloat16);
    EXPECT_EQ(std::get<0>(autocast::inputs(a, x)).dtype(), DType::BFloat16);
    EXPECT_EQ(std::get<0>(autocast::inputs(b, x.to(DType::BFloat16))).dtype(), DType::Float32);
  }
  // An id that is neither a value of the enum nor registered is refused, naming what to do.
  const auto unknown =
      static_cast<autocast::Op>(static_cast<size_t>(autocast::Op::kCount) + autocast::kMaxRegisteredOps);
  expect_error([&] { autocast::policy(unknown); }, {"autocast", "register_op"});
}

TEST(AutocastPolicy, OnlyHalfTypesAreAccepted) {
  expect_error([] { autocast::Guard g(DeviceType::CPU, DType::Float64); }, {"autocast", "Float16 or BFloat16"});
}

TEST_P(AutocastTest, OpsComputeInThePolicyDtype) {
  Tensor x = make(uniform(12, -1, 1, 1), {3, 4}, opts());
  Tensor w = make(uniform(8, -1, 1, 2), {4, 2}, opts());
  const DeviceType other = dev().is_cpu() ? DeviceType::CUDA : DeviceType::CPU;
  {
    autocast::Guard cast(other, DType::BFloat16);  // another device type: no effect here
    EXPECT_EQ(matmul(x, w).dtype(), DType::Float32);
  }
  autocast::Guard cast(dev().type(), DType::BFloat16);
  EXPECT_TRUE(autocast::is_enabled(dev().type()));
  Tensor y = matmul(x, w);
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  EXPECT_EQ(softmax(y, -1).dtype(), DType::Float32);  // Float32 policy: bf16 input computed in float32
  EXPECT_EQ((y + y).dtype(), DType::BFloat16);        // Keep
  Tensor y32 = y.to(DType::Float32);
  EXPECT_EQ(cat({y, y32}, 0).dtype(), DType::Float32);  // Promote to the widest
  {
    autocast::DisableGuard off;
    EXPECT_EQ(matmul(x, w).dtype(), DType::Float32);
  }
  EXPECT_EQ(matmul(x, w).dtype(), DType::BFloat16);
}

// Every op of the unary table (kiln/tensor/unary_ops.h) computes a bfloat16 input in the dtype its autocast column
// names: Float32 ops in float32, the rest in bfloat16.
TEST_P(AutocastTest, UnaryTableOpsFollowTheirPolicy) {
  Tensor x = make(uniform(12, 0.5, 2, 3), {3, 4}, opts(DType::BFloat16));  // in every op's domain
  autocast::Guard cast(dev().type(), DType::BFloat16);
#define KILN_X(Enum, name, result, policy_, ...)                                                                   \
  EXPECT_EQ(name(x).dtype(), std::string_view(#policy_) == "Float32" ? DType::Float32 : DType::BFloat16) << #name; \
  EXPECT_EQ(autocast::policy(autocast::Op::Enum), autocast::Policy::policy_) << #name;
  KILN_UNARY_OPS(KILN_X)
#undef KILN_X
}

TEST_P(AutocastTest, GradientsReachFloat32LeavesInFloat32) {
  Tensor x = make(uniform(12, -1, 1, 1), {3, 4}, opts());
  Tensor w = make(uniform(8, -1, 1, 2), {4, 2}, opts()).requires_grad_();
  Tensor loss;
  {
    autocast::Guard cast(dev().type(), DType::BFloat16);
    loss = log_softmax(matmul(x, w), -1).sum();
  }
  EXPECT_EQ(loss.dtype(), DType::Float32);
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::Float32);
  // Reference: the same in float32 without autocast; bf16 matmul inputs give ~3 significant digits.
  Tensor w32 = w.detach().clone().requires_grad_();
  log_softmax(matmul(x, w32), -1).sum().backward();
  expect_values(w.grad(), {4, 2}, values(w32.grad()), 0.05, 0.05);
}

// Multiples of 1/64 in [-0.75, 0.75]: exact in bfloat16, and their products (multiples of 2^-12) sum exactly in
// float32 for the sizes below, so a gradient computed in float32 equals a double reference exactly, and one rounded
// to bfloat16 on the way does not.
std::vector<double> sixty_fourths(int64_t n, uint32_t seed) { return exact_grid(n, 48, 64.0, seed); }

// Whether some value is not a bfloat16 (8 significant bits): a reference a rounding would change.
bool needs_more_than_bfloat16(const std::vector<double>& v) {
  for (double x : v) {
    if (static_cast<double>(static_cast<float>(BFloat16(static_cast<float>(x)))) != x) return true;
  }
  return false;
}

// Under bfloat16 autocast the gradients of a linear layer's float32 weight, bias and input (each cast to bfloat16
// for the product) are the products' float32 sums, equal to double references: the backward computes them in
// float32 for the casts that take them back to float32 (Node::gradient_dtype_wanted), instead of rounding them to
// bfloat16 first. For a 3-D input (reshaped to rows), a 2-D one, and no bias.
TEST_P(AutocastTest, LinearGradientsOfFloat32TensorsAreFloat32Sums) {
  const int64_t rows = 10, h = 48, o = 40;
  for (const bool three_d : {true, false}) {
    for (const bool with_bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << (three_d ? "(2, 5, 48) input" : "(10, 48) input")
                                        << (with_bias ? ", bias" : ", no bias"));
      const std::vector<double> xv = sixty_fourths(rows * h, 1), wv = sixty_fourths(o * h, 2), bv = sixty_fourths(o, 3);
      // The output gradient with 8 significant bits (exact in bfloat16), so that its row sums (the bias gradient) need
      // more than bfloat16 holds; every product and sum here is still exact in float32.
      const std::vector<double> rv = exact_grid(rows * o, 255, 4096.0, 4);
      const Shape x_shape = three_d ? Shape{2, 5, h} : Shape{rows, h};
      const Shape y_shape = three_d ? Shape{2, 5, o} : Shape{rows, o};
      Tensor x = make(xv, x_shape, opts()).requires_grad_();
      Tensor w = make(wv, {o, h}, opts()).requires_grad_();
      Tensor b = make(bv, {o}, opts()).requires_grad_();
      Tensor y;
      {
        autocast::Guard cast(dev().type(), DType::BFloat16);
        y = nn::linear(x, w, with_bias ? b : Tensor());
      }
      ASSERT_EQ(y.dtype(), DType::BFloat16);
      (y.to(DType::Float32) * make(rv, y_shape, opts())).sum().backward();

      const LinearGradients ref = linear_gradients(xv, wv, rv, rows, h, o);
      ASSERT_TRUE(needs_more_than_bfloat16(ref.dw) && needs_more_than_bfloat16(ref.dx) &&
                  needs_more_than_bfloat16(ref.db));
      EXPECT_EQ(w.grad().dtype(), DType::Float32);
      EXPECT_EQ(x.grad().dtype(), DType::Float32);
      expect_values(w.grad(), {o, h}, ref.dw, 0, 0);
      expect_values(x.grad(), x_shape, ref.dx, 0, 0);
      if (with_bias) expect_values(b.grad(), {o}, ref.db, 0, 0);
      if (!with_bias) {
        EXPECT_FALSE(b.grad().defined());
      }
    }
  }
}

// The same for matmul of a (B, T, K) float32 input by a (K, N) float32 weight, both cast by autocast.
TEST_P(AutocastTest, MatmulGradientsOfFloat32TensorsAreFloat32Sums) {
  const int64_t batch = 3, t = 4, k = 32, n = 24;
  const std::vector<double> av = sixty_fourths(batch * t * k, 5), bv = sixty_fourths(k * n, 6),
                            rv = sixty_fourths(batch * t * n, 7);
  Tensor a = make(av, {batch, t, k}, opts()).requires_grad_();
  Tensor b = make(bv, {k, n}, opts()).requires_grad_();
  Tensor y;
  {
    autocast::Guard cast(dev().type(), DType::BFloat16);
    y = matmul(a, b);
  }
  (y.to(DType::Float32) * make(rv, {batch, t, n}, opts())).sum().backward();
  std::vector<double> da(batch * t * k, 0.0), db(k * n, 0.0);
  for (int64_t r = 0; r < batch * t; ++r)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < k; ++i) {
        da[r * k + i] += rv[r * n + j] * bv[i * n + j];
        db[i * n + j] += av[r * k + i] * rv[r * n + j];
      }
  ASSERT_TRUE(needs_more_than_bfloat16(da) && needs_more_than_bfloat16(db));
  expect_values(a.grad(), {batch, t, k}, da, 0, 0);
  expect_values(b.grad(), {k, n}, db, 0, 0);
}

// What a user sees of a cast's gradient keeps the cast's dtype: a hook on the bfloat16 tensor, and autograd::grad
// taken at it, get bfloat16 gradients (the float32 products are then not wanted there), while the float32 leaf's
// gradient stays float32.
TEST_P(AutocastTest, HooksAndGradAtACastSeeItsDtype) {
  const std::vector<double> xv = sixty_fourths(6 * 16, 8), wv = sixty_fourths(16 * 8, 9);
  Tensor x = make(xv, {6, 16}, opts()).requires_grad_();
  const Tensor w = make(wv, {16, 8}, opts(DType::BFloat16));
  Tensor xb = x.to(DType::BFloat16);
  DType seen = DType::Float64;
  xb.register_hook([&](const Tensor& g) {
    seen = g.dtype();
    return Tensor();
  });
  mm(xb, w).sum().backward();
  EXPECT_EQ(seen, DType::BFloat16);
  EXPECT_EQ(x.grad().dtype(), DType::Float32);

  Tensor x2 = make(xv, {6, 16}, opts()).requires_grad_();
  Tensor xb2 = x2.to(DType::BFloat16);
  const std::vector<Tensor> grads = autograd::grad({mm(xb2, w).sum()}, {xb2});
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_EQ(grads[0].dtype(), DType::BFloat16);
}

// One cast feeding a product (whose gradient comes in float32) and an elementwise op (whose gradient comes in
// bfloat16): the engine sums the two in float32, exactly here (2 + a sum of multiples of 2^-12).
TEST_P(AutocastTest, GradientsOfOneCastInTwoDtypesAreSummedInTheWider) {
  const std::vector<double> xv = sixty_fourths(6 * 16, 10), wv = sixty_fourths(16 * 8, 11),
                            rv = sixty_fourths(6 * 8, 12);
  Tensor x = make(xv, {6, 16}, opts()).requires_grad_();
  const Tensor w = make(wv, {16, 8}, opts(DType::BFloat16));
  Tensor xb = x.to(DType::BFloat16);
  ((mm(xb, w).to(DType::Float32) * make(rv, {6, 8}, opts())).sum() + (xb * 2).to(DType::Float32).sum()).backward();
  std::vector<double> dx(6 * 16, 2.0);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t i = 0; i < 16; ++i)
      for (int64_t j = 0; j < 8; ++j) dx[r * 16 + i] += rv[r * 8 + j] * wv[i * 8 + j];
  ASSERT_TRUE(needs_more_than_bfloat16(dx));
  expect_values(x.grad(), {6, 16}, dx, 0, 0);
}

// An op's offered cast of its output (autocast::offer_cast): the region's cast_to of that output returns it, with the
// cast's history (the gradient reaches the output, and through it its inputs), while the output keeps its version;
// after an in-place change, or outside a region, casts are made as usual. cast_worth_offering says when an op should
// make one: a region with a 16-bit autocast dtype on the device, grad mode on, no FP8 recipe.
TEST_P(AutocastTest, AnOfferedCastIsTheOneTheRegionUses) {
  Tensor x = make(uniform(12, -1, 1, 31), {3, 4}, opts()).requires_grad_();
  {
    amp::Autocast region(DType::BFloat16, {.device_type = dev().type()});
    ASSERT_EQ(autocast::cast_worth_offering(dev()), DType::BFloat16);
    Tensor t = x * 2;
    const Tensor values = t.detach().to(DType::BFloat16);
    autocast::offer_cast(t, values);
    const Tensor c = autocast::cast_to(t, DType::BFloat16);
    EXPECT_EQ(c.data_ptr(), values.data_ptr());
    ASSERT_NE(c.grad_fn(), nullptr);
    (c.to(DType::Float32) * 3).sum().backward();
    expect_values(x.grad(), {3, 4}, std::vector<double>(12, 6.0), 0, 0);
    // Changed in place: a new cast.
    t.add_(1);
    EXPECT_NE(autocast::cast_to(t, DType::BFloat16).data_ptr(), values.data_ptr());
    {
      NoGradGuard no_grad;
      EXPECT_FALSE(autocast::cast_worth_offering(dev()).has_value());
    }
    if (!dev().is_cuda() || cuda::compute_capability(dev().index()) >= 89) {  // FP8 regions need sm_89+ on a GPU
      amp::Autocast fp8_region(DType::BFloat16, {.device_type = dev().type(), .fp8 = amp::Fp8Recipe{}});
      EXPECT_FALSE(autocast::cast_worth_offering(dev()).has_value());
    }
  }
  // Outside a region an offer is not kept.
  EXPECT_FALSE(autocast::cast_worth_offering(dev()).has_value());
  Tensor t = x * 2;
  const Tensor values = t.detach().to(DType::BFloat16);
  autocast::offer_cast(t, values);
  autocast::Guard guard(dev().type(), DType::BFloat16);
  EXPECT_NE(autocast::cast_to(t, DType::BFloat16).data_ptr(), values.data_ptr());
  // A cast that does not fit its source is refused.
  amp::Autocast region(DType::BFloat16, {.device_type = dev().type()});
  expect_error([&] { autocast::offer_cast(t, values.reshape({4, 3})); }, {"autocast::offer_cast", "shape"});
}

KILN_INSTANTIATE_BACKENDS(AutocastTest);

}  // namespace
}  // namespace kiln::testing
