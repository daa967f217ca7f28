// Conformance of the unary elementwise ops: values against double-precision references written here,
// every floating dtype, integer semantics, layouts (strided, channels-last), 0-d and empty tensors,
// in-place forms and their errors. Binary ops are in test_elementwise_binary.cpp.
#include <cmath>
#include <functional>
#include <limits>
#include <string_view>

#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::expect_values;
using testing::kFloatTypes;
using testing::kInf;
using testing::kNaN;
using testing::make;
using testing::uniform;

std::vector<double> map_values(const std::vector<double>& in, const std::function<double(double)>& f) {
  std::vector<double> out;
  for (double v : in) out.push_back(f(v));
  return out;
}

// Reference helpers (independent of kiln): the definitions, in double.
double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double gelu_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double sign_ref(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }
double round_half_even(double x) {
  const double f = std::floor(x), d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return std::fmod(f, 2.0) == 0 ? f : f + 1;
}

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  bool positive_domain = false;
};

const std::vector<double> kAnyInputs = {-3.5, -2.5, -1.25, -0.5, -0.1, 0, 0.1, 0.5, 1.5, 2.5, 3, 4.25};
const std::vector<double> kPositiveInputs = {0.01, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 10, 50, 100};

// Every op of the unary table (kiln/tensor/unary_ops.h), against its float64 reference there, then the unary ops
// written by hand, against the references above.
std::vector<UnaryCase> unary_cases() {
  std::vector<UnaryCase> cases = {
#define KILN_X(Enum, name, result, autocast, save, derivative, reference, domain, bool_advice) \
  {#name, [](const Tensor& x) { return name(x); }, [](double v) { return reference; },         \
   std::string_view(#domain) == "Positive" || std::string_view(#domain) == "AboveMinusOne"},
      KILN_UNARY_OPS(KILN_X)
#undef KILN_X
  };
  const std::vector<UnaryCase> by_hand = {
      {"gelu", [](const Tensor& x) { return gelu(x); }, gelu_ref},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }, gelu_tanh_ref},
      {"square", [](const Tensor& x) { return square(x); }, [](double x) { return x * x; }},
      {"clamp", [](const Tensor& x) { return clamp(x, -1.0, 2.0); },
       [](double x) { return std::min(std::max(x, -1.0), 2.0); }},
      {"pow_scalar", [](const Tensor& x) { return pow(x, 3); }, [](double x) { return x * x * x; }},
      {"pow_half", [](const Tensor& x) { return pow(x, 0.5); }, [](double x) { return std::sqrt(x); }, true},
  };
  cases.insert(cases.end(), by_hand.begin(), by_hand.end());
  return cases;
}

// The table's own references agree with definitions written here, where they are not one std:: call.
TEST(UnaryTable, ReferencesAgreeWithTheDefinitions) {
  for (double v : kAnyInputs) {
#define KILN_X(Enum, name, result, autocast, save, derivative, reference, domain, bool_advice) \
  [[maybe_unused]] const double name##_v = reference;
    KILN_UNARY_OPS(KILN_X)
#undef KILN_X
    EXPECT_EQ(sigmoid_v, sigmoid_ref(v));
    EXPECT_EQ(sign_v, sign_ref(v));
    EXPECT_EQ(round_v, round_half_even(v)) << v;
    EXPECT_DOUBLE_EQ(silu_v, v * sigmoid_ref(v));
    EXPECT_EQ(relu_v, v < 0 ? 0.0 : v);
  }
}

class ElementwiseUnaryTest : public testing::BackendTest {};

// The reference is computed from the input as the dtype holds it (rounded), so only the op's own error counts.
void check_unary(const UnaryCase& c, const Tensor& x, const Shape& shape) {
  SCOPED_TRACE(::testing::Message() << c.name << " on " << x.dtype() << " " << ::testing::PrintToString(x.shape())
                                    << " strides " << ::testing::PrintToString(x.strides()));
  Tensor y = c.op(x);
  EXPECT_EQ(y.dtype(), x.dtype());
  expect_values(y, shape, map_values(testing::values(x), c.ref));
}

