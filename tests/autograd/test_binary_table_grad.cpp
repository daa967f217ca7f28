// Gradients and autocast of the binary op table (kiln/tensor/binary_ops.h): gradcheck of both derivatives of every
// row on its domain (float64, CPU), with broadcasting both ways, strided operands and one side only; the same
// gradients on cuda:0 as on the CPU; the node's name; the in-place forms through the history they write over; and
// every row's (and predicate's) autocast entry, which its function consults. Each case runs for the CPU and for
// cuda:0; without a GPU the cuda0 cases skip.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "support/binary_table_support.h"
#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using BinaryFn = std::function<Tensor(const Tensor&, const Tensor&)>;
using InPlaceFn = std::function<Tensor&(Tensor&, const Tensor&)>;

struct GradCase {
  std::string label;
  BinaryFn op;
  InPlaceFn in_place;  // null for rows without an in-place form
  BinaryRange range;
  std::string node;  // the grad_fn's name
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.label; }

#define KILN_IN_PLACE_Plain(name) nullptr
#define KILN_IN_PLACE_Scalar(name) [](Tensor& a, const Tensor& b) -> Tensor& { return kiln::name##_(a, b); }
#define KILN_IN_PLACE_Alpha(name) KILN_IN_PLACE_Scalar(name)
// The Alpha rows' cases with alpha = -2.5, out of place and in place.
#define KILN_ALPHA_CASE_Plain(Enum, name, r)
#define KILN_ALPHA_CASE_Scalar(Enum, name, r)
#define KILN_ALPHA_CASE_Alpha(Enum, name, r)                                                           \
  cases.push_back({std::string(#name) + "_alpha" + r.suffix,                                           \
                   [](const Tensor& a, const Tensor& b) { return kiln::name(a, b, -2.5); },            \
                   [](Tensor& a, const Tensor& b) -> Tensor& { return kiln::name##_(a, b, -2.5); }, r, \
                   #Enum "Backward"});

// Every row of the table on each range of its domain; add and sub also with alpha (their gradient for b is scaled).
std::vector<GradCase> grad_cases() {
  std::vector<GradCase> cases;
#define KILN_X(Enum, name, result, autocast, forms, grad_a, reads_a, grad_b, reads_b, both, reference, domain, ...)    \
  for (const BinaryRange& r : binary_ranges(#domain)) {                                                                \
    cases.push_back({std::string(#name) + r.suffix, [](const Tensor& a, const Tensor& b) { return kiln::name(a, b); }, \
                     KILN_IN_PLACE_##forms(name), r, #Enum "Backward"});                                               \
    KILN_ALPHA_CASE_##forms(Enum, name, r)                                                                             \
  }
  KILN_BINARY_OPS(KILN_X)
#undef KILN_X
  return cases;
}

// Shapes of (a, b): equal, broadcasting both ways, a 0-d operand.
struct ShapePair {
  Shape a, b;
};
const ShapePair kShapes[] = {{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{4, 1}, {2, 1, 3}}, {{}, {2, 3}}};

// Inputs of `shape` in [lo, hi], float64 on the CPU, requiring grad (strided when asked).
Tensor input(const Shape& shape, double lo, double hi, uint64_t seed, bool strided = false) {
  Tensor t = make(spread(numel(shape), lo, hi, seed), shape, {.dtype = DType::Float64});
  if (strided) t = non_contiguous(t);
  return t.requires_grad_();
}

// Every input set the cases check: the shapes above, strided operands, and each side alone requiring grad.
std::vector<TensorList> input_sets(const BinaryRange& r) {
  std::vector<TensorList> sets;
  uint64_t seed = 1;
  for (const ShapePair& s : kShapes) {
    sets.push_back({input(s.a, r.a_lo, r.a_hi, seed), input(s.b, r.b_lo, r.b_hi, seed + 1)});
    seed += 2;
  }
  sets.push_back({input({2, 3}, r.a_lo, r.a_hi, 11, true), input({2, 3}, r.b_lo, r.b_hi, 12, true)});
  sets.push_back({input({3}, r.a_lo, r.a_hi, 13), input({3}, r.b_lo, r.b_hi, 14).detach()});
  sets.push_back({input({3}, r.a_lo, r.a_hi, 15).detach(), input({3}, r.b_lo, r.b_hi, 16)});
  return sets;
}

class BinaryTableGradTest : public ::testing::TestWithParam<std::tuple<GradCase, Device>> {
 protected:
  void SetUp() override {
    if (dev().is_cuda() && test_devices().size() < 2) GTEST_SKIP() << "no GPU visible";
  }
  const GradCase& c() const { return std::get<0>(GetParam()); }
  Device dev() const { return std::get<1>(GetParam()); }
};

// Gradients of sum(fn(inputs) * w) for the inputs that require grad, computed on `device` (w from a fixed seed).
TensorList gradients_on(const autograd::DifferentiableFn& fn, const TensorList& inputs, Device device) {
  TensorList moved, wrt;
  for (const Tensor& t : inputs) {
    Tensor m = t.detach().to(device);
    if (t.requires_grad()) wrt.push_back(m.requires_grad_());
    moved.push_back(m);
  }
  const Tensor out = fn(moved)[0];
  const Tensor w = make(uniform(out.numel(), -1, 1, 99), out.shape(), {.dtype = out.dtype(), .device = device});
  return autograd::grad({out}, wrt, {w}, false, /*allow_unused=*/true);
}

// On the CPU: gradcheck (analytic against finite differences). On cuda:0: the gradients equal the CPU's, which
// gradcheck checks, for the same inputs and output gradient.
void check_on(Device device, const autograd::DifferentiableFn& fn, const TensorList& inputs) {
  if (device.is_cpu()) {
    check_gradients(fn, inputs);
    return;
  }
  const TensorList want = gradients_on(fn, inputs, Device::cpu());
  const TensorList got = gradients_on(fn, inputs, device);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].defined(), want[i].defined()) << "gradient " << i;
    if (got[i].defined()) expect_values(got[i], want[i].shape(), values(want[i]), 1e-9, 1e-12);
  }
}

TEST_P(BinaryTableGradTest, MatchesFiniteDifferences) {
  auto fn = [this](const TensorList& in) { return TensorList{c().op(in[0], in[1])}; };
  for (const TensorList& inputs : input_sets(c().range)) {
    SCOPED_TRACE(::testing::Message() << ::testing::PrintToString(inputs[0].shape()) << " and "
                                      << ::testing::PrintToString(inputs[1].shape()));
    check_on(dev(), fn, inputs);
  }
}

TEST_P(BinaryTableGradTest, RecordsItsNode) {
  const BinaryRange& r = c().range;
  const Tensor a = input({2}, r.a_lo, r.a_hi, 1).detach().to(dev()).requires_grad_();
  const Tensor b = input({2}, r.b_lo, r.b_hi, 2).detach().to(dev());
  Tensor y = c().op(a, b);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), c().node);
  EXPECT_EQ(c().op(a.detach(), b).grad_fn(), nullptr);  // nothing requires grad: nothing recorded
}

// The in-place form (where the row has one): the out-of-place op's values and gradients, through the history it
// writes over (t = a * 1, then t.op_(b)), whether b broadcasts or not.
TEST_P(BinaryTableGradTest, InPlaceFormMatchesTheOutOfPlaceOp) {
  if (!c().in_place) GTEST_SKIP() << "the row has no in-place form";
  auto in_place = [this](const TensorList& in) {
    Tensor t = kiln::mul(in[0], 1.0);
    return TensorList{c().in_place(t, in[1])};
  };
  const BinaryRange& r = c().range;
  check_on(dev(), in_place, {input({3, 4}, r.a_lo, r.a_hi, 3), input({4}, r.b_lo, r.b_hi, 4)});
  check_on(dev(), in_place, {input({3, 4}, r.a_lo, r.a_hi, 5), input({3, 4}, r.b_lo, r.b_hi, 6)});
  check_on(dev(), in_place, {input({3, 4}, r.a_lo, r.a_hi, 7).detach(), input({4}, r.b_lo, r.b_hi, 8)});
  const Tensor a = input({3, 4}, r.a_lo, r.a_hi, 3).to(dev()), b = input({4}, r.b_lo, r.b_hi, 4).to(dev());
  Tensor t = kiln::mul(a, 1.0);
  Tensor& w = c().in_place(t, b);
  EXPECT_EQ(&w, &t);
  ASSERT_NE(t.grad_fn(), nullptr);
  EXPECT_EQ(t.grad_fn()->name(), c().node);
  expect_values(t, {3, 4}, values(c().op(a, b)), 0, 0);
}

INSTANTIATE_TEST_SUITE_P(Rows, BinaryTableGradTest,
                         ::testing::Combine(::testing::ValuesIn(grad_cases()),
                                            ::testing::Values(Device::cpu(), Device::cuda(0))),
                         [](const ::testing::TestParamInfo<std::tuple<GradCase, Device>>& info) {
                           const Device d = std::get<1>(info.param);
                           return std::get<0>(info.param).label + (d.is_cpu() ? "_cpu" : "_cuda0");
                         });

// ---------------------------------------------------------------- autocast

// Sets an op's autocast policy for one scope.
class PolicyScope {
 public:
  PolicyScope(autocast::Op op, autocast::Policy p) : op_(op), previous_(autocast::policy(op)) {
    autocast::set_policy(op, p);
  }
  ~PolicyScope() { autocast::set_policy(op_, previous_); }
  PolicyScope(const PolicyScope&) = delete;
  PolicyScope& operator=(const PolicyScope&) = delete;

 private:
  autocast::Op op_;
  autocast::Policy previous_;
};

class BinaryTableAutocastTest : public BackendTest {
 protected:
  void SetUp() override {
    if (dev().is_cuda() && test_devices().size() < 2) GTEST_SKIP() << "no GPU visible";
  }
};

// Every row computes bfloat16 inputs in the dtype its autocast column names (Float32 rows in float32, Keep rows in
// bfloat16), and its function consults its own entry: set to Float32, the row computes in float32.
TEST_P(BinaryTableAutocastTest, EveryRowFollowsItsPolicy) {
  autocast::Guard cast(dev().type(), DType::BFloat16);
#define KILN_X(Enum, name, result, policy_, forms, grad_a, reads_a, grad_b, reads_b, both, reference, domain, ...)   \
  {                                                                                                                  \
    SCOPED_TRACE(#name);                                                                                             \
    const BinaryRange r = binary_ranges(#domain)[0];                                                                 \
    const Tensor x = make(spread(12, r.a_lo, r.a_hi, 1), {3, 4}, opts(DType::BFloat16));                             \
    const Tensor y = make(spread(4, r.b_lo, r.b_hi, 2), {4}, opts(DType::BFloat16));                                 \
    EXPECT_EQ(autocast::policy(autocast::Op::Enum), autocast::Policy::policy_);                                      \
    EXPECT_EQ(kiln::name(x, y).dtype(), std::string_view(#policy_) == "Float32" ? DType::Float32 : DType::BFloat16); \
    PolicyScope scope(autocast::Op::Enum, autocast::Policy::Float32);                                                \
    EXPECT_EQ(kiln::name(x, y).dtype(), DType::Float32);                                                             \
  }
  KILN_BINARY_OPS(KILN_X)
#undef KILN_X
}

// The predicates give Bool whatever their policy, so the dtype they compute in shows in the values: float32 inputs
// that differ only below bfloat16's precision (1 and 1 + 2^-12; 2^-140, which bfloat16 rounds to 0). With the
// default policy they compare as float32; set to LowerPrecision, as bfloat16.
TEST_P(BinaryTableAutocastTest, EveryPredicateFollowsItsPolicy) {
  const std::vector<double> xs = {1, 1 + std::ldexp(1.0, -12), std::ldexp(1.0, -140), std::ldexp(1.0, -140)};
  const std::vector<double> ys = {1 + std::ldexp(1.0, -12), 1, 1, 0};
  const Tensor x = make(xs, {4}, opts()), y = make(ys, {4}, opts());
  const std::vector<double> xs16 = values(make(xs, {4}, opts(DType::BFloat16)));
  const std::vector<double> ys16 = values(make(ys, {4}, opts(DType::BFloat16)));
  ASSERT_EQ(xs16[1], 1.0);
  ASSERT_EQ(xs16[2], 0.0);
  autocast::Guard cast(dev().type(), DType::BFloat16);
#define KILN_X(Enum, name, forms, policy_, reference, on_bool)                                \
  {                                                                                           \
    SCOPED_TRACE(#name);                                                                      \
    auto f = [](double u, double v) { return reference; };                                    \
    std::vector<double> in32, in16;                                                           \
    for (size_t i = 0; i < xs.size(); ++i) {                                                  \
      in32.push_back(f(xs[i], ys[i]));                                                        \
      in16.push_back(f(xs16[i], ys16[i]));                                                    \
    }                                                                                         \
    EXPECT_NE(in32, in16); /* the inputs tell the two dtypes apart */                         \
    EXPECT_EQ(autocast::policy(autocast::Op::Enum), autocast::Policy::policy_);               \
    expect_values(kiln::name(x, y), {4}, std::string_view(#policy_) == "Keep" ? in32 : in16); \
    PolicyScope scope(autocast::Op::Enum, autocast::Policy::LowerPrecision);                  \
    expect_values(kiln::name(x, y), {4}, in16);                                               \
  }
  KILN_BINARY_PREDICATES(KILN_X)
#undef KILN_X
}

INSTANTIATE_TEST_SUITE_P(Backends, BinaryTableAutocastTest, ::testing::Values(Device::cpu(), Device::cuda(0)),
                         device_param_name);

}  // namespace
}  // namespace kiln::testing
