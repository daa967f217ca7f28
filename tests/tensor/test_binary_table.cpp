// Conformance of the binary op table (kiln/tensor/binary_ops.h): every row's kernel against the row's float64
// reference in every floating dtype, with broadcasting both ways, strided operands, the number and in-place forms the
// row declares, what two bool tensors give (the on_bool column), and the names the trace and profiler print. The
// cases run on the CPU and on cuda:0; without a GPU the cuda0 cases skip. A row whose kernel is missing on a backend
// fails here ("unknown op" / "not supported").
#include <cmath>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tensor/backend.h"  // BinaryOp, binary_op_name
#include "support/binary_table_support.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::BinaryRange;
using testing::expect_error;
using testing::expect_values;
using testing::kFloatTypes;
using testing::make;

// One row of the table (or of its predicates), as the tests call it.
struct Row {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
  std::string domain;
  std::string on_bool;
  bool bool_result = false;
  bool float_result = false;  // the Float dtype rule: true division
  // The forms the row declares beyond op(a, b): with a number, and in place (each null when absent).
  std::function<Tensor(const Tensor&, Scalar)> with_number;
  std::function<Tensor&(Tensor&, const Tensor&)> in_place;
};

// The forms a predicate row declares (no in-place form: the result is Bool).
#define KILN_PREDICATE_NUMBER_Plain(name) nullptr
#define KILN_PREDICATE_NUMBER_Scalar(name) [](const Tensor& a, Scalar s) { return kiln::name(a, s); }
// The number and in-place forms of a row of KILN_BINARY_OPS: only Scalar and Alpha rows declare them.
#define KILN_NUMBER_Plain(name) nullptr
#define KILN_NUMBER_Scalar(name) [](const Tensor& a, Scalar s) { return kiln::name(a, s); }
#define KILN_NUMBER_Alpha(name) KILN_NUMBER_Scalar(name)
#define KILN_IN_PLACE_Plain(name) nullptr
#define KILN_IN_PLACE_Scalar(name) [](Tensor& a, const Tensor& b) -> Tensor& { return kiln::name##_(a, b); }
#define KILN_IN_PLACE_Alpha(name) KILN_IN_PLACE_Scalar(name)

