// The autocast hook: one policy table keyed by autocast::Op decides each op's compute dtype; gradients
// flow back to float32 parameters in float32.
#include <gtest/gtest.h>

#include <string_view>

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
#define KILN_X(Enum, name, result, policy_, ...)                                                              \
  EXPECT_EQ(name(x).dtype(), std::string_view(#policy_) == "Float32" ? DType::Float32 : DType::BFloat16)  \
      << #name;                                                                                              \
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

KILN_INSTANTIATE_BACKENDS(AutocastTest);

}  // namespace
}  // namespace kiln::testing