TEST_P(ElementwiseUnaryTest, EveryOpMatchesItsReferenceInEveryFloatingDtype) {
  for (const auto& c : unary_cases()) {
    for (DType dt : kFloatTypes) {
      const auto& in = c.positive_domain ? kPositiveInputs : kAnyInputs;
      Tensor x = make(in, {3, 4}, opts(dt));
      check_unary(c, x, {3, 4});
      check_unary(c, testing::non_contiguous(x), {3, 4});
      check_unary(c, x.transpose(0, 1), {4, 3});
    }
  }
}

TEST_P(ElementwiseUnaryTest, ChannelsLastInputGivesChannelsLastOutput) {
  std::vector<double> in;
  for (int i = 0; i < 24; ++i) in.push_back(kAnyInputs[i % kAnyInputs.size()] + 0.01 * i);
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    Tensor x = make(in, {2, 3, 2, 2}, opts(dt)).contiguous(MemoryFormat::ChannelsLast);
    for (const auto& c : unary_cases()) {
      if (c.positive_domain) continue;
      Tensor y = c.op(x);
      EXPECT_TRUE(y.is_contiguous(MemoryFormat::ChannelsLast)) << c.name;
      check_unary(c, x, {2, 3, 2, 2});
    }
  }
}

TEST_P(ElementwiseUnaryTest, LargeStridedTensorsUseEveryThread) {
  // Over 2 * kGrainSize elements and not a multiple of the block size, read through a stride of 2.
  const int64_t n = 100003;
  std::vector<double> in(n);
  for (int64_t i = 0; i < n; ++i) in[i] = -4.0 + 8.0 * static_cast<double>(i) / n;
  Tensor x = testing::non_contiguous(make(in, {n}, opts()));
  expect_values(exp(x), {n}, map_values(testing::values(x), [](double v) { return std::exp(v); }));
  expect_values(gelu(x), {n}, map_values(testing::values(x), gelu_ref));
  Tensor h = make(in, {n}, opts(DType::Float16));
  expect_values(tanh(h), {n}, map_values(testing::values(h), [](double v) { return std::tanh(v); }));
}

TEST_P(ElementwiseUnaryTest, ZeroDimAndEmptyTensors) {
  Tensor s = make({-2.25}, {}, opts());
  expect_values(abs(s), {}, {2.25});
  expect_values(exp(s), {}, {std::exp(-2.25)});
  for (DType dt : {DType::Float32, DType::Int64, DType::Bool}) {
    Tensor e = zeros({0, 3}, opts(dt));
    EXPECT_EQ(sign(e).shape(), (Shape{0, 3}));
    EXPECT_EQ(isnan(e).dtype(), DType::Bool);
    EXPECT_EQ(exp(e).dtype(), dt == DType::Float32 ? DType::Float32 : kDefaultFloat);
  }
}

TEST_P(ElementwiseUnaryTest, NaNAndInfinityFollowPyTorch) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(::testing::Message() << dt);
    Tensor x = make({kNaN, kInf, -kInf, 0, -1.5}, {5}, opts(dt));
    expect_values(relu(x), {5}, {kNaN, kInf, 0, 0, 0});
    expect_values(clamp(x, -1.0, 1.0), {5}, {kNaN, 1, -1, 0, -1});
    expect_values(sign(x), {5}, {0, 1, -1, 0, -1});  // sign(NaN) is 0, as in PyTorch
    expect_values(exp(x), {5}, {kNaN, kInf, 0, 1, std::exp(-1.5)});
    expect_values(sigmoid(x), {5}, {kNaN, 1, 0, 0.5, sigmoid_ref(-1.5)});
    expect_values(tanh(x), {5}, {kNaN, 1, -1, 0, std::tanh(-1.5)});
    expect_values(isnan(x), {5}, {1, 0, 0, 0, 0});
    expect_values(isinf(x), {5}, {0, 1, 1, 0, 0});
    expect_values(isfinite(x), {5}, {0, 0, 0, 1, 1});
    expect_values(logical_not(x), {5}, {0, 0, 0, 1, 0});
    expect_values(sqrt(make({-1.0, 0.0}, {2}, opts(dt))), {2}, {kNaN, 0});
    expect_values(log(make({-1.0, 0.0}, {2}, opts(dt))), {2}, {kNaN, -kInf});
    expect_values(reciprocal(make({0.0}, {1}, opts(dt))), {1}, {kInf});
  }
  // A NaN bound makes every result NaN.
  expect_values(clamp(make({1, 2}, {2}, opts()), kNaN, std::nullopt), {2}, {kNaN, kNaN});
}