std::vector<Row> rows() {
  std::vector<Row> out;
#define KILN_X(Enum, name, result, autocast, forms, grad_a, reads_a, grad_b, reads_b, both, reference, domain, \
               on_bool)                                                                                        \
  out.push_back({#name, [](const Tensor& a, const Tensor& b) { return kiln::name(a, b); },                     \
                 [](double u, double v) { return reference; }, #domain, #on_bool, false,                       \
                 std::string_view(#result) == "Float", KILN_NUMBER_##forms(name), KILN_IN_PLACE_##forms(name)});
  KILN_BINARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Enum, name, forms, autocast, reference, on_bool)                              \
  out.push_back({#name, [](const Tensor& a, const Tensor& b) { return kiln::name(a, b); },   \
                 [](double u, double v) { return reference; }, "All", #on_bool, true, false, \
                 KILN_PREDICATE_NUMBER_##forms(name), nullptr});
  KILN_BINARY_PREDICATES(KILN_X)
#undef KILN_X
  return out;
}

// The table's references agree with definitions written here where they are more than one operator.
double python_mod(double a, double b) {
  const double r = std::fmod(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

TEST(BinaryTable, ReferencesAgreeWithTheDefinitions) {
  const std::vector<double> vs = {-3.5, -2, -0.75, -0.5, 0, 0.5, 1, 2.25, 3, NAN};
  for (double u : vs) {
    for (double v : vs) {
      SCOPED_TRACE(::testing::Message() << u << ", " << v);
      for (const Row& r : rows()) {
        const double got = r.ref(u, v);
        double want = NAN;
        if (r.name == "remainder") want = python_mod(u, v);
        else if (r.name == "maximum") want = std::isnan(u) || std::isnan(v) ? NAN : std::fmax(u, v);
        else if (r.name == "minimum") want = std::isnan(u) || std::isnan(v) ? NAN : std::fmin(u, v);
        else continue;
        if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << r.name;
        else EXPECT_EQ(got, want) << r.name;
      }
    }
  }
  EXPECT_EQ(rows().size(), 17u);  // every BinaryOp value but the activations' gradients
}

// The CPU and cuda:0, whether or not a GPU is visible: the cuda0 cases skip without one, so that they exist (and
// can be named in a gtest filter) on every machine.
class BinaryTableTest : public testing::BackendTest {
 protected:
  void SetUp() override {
    if (dev().is_cuda() && testing::test_devices().size() < 2) GTEST_SKIP() << "no GPU visible";
  }
};

// The row's reference over the broadcast of a (shape sa) and b (shape sb), from the values the tensors hold.
std::vector<double> broadcast_reference(const Row& r, const Tensor& a, const Tensor& b) {
  const Shape out = broadcast_shapes(a.shape(), b.shape(), "test");
  const std::vector<double> av = testing::values(a), bv = testing::values(b);
  std::vector<double> ref;
  for (int64_t i = 0; i < numel(out); ++i) {
    const std::vector<int64_t> idx = testing::unravel(i, out);
    auto at = [&](const Tensor& t, const std::vector<double>& v) {
      std::vector<int64_t> j(t.dim());
      for (int64_t d = 0; d < t.dim(); ++d) {
        const int64_t od = d + static_cast<int64_t>(out.size()) - t.dim();
        j[d] = t.shape()[d] == 1 ? 0 : idx[od];
      }
      return v[testing::ravel(j, t.shape())];
    };
    ref.push_back(r.ref(at(a, av), at(b, bv)));
  }
  return ref;
}

DType expected_dtype(const Row& r, DType inputs) { return r.bool_result ? DType::Bool : inputs; }

struct ShapePair {
  Shape a, b;
};
const ShapePair kShapes[] = {{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{4}, {3, 4}}, {{2, 1, 3}, {4, 1}}, {{}, {2, 3}}};

TEST_P(BinaryTableTest, EveryRowMatchesItsReferenceInEveryFloatingDtype) {
  for (const Row& r : rows()) {
    for (const BinaryRange& range : testing::binary_ranges(r.domain)) {
      for (DType dt : kFloatTypes) {
        for (const ShapePair& s : kShapes) {
          const Tensor a = make(testing::spread(numel(s.a), range.a_lo, range.a_hi, 1), s.a, opts(dt));
          const Tensor b = make(testing::spread(numel(s.b), range.b_lo, range.b_hi, 2), s.b, opts(dt));
          SCOPED_TRACE(::testing::Message()
                       << r.name << range.suffix << " on " << dt << " " << ::testing::PrintToString(s.a) << " and "
                       << ::testing::PrintToString(s.b));
          const Tensor y = r.op(a, b);
          EXPECT_EQ(y.dtype(), expected_dtype(r, dt));
          expect_values(y, broadcast_shapes(s.a, s.b, "test"), broadcast_reference(r, a, b));
        }
        // Strided and transposed operands.
        const Tensor a = make(testing::spread(12, range.a_lo, range.a_hi, 3), {4, 3}, opts(dt)).transpose(0, 1);
        const Tensor b =
            testing::non_contiguous(make(testing::spread(12, range.b_lo, range.b_hi, 4), {3, 4}, opts(dt)));
        SCOPED_TRACE(::testing::Message() << r.name << range.suffix << " on " << dt << ", strided");
        expect_values(r.op(a, b), {3, 4}, broadcast_reference(r, a, b));
      }
    }
  }
}

// The forms with a number and in place, where the row declares them: the same kernel, the same reference.
TEST_P(BinaryTableTest, NumberAndInPlaceFormsMatchTheReference) {
  for (const Row& r : rows()) {
    const BinaryRange range = testing::binary_ranges(r.domain)[0];
    const double number = (range.b_lo + range.b_hi) / 2 + 0.125;  // within the b range, exact in every dtype
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(::testing::Message() << r.name << " on " << dt);
      const Tensor a = make(testing::spread(12, range.a_lo, range.a_hi, 5), {3, 4}, opts(dt));
      const Tensor b = make(testing::spread(4, range.b_lo, range.b_hi, 6), {4}, opts(dt));
      if (r.with_number) {
        const Tensor y = r.with_number(a, number);
        EXPECT_EQ(y.dtype(), expected_dtype(r, dt));
        expect_values(y, {3, 4}, broadcast_reference(r, a, make({number}, {}, opts(DType::Float64))));
      }
      if (r.in_place) {
        Tensor t = a.clone();
        Tensor& w = r.in_place(t, b);
        EXPECT_EQ(&w, &t);
        EXPECT_EQ(t.dtype(), dt);
        expect_values(t, {3, 4}, broadcast_reference(r, a, b));
      }
    }
  }
}

// What two bool tensors give, as the row's on_bool column says.
TEST_P(BinaryTableTest, BoolInputsFollowTheirRow) {
  const Tensor a = make({1, 1, 0, 0}, {4}, opts(DType::Bool));
  const Tensor b = make({1, 0, 1, 0}, {4}, opts(DType::Bool));
  for (const Row& r : rows()) {
    SCOPED_TRACE(r.name);
    if (r.on_bool == "Refused") {
      expect_error([&] { r.op(a, b); }, {r.name});
      continue;
    }
    const Tensor y = r.op(a, b);
    if (r.on_bool == "Or") {
      EXPECT_EQ(y.dtype(), DType::Bool);
      expect_values(y, {4}, {1, 1, 1, 0});
    } else if (r.on_bool == "And") {
      EXPECT_EQ(y.dtype(), DType::Bool);
      expect_values(y, {4}, {1, 0, 0, 0});
    } else {
      ASSERT_EQ(r.on_bool, "Numbers");
      EXPECT_EQ(y.dtype(), r.bool_result ? DType::Bool : r.float_result ? kDefaultFloat : DType::Bool);
      expect_values(y, {4}, {r.ref(1, 1), r.ref(1, 0), r.ref(0, 1), r.ref(0, 0)});
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BinaryTableTest, ::testing::Values(Device::cpu(), Device::cuda(0)),
                         testing::device_param_name);

// The names the trace and the profiler print for every BinaryOp: the table's, unchanged from the names they had
// before the table (written out here).
TEST(BinaryTable, TraceNamesAreTheOpNames) {
  const std::vector<std::string> names = {"add",
                                          "sub",
                                          "mul",
                                          "div",
                                          "remainder",
                                          "pow",
                                          "maximum",
                                          "minimum",
                                          "eq",
                                          "ne",
                                          "lt",
                                          "le",
                                          "gt",
                                          "ge",
                                          "logical_and",
                                          "logical_or",
                                          "logical_xor",
                                          "gelu_backward",
                                          "gelu_tanh_backward",
                                          "silu_backward",
                                          "relu_backward"};
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(binary_op_name(static_cast<BinaryOp>(i)), names[i]) << i;
  EXPECT_EQ(binary_op_name(BinaryOp::ReluBackward), "relu_backward");
  EXPECT_EQ(static_cast<size_t>(BinaryOp::ReluBackward) + 1, names.size());
#define KILN_X(Enum, name, ...) EXPECT_EQ(binary_op_name(BinaryOp::Enum), #name);
  KILN_BINARY_OPS(KILN_X) KILN_BINARY_PREDICATES(KILN_X) KILN_BINARY_OTHER(KILN_X)
#undef KILN_X
}

}  // namespace
}  // namespace kiln