TEST_P(ElementwiseUnaryTest, IntegerInputsKeepIntegerSemantics) {
  for (DType dt : {DType::Int32, DType::Int64}) {
    SCOPED_TRACE(::testing::Message() << dt);
    Tensor x = make({-7, -1, 0, 3, 12}, {5}, opts(dt));
    EXPECT_EQ(neg(x).dtype(), dt);
    expect_values(neg(x), {5}, {7, 1, 0, -3, -12});
    expect_values(abs(x), {5}, {7, 1, 0, 3, 12});
    expect_values(sign(x), {5}, {-1, -1, 0, 1, 1});
    expect_values(relu(x), {5}, {0, 0, 0, 3, 12});
    expect_values(square(x), {5}, {49, 1, 0, 9, 144});
    expect_values(floor(x), {5}, {-7, -1, 0, 3, 12});
    expect_values(round(x), {5}, {-7, -1, 0, 3, 12});
    expect_values(clamp(x, -2, 5), {5}, {-2, -1, 0, 3, 5});
    expect_values(clamp(x, std::nullopt, 0), {5}, {-7, -1, 0, 0, 0});
    EXPECT_EQ(clamp(x, -2, 5).dtype(), dt);
    expect_values(isnan(x), {5}, {0, 0, 0, 0, 0});
    expect_values(isfinite(x), {5}, {1, 1, 1, 1, 1});
    expect_values(logical_not(x), {5}, {0, 0, 1, 0, 0});
    expect_values(pow(x, 2), {5}, {49, 1, 0, 9, 144});
    expect_values(pow(x, 3), {5}, {-343, -1, 0, 27, 1728});
    EXPECT_EQ(pow(x, 3).dtype(), dt);
  }
  Tensor u = make({0, 1, 200, 255}, {4}, opts(DType::UInt8));
  expect_values(neg(u), {4}, {0, 255, 56, 1});  // wraps modulo 256, as in PyTorch
  expect_values(square(u), {4}, {0, 1, 64, 1});
  expect_values(clamp(u, 1, 100), {4}, {1, 1, 100, 100});
}

TEST_P(ElementwiseUnaryTest, FloatingFunctionsOfIntegersAndBoolsGiveFloat32) {
  Tensor i = make({0, 1, 4, 9}, {4}, opts(DType::Int64));
  Tensor s = sqrt(i);
  EXPECT_EQ(s.dtype(), DType::Float32);
  expect_values(s, {4}, {0, 1, 2, 3});
  EXPECT_EQ(exp(make({1, 0}, {2}, opts(DType::Bool))).dtype(), DType::Float32);
  expect_values(exp(make({1, 0}, {2}, opts(DType::Bool))), {2}, {std::exp(1.0), 1});
  expect_values(reciprocal(make({2, -4}, {2}, opts(DType::Int32))), {2}, {0.5, -0.25});
  expect_values(sigmoid(make({0}, {1}, opts(DType::UInt8))), {1}, {0.5});
  // Float powers and clamp bounds promote integer tensors, as PyTorch 2 does.
  EXPECT_EQ(pow(i, 0.5).dtype(), DType::Float32);
  expect_values(pow(i, 0.5), {4}, {0, 1, 2, 3});
  EXPECT_EQ(clamp(i, 0.5, std::nullopt).dtype(), DType::Float32);
  expect_values(clamp(i, 0.5, 5.5), {4}, {0.5, 1, 4, 5.5});
  // square of bool is pow(bool, 2): int64.
  EXPECT_EQ(square(make({1, 0}, {2}, opts(DType::Bool))).dtype(), DType::Int64);
  // sign of bool is bool; logical_not and the predicates give bool.
  EXPECT_EQ(sign(make({1, 0}, {2}, opts(DType::Bool))).dtype(), DType::Bool);
  expect_values(logical_not(make({1, 0}, {2}, opts(DType::Bool))), {2}, {0, 1});
}

TEST_P(ElementwiseUnaryTest, HalfPrecisionRoundsOnceFromFloat32) {
  // exp(1) = 2.71828...: float16 holds 2.71875 (the nearest), bfloat16 2.71875 too.
  expect_values(exp(make({1}, {1}, opts(DType::Float16))), {1}, {2.71875}, 0, 0);
  expect_values(exp(make({1}, {1}, opts(DType::BFloat16))), {1}, {2.71875}, 0, 0);
  // round is half to even in every floating dtype.
  for (DType dt : kFloatTypes)
    expect_values(round(make({0.5, 1.5, 2.5, -0.5, -1.5, 2.4}, {6}, opts(dt))), {6}, {0, 2, 2, -0.0, -2, 2}, 0, 0);
}

TEST_P(ElementwiseUnaryTest, InPlaceFormsWriteIntoTheirArgument) {
  for (DType dt : kFloatTypes) {
    Tensor x = make({-1, 0.25, 4}, {3}, opts(dt));
    Tensor alias = x;
    relu_(x);
    expect_values(alias, {3}, {0, 0.25, 4});
    sqrt_(x);
    expect_values(alias, {3}, {0, 0.5, 2});
    neg_(x);
    expect_values(alias, {3}, {-0.0, -0.5, -2});
    exp_(x);
    expect_values(alias, {3}, {1, std::exp(-0.5), std::exp(-2.0)});
    clamp_(x, 0.5, 0.9);
    expect_values(alias, {3}, {0.9, std::exp(-0.5), 0.5});
  }
  // In place through a strided view touches only the view.
  Tensor base = make({-1, -2, -3, -4, -5, -6}, {2, 3}, opts());
  Tensor col = base.select(1, 1);
  neg_(col);
  expect_values(base, {2, 3}, {-1, 2, -3, -4, 5, -6});
  // Integer in-place ops that stay integral are allowed.
  Tensor i = make({-3, 5}, {2}, opts(DType::Int32));
  clamp_(i, 0, 4);
  expect_values(i, {2}, {0, 4});
  relu_(i);
  neg_(i);
  expect_values(i, {2}, {0, -4});
}

TEST_P(ElementwiseUnaryTest, ErrorsNameTheOpAndTheDtype) {
  Tensor i = make({1, 2}, {2}, opts(DType::Int64));
  expect_error([&] { exp_(i); }, {"exp_", "float32", "int64"});
  expect_error([&] { sqrt_(i); }, {"sqrt_", "can't be cast"});
  expect_error([&] { clamp_(i, 0.5, std::nullopt); }, {"clamp_", "float32", "int64"});
  Tensor b = make({1, 0}, {2}, opts(DType::Bool));
  expect_error([&] { neg(b); }, {"neg", "bool"});
  expect_error([&] { neg_(b); }, {"neg_", "bool"});
  expect_error([&] { abs(b); }, {"abs", "bool"});
  expect_error([&] { relu(b); }, {"relu", "bool"});
  expect_error([&] { clamp(make({1}, {1}, opts()), std::nullopt, std::nullopt); }, {"clamp", "min", "max"});
  expect_error([&] { pow(i, -1); }, {"pow", "negative", "int64"});
  expect_error([&] { exp(Tensor()); }, {"exp", "undefined"});
  Tensor expanded = make({1}, {1}, opts()).expand({3});
  expect_error([&] { relu_(expanded); }, {"relu_", "memory location"});
}

KILN_INSTANTIATE_BACKENDS(ElementwiseUnaryTest);

}  // namespace
}  // namespace kiln
