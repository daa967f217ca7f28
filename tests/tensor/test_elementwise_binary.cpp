// Conformance of the binary elementwise ops, where, masked_fill, lerp and the comparison helpers: values
// against references written here, broadcasting, type promotion (PyTorch's result_type), in-place forms,
// layouts and every error path.
#include <cmath>
#include <functional>
#include <limits>

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

double python_mod(double a, double b) {
  const double r = std::fmod(a, b);
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
  bool bool_result = false;
};

std::vector<BinaryCase> binary_cases() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, [](double a, double b) { return a + b; }},
      {"add_alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, 2.5); },
       [](double a, double b) { return a + 2.5 * b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }},
      {"sub_alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, -2); },
       [](double a, double b) { return a + 2 * b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; }},
      {"remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); }, python_mod},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(abs(a), b); },
       [](double a, double b) { return std::pow(std::abs(a), b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
       [](double a, double b) { return std::max(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
       [](double a, double b) { return std::min(a, b); }},
      {"eq", [](const Tensor& a, const Tensor& b) { return a == b; }, [](double a, double b) { return double(a == b); },
       true},
      {"ne", [](const Tensor& a, const Tensor& b) { return a != b; }, [](double a, double b) { return double(a != b); },
       true},
      {"lt", [](const Tensor& a, const Tensor& b) { return a < b; }, [](double a, double b) { return double(a < b); },
       true},
      {"le", [](const Tensor& a, const Tensor& b) { return a <= b; }, [](double a, double b) { return double(a <= b); },
       true},
      {"gt", [](const Tensor& a, const Tensor& b) { return a > b; }, [](double a, double b) { return double(a > b); },
       true},
      {"ge", [](const Tensor& a, const Tensor& b) { return a >= b; }, [](double a, double b) { return double(a >= b); },
       true},
      {"logical_and", [](const Tensor& a, const Tensor& b) { return logical_and(a, b); },
       [](double a, double b) { return double(a != 0 && b != 0); }, true},
      {"logical_or", [](const Tensor& a, const Tensor& b) { return logical_or(a, b); },
       [](double a, double b) { return double(a != 0 || b != 0); }, true},
      {"logical_xor", [](const Tensor& a, const Tensor& b) { return logical_xor(a, b); },
       [](double a, double b) { return double((a != 0) != (b != 0)); }, true},
  };
}

// Reference of op over broadcast shapes, from the inputs as their dtypes hold them.
std::vector<double> broadcast_ref(const Tensor& a, const Tensor& b, const Shape& out,
                                  const std::function<double(double, double)>& f) {
  const std::vector<double> va = testing::values(a), vb = testing::values(b);
  std::vector<double> r;
  for (int64_t i = 0; i < numel(out); ++i) {
    const std::vector<int64_t> idx = testing::unravel(i, out);
    auto at = [&](const Tensor& t, const std::vector<double>& v) {
      std::vector<int64_t> ti(t.dim());
      for (int64_t d = 0; d < t.dim(); ++d) {
        const int64_t od = d + static_cast<int64_t>(out.size()) - t.dim();
        ti[d] = t.size(d) == 1 ? 0 : idx[od];
      }
      return v[testing::ravel(ti, t.shape())];
    };
    r.push_back(f(at(a, va), at(b, vb)));
  }
  return r;
}

class ElementwiseBinaryTest : public testing::BackendTest {};

TEST_P(ElementwiseBinaryTest, EveryOpMatchesItsReferenceWithBroadcasting) {
  const std::vector<double> av = {-3.5, -2, -0.75, 0, 0.5, 1, 2.25, 3, 4.5, -1.25, 0.125, 6};
  const std::vector<double> bv = {1.5, -2, 0.5, 3};
  struct Shapes {
    Shape a, b, out;
  };
  const std::vector<Shapes> shapes = {
      {{3, 4}, {4}, {3, 4}}, {{3, 1, 4}, {1, 4}, {3, 1, 4}}, {{3, 4, 1}, {1, 4}, {3, 4, 4}}, {{12}, {}, {12}}};
  for (const auto& c : binary_cases()) {
    for (DType dt : kFloatTypes) {
      for (const auto& s : shapes) {
        Tensor a = make(av, s.a, opts(dt));
        const std::vector<double> bsub(bv.begin(), bv.begin() + numel(s.b));
        Tensor b = make(bsub, s.b, opts(dt));
        for (bool strided : {false, true}) {
          SCOPED_TRACE(::testing::Message() << c.name << " " << dt << " " << ::testing::PrintToString(s.a) << " with "
                                            << ::testing::PrintToString(s.b) << (strided ? " strided" : ""));
          Tensor x = strided ? testing::non_contiguous(a) : a, y = strided ? testing::non_contiguous(b) : b;
          Tensor r = c.op(x, y);
          EXPECT_EQ(r.dtype(), c.bool_result ? DType::Bool : dt);
          expect_values(r, s.out, broadcast_ref(x, y, s.out, c.ref));
          Tensor swapped = c.op(y, x);  // the broadcast operand first
          expect_values(swapped, swapped.shape(), broadcast_ref(y, x, swapped.shape(), c.ref));
        }
      }
    }
  }
}

TEST_P(ElementwiseBinaryTest, IntegerOpsKeepIntegerSemantics) {
  for (DType dt : {DType::Int32, DType::Int64}) {
    SCOPED_TRACE(::testing::Message() << dt);
    Tensor a = make({-7, 7, -7, 7, 0, 9}, {6}, opts(dt));
    Tensor b = make({3, 3, -3, -3, 5, 2}, {6}, opts(dt));
    EXPECT_EQ((a + b).dtype(), dt);
    expect_values(a + b, {6}, {-4, 10, -10, 4, 5, 11});
    expect_values(a - b, {6}, {-10, 4, -4, 10, -5, 7});
    expect_values(a * b, {6}, {-21, 21, 21, -21, 0, 18});
    expect_values(remainder(a, b), {6}, {2, 1, -1, -2, 0, 1});  // Python's %: the divisor's sign
    expect_values(maximum(a, b), {6}, {3, 7, -3, 7, 5, 9});
    expect_values(minimum(a, b), {6}, {-7, 3, -7, -3, 0, 2});
    expect_values(pow(a, abs(b)), {6}, {-343, 343, -343, 343, 0, 81});
    expect_values(a < b, {6}, {1, 0, 1, 0, 1, 0});
    Tensor d = a / b;  // true division
    EXPECT_EQ(d.dtype(), DType::Float32);
    expect_values(d, {6}, {-7.0 / 3, 7.0 / 3, 7.0 / 3, -7.0 / 3, 0, 4.5});
    expect_values(add(a, b, 2), {6}, {-1, 13, -13, 1, 10, 13});
  }
  Tensor u = make({250, 3, 10}, {3}, opts(DType::UInt8));
  Tensor v = make({10, 5, 3}, {3}, opts(DType::UInt8));
  expect_values(u + v, {3}, {4, 8, 13});  // wraps modulo 256
  expect_values(v - u, {3}, {16, 2, 249});
  expect_values(remainder(u, v), {3}, {0, 3, 1});
  expect_values(pow(v, v), {3}, {0, 53, 27});  // 10^10 mod 256 = 0, 5^5 = 3125 mod 256 = 53
}

TEST_P(ElementwiseBinaryTest, BoolArithmeticIsLogical) {
  Tensor a = make({1, 1, 0, 0}, {4}, opts(DType::Bool));
  Tensor b = make({1, 0, 1, 0}, {4}, opts(DType::Bool));
  EXPECT_EQ((a + b).dtype(), DType::Bool);
  expect_values(a + b, {4}, {1, 1, 1, 0});
  expect_values(a * b, {4}, {1, 0, 0, 0});
  expect_values(maximum(a, b), {4}, {1, 1, 1, 0});
  expect_values(minimum(a, b), {4}, {1, 0, 0, 0});
  expect_values(a == b, {4}, {1, 0, 0, 1});
  expect_values(a & b, {4}, {1, 0, 0, 0});
  expect_values(a | b, {4}, {1, 1, 1, 0});
  expect_values(a ^ b, {4}, {0, 1, 1, 0});
  expect_values(~a, {4}, {0, 0, 1, 1});
  EXPECT_EQ((a + 1).dtype(), DType::Int64);  // bool with an integer scalar promotes
  expect_values(a + 1, {4}, {2, 2, 1, 1});
}

TEST_P(ElementwiseBinaryTest, NaNPropagatesThroughMaximumAndMinimum) {
  for (DType dt : kFloatTypes) {
    Tensor a = make({kNaN, 1, kNaN, -kInf}, {4}, opts(dt));
    Tensor b = make({1, kNaN, kNaN, 2}, {4}, opts(dt));
    expect_values(maximum(a, b), {4}, {kNaN, kNaN, kNaN, 2});
    expect_values(minimum(a, b), {4}, {kNaN, kNaN, kNaN, -kInf});
    expect_values(a == b, {4}, {0, 0, 0, 0});
    expect_values(a != b, {4}, {1, 1, 1, 1});
    expect_values(remainder(make({5, -5}, {2}, opts(dt)), make({0, 0}, {2}, opts(dt))), {2}, {kNaN, kNaN});
    expect_values(make({1, -1, 0}, {3}, opts(dt)) / 0.0, {3}, {kInf, -kInf, kNaN});
  }
}

TEST_P(ElementwiseBinaryTest, TypePromotionFollowsPyTorch) {
  Tensor i32 = make({1, 2}, {2}, opts(DType::Int32));
  Tensor i64 = make({1, 2}, {2}, opts(DType::Int64));
  Tensor u8 = make({1, 2}, {2}, opts(DType::UInt8));
  Tensor f16 = make({1, 2}, {2}, opts(DType::Float16));
  Tensor bf16 = make({1, 2}, {2}, opts(DType::BFloat16));
  Tensor f32 = make({1, 2}, {2}, opts(DType::Float32));
  Tensor bl = make({1, 0}, {2}, opts(DType::Bool));
  Tensor i64_0d = make({3}, {}, opts(DType::Int64));
  Tensor f64_0d = make({0.5}, {}, opts(DType::Float64));

  EXPECT_EQ((i32 + 2.5).dtype(), DType::Float32);
  expect_values(i32 + 2.5, {2}, {3.5, 4.5});
  EXPECT_EQ((i32 + i64_0d).dtype(), DType::Int32);
  expect_values(i32 + i64_0d, {2}, {4, 5});
  EXPECT_EQ((f16 + f64_0d).dtype(), DType::Float16);
  EXPECT_EQ((u8 + 300).dtype(), DType::UInt8);
  expect_values(u8 + 300, {2}, {45, 46});             // 300 wraps to 44 in uint8
  EXPECT_EQ((i32 + f64_0d).dtype(), DType::Float64);  // a 0-d tensor of a higher category counts
  EXPECT_EQ((i32 + i64).dtype(), DType::Int64);
  EXPECT_EQ((u8 + i32).dtype(), DType::Int32);
  EXPECT_EQ((f16 + bf16).dtype(), DType::Float32);
  EXPECT_EQ((f16 + i64).dtype(), DType::Float16);
  EXPECT_EQ((bl + bl).dtype(), DType::Bool);
  EXPECT_EQ((bl + u8).dtype(), DType::UInt8);
  EXPECT_EQ((bl * 2.0).dtype(), DType::Float32);
  EXPECT_EQ((i64_0d + f64_0d).dtype(), DType::Float64);
  EXPECT_EQ((i64_0d + 1.5).dtype(), DType::Float32);
  EXPECT_EQ((i32 / 2).dtype(), DType::Float32);
  EXPECT_EQ((f32 < i64).dtype(), DType::Bool);
  EXPECT_EQ(internal::result_type(i32, Scalar(2)), DType::Int32);
  EXPECT_EQ(internal::result_type(f16, f32), DType::Float32);
  EXPECT_EQ(pow(2, i32).dtype(), DType::Int32);
  EXPECT_EQ(pow(2.5, i32).dtype(), DType::Float32);
  expect_values(pow(2, i32), {2}, {2, 4});
  expect_values(div(1, make({4, -8}, {2}, opts(DType::Int64))), {2}, {0.25, -0.125});
  // Comparisons with a float scalar compare in float: 1 < 1.5 is true.
  expect_values(i32 < 1.5, {2}, {1, 0});
  expect_values(rsub(i32, 10), {2}, {9, 8});
  expect_values(10 - f32, {2}, {9, 8});
}

TEST_P(ElementwiseBinaryTest, ScalarsZeroDimAndEmptyOperands) {
  Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts());
  expect_values(a * 2, {2, 3}, {2, 4, 6, 8, 10, 12});
  expect_values(2 * a, {2, 3}, {2, 4, 6, 8, 10, 12});
  expect_values(a - 1, {2, 3}, {0, 1, 2, 3, 4, 5});
  expect_values(1 / a, {2, 3}, {1, 0.5, 1.0 / 3, 0.25, 0.2, 1.0 / 6});
  Tensor s = make({10}, {}, opts());
  expect_values(a + s, {2, 3}, {11, 12, 13, 14, 15, 16});
  expect_values(s + s, {}, {20});
  Tensor e = zeros({0, 3}, opts());
  EXPECT_EQ((e + a.select(0, 0)).shape(), (Shape{0, 3}));
  EXPECT_EQ((e < 1).dtype(), DType::Bool);
  EXPECT_EQ(add(zeros({2, 0}, opts()), zeros({1}, opts())).shape(), (Shape{2, 0}));
}

TEST_P(ElementwiseBinaryTest, ChannelsLastInputsGiveChannelsLastOutputs) {
  std::vector<double> av, bv;
  for (int i = 0; i < 24; ++i) av.push_back(0.5 * i - 4);
  for (int i = 0; i < 3; ++i) bv.push_back(i + 1);
  Tensor a = make(av, {2, 3, 2, 2}, opts()).contiguous(MemoryFormat::ChannelsLast);
  Tensor bias = make(bv, {1, 3, 1, 1}, opts());
  Tensor r = a * bias;
  EXPECT_TRUE(r.is_contiguous(MemoryFormat::ChannelsLast));
  expect_values(r, {2, 3, 2, 2}, broadcast_ref(a, bias, {2, 3, 2, 2}, [](double x, double y) { return x * y; }));
  Tensor both = a + a;
  EXPECT_TRUE(both.is_contiguous(MemoryFormat::ChannelsLast));
  expect_values(both, {2, 3, 2, 2}, broadcast_ref(a, a, {2, 3, 2, 2}, [](double x, double y) { return x + y; }));
  Tensor mixed = a + a.contiguous();
  expect_values(mixed, {2, 3, 2, 2}, broadcast_ref(a, a, {2, 3, 2, 2}, [](double x, double y) { return x + y; }));
}

TEST_P(ElementwiseBinaryTest, LargeBroadcastUsesEveryThread) {
  const int64_t rows = 301, cols = 257;  // 77357 elements: over 2 * kGrainSize, odd run lengths
  std::vector<double> av(rows * cols), bv(cols);
  for (int64_t i = 0; i < rows * cols; ++i) av[i] = static_cast<double>(i % 97) - 48;
  for (int64_t j = 0; j < cols; ++j) bv[j] = 0.25 * static_cast<double>(j % 13) + 1;
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    Tensor a = make(av, {rows, cols}, opts(dt)).transpose(0, 1);  // (cols, rows), strided
    Tensor b = make(bv, {cols, 1}, opts(dt));
    Tensor r = a * b;
    expect_values(r, {cols, rows}, broadcast_ref(a, b, {cols, rows}, [](double x, double y) { return x * y; }));
    // A contiguous tensor with a scalar, and a 0-d tensor first: many blocks of one broadcast value.
    Tensor c = make(av, {rows * cols}, opts(dt));
    const std::vector<double> cv = testing::values(c);
    std::vector<double> scaled, shifted;
    for (double v : cv) scaled.push_back(v * 0.75);
    for (double v : cv) shifted.push_back(2 - v);
    expect_values(c * 0.75, {rows * cols}, scaled);
    expect_values(make({2}, {}, opts(dt)) - c, {rows * cols}, shifted);
  }
}

TEST_P(ElementwiseBinaryTest, InPlaceFormsKeepTheDestinationDtype) {
  Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts());
  Tensor alias = a;
  add_(a, make({10, 20, 30}, {3}, opts()));
  expect_values(alias, {2, 3}, {11, 22, 33, 14, 25, 36});
  sub_(a, make({1, 2, 3}, {3}, opts()), 2);
  expect_values(alias, {2, 3}, {9, 18, 27, 12, 21, 30});
  mul_(a, 0.5);
  div_(a, make({3}, {}, opts()));
  expect_values(alias, {2, 3}, {1.5, 3, 4.5, 2, 3.5, 5});
  a += 1;
  a -= make({1}, {1}, opts());
  a *= 2;
  a /= 2;
  expect_values(alias, {2, 3}, {1.5, 3, 4.5, 2, 3.5, 5});
  // int32 += int64 computes in int64 and stores int32; float16 += float32 rounds once into float16.
  Tensor i = make({1, 2}, {2}, opts(DType::Int32));
  add_(i, make({5, 6}, {2}, opts(DType::Int64)));
  EXPECT_EQ(i.dtype(), DType::Int32);
  expect_values(i, {2}, {6, 8});
  mul_(i, 3);
  expect_values(i, {2}, {18, 24});
  Tensor h = make({1, 2}, {2}, opts(DType::Float16));
  add_(h, make({0.5, 0.25}, {2}, opts(DType::Float32)));
  EXPECT_EQ(h.dtype(), DType::Float16);
  expect_values(h, {2}, {1.5, 2.25});
  // A strided destination is written in place, elsewhere untouched.
  Tensor base = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts());
  Tensor t = base.transpose(0, 1);
  add_(t, make({100, 200}, {2}, opts()));
  expect_values(base, {2, 3}, {101, 102, 103, 204, 205, 206});
  Tensor bcl = make({0, 1, 2, 3, 4, 5, 6, 7}, {1, 2, 2, 2}, opts()).contiguous(MemoryFormat::ChannelsLast);
  mul_(bcl, make({1, -1}, {1, 2, 1, 1}, opts()));
  expect_values(bcl, {1, 2, 2, 2}, {0, 1, 2, 3, -4, -5, -6, -7});
  EXPECT_TRUE(bcl.is_contiguous(MemoryFormat::ChannelsLast));
}

TEST_P(ElementwiseBinaryTest, WhereMaskedFillAndLerp) {
  Tensor cond = make({1, 0, 1}, {3}, opts(DType::Bool));
  Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}, opts());
  Tensor b = make({-1, -2}, {2, 1}, opts(DType::Int64));
  Tensor w = where(cond, a, b);
  EXPECT_EQ(w.dtype(), DType::Float32);
  expect_values(w, {2, 3}, {1, -1, 3, 4, -2, 6});
  expect_values(where(cond, 7.5, a), {2, 3}, {7.5, 2, 7.5, 7.5, 5, 7.5});
  expect_values(where(cond, a, 0), {2, 3}, {1, 0, 3, 4, 0, 6});
  EXPECT_EQ(where(cond, make({1}, {1}, opts(DType::Int32)), 0).dtype(), DType::Int32);
  for (DType dt : {DType::Float16, DType::Int64, DType::Bool, DType::UInt8}) {
    Tensor x = make({0, 1, 1, 0}, {2, 2}, opts(dt));
    Tensor m = make({1, 0}, {2}, opts(DType::Bool));
    Tensor r = masked_fill(x, m, 1);
    EXPECT_EQ(r.dtype(), dt);
    expect_values(r, {2, 2}, {1, 1, 1, 0});
    masked_fill_(x, make({0, 1, 0, 0}, {2, 2}, opts(DType::Bool)), 0);
    expect_values(x, {2, 2}, {0, 0, 1, 0});
  }
  // masked_fill converts the value to the tensor's dtype (no promotion).
  expect_values(masked_fill(make({5, 5}, {2}, opts(DType::Int64)), make({1, 0}, {2}, opts(DType::Bool)), 2.7), {2},
                {2, 5});
  // masked_fill broadcasts the tensor with the mask, like PyTorch's out-of-place form.
  EXPECT_EQ(masked_fill(make({1, 2}, {2}, opts()), make({1, 0, 0, 1}, {2, 2}, opts(DType::Bool)), 0).shape(),
            (Shape{2, 2}));
  for (DType dt : kFloatTypes) {
    Tensor x = make({0, 1, -2}, {3}, opts(dt)), y = make({10, 3, 2}, {3}, opts(dt));
    expect_values(lerp(x, y, 0.25), {3}, {2.5, 1.5, -1});
    expect_values(lerp(x, y, 0.75), {3}, {7.5, 2.5, 1});
    expect_values(lerp(x, y, 1.0), {3}, {10, 3, 2}, 0, 0);  // exact at the end
  }
}

TEST_P(ElementwiseBinaryTest, IsCloseAllCloseAndEqual) {
  Tensor a = make({1, 2, kNaN, kInf, 1}, {5}, opts());
  Tensor b = make({1 + 1e-7, 2.1, kNaN, kInf, -kInf}, {5}, opts());
  expect_values(isclose(a, b), {5}, {1, 0, 0, 1, 0});
  expect_values(isclose(a, b, 0.1, 0, true), {5}, {1, 1, 1, 1, 0});
  EXPECT_FALSE(allclose(a, b));
  EXPECT_TRUE(allclose(make({1, 2}, {2}, opts()), make({1.000001, 2}, {2}, opts())));
  EXPECT_TRUE(allclose(make({1, 2}, {2}, opts()), make({1.5}, {}, opts()), 0, 0.5));      // broadcasts
  EXPECT_FALSE(allclose(make({1}, {1}, opts()), make({kInf}, {1}, opts()), 1e-5, kInf));  // inf error is never close
  EXPECT_TRUE(allclose(make({3, 4}, {2}, opts(DType::Int64)), make({3, 5}, {2}, opts(DType::Int64)), 0, 1));
  EXPECT_TRUE(equal(make({1, 2}, {2}, opts()), make({1, 2}, {2}, opts())));
  EXPECT_TRUE(equal(make({1, 2}, {2}, opts()), make({1, 2}, {2}, opts(DType::Float64))));
  EXPECT_FALSE(equal(make({1, 2}, {2}, opts()), make({1, 2}, {1, 2}, opts())));
  EXPECT_FALSE(equal(make({1, 2}, {2}, opts()), make({1, 3}, {2}, opts())));
  EXPECT_FALSE(equal(make({1, 2}, {2}, opts()), make({1, 2}, {2}, opts(DType::Int64))));
  EXPECT_FALSE(equal(make({kNaN}, {1}, opts()), make({kNaN}, {1}, opts())));
  EXPECT_TRUE(equal(zeros({0}, opts()), zeros({0}, opts())));
  expect_error([&] { isclose(make({1}, {1}, opts()), make({1}, {1}, opts(DType::Float64))); },
               {"isclose", "float32", "float64"});
}

TEST_P(ElementwiseBinaryTest, ErrorsNameTheOpShapesAndDtypes) {
  Tensor a = make({1, 2, 3}, {3}, opts());
  Tensor b = make({1, 2}, {2}, opts());
  expect_error([&] { add(a, b); }, {"add", "[3]", "[2]", "broadcast"});
  expect_error([&] { a < b; }, {"lt", "[3]", "[2]"});
  expect_error([&] { where(make({1, 0, 1}, {3}, opts(DType::Bool)), a, b); }, {"where", "[3]", "[2]"});
  // In-place: the destination cannot grow, nor change category.
  Tensor small = make({1, 2, 3}, {3}, opts());
  expect_error([&] { add_(small, zeros({2, 3}, opts())); }, {"add_", "[3]", "[2, 3]"});
  Tensor i = make({1, 2}, {2}, opts(DType::Int64));
  expect_error([&] { add_(i, 1.5); }, {"add_", "float32", "int64", "can't be cast"});
  expect_error([&] { div_(i, 2); }, {"div_", "float32", "int64"});
  expect_error([&] { mul_(i, make({1.5, 2}, {2}, opts())); }, {"mul_", "float32", "int64"});
  Tensor bl = make({1, 0}, {2}, opts(DType::Bool));
  expect_error([&] { add_(bl, 1); }, {"add_", "int64", "bool"});
  expect_error([&] { bl - bl; }, {"sub", "bool"});
  expect_error([&] { add(i, i, 0.5); }, {"add", "alpha", "integer"});
  Tensor expanded = make({1}, {1}, opts()).expand({3});
  expect_error([&] { add_(expanded, a); }, {"add_", "memory location"});
  // Masks must be bool.
  expect_error([&] { masked_fill(a, make({1, 0, 1}, {3}, opts()), 0); }, {"masked_fill", "mask", "bool", "float32"});
  expect_error([&] { masked_fill_(a, make({1, 0, 1}, {3}, opts(DType::UInt8)), 0); }, {"masked_fill_", "uint8"});
  expect_error([&] { where(make({1, 0, 1}, {3}, opts(DType::Int64)), a, a); }, {"where", "condition", "int64"});
  expect_error(
      [&] {
        masked_fill_(small, make({1, 0, 1, 0, 1, 0}, {2, 3}, opts(DType::Bool)), 0);
      },
      {"masked_fill_", "[3]", "[2, 3]"});
  // Integer division by zero and negative integer powers are errors, not crashes. On CUDA they give an
  // unspecified value instead (a kernel cannot throw without a host sync; see backend.h, as PyTorch).
  if (dev().is_cpu()) {
    expect_error(
        [&] {
          remainder(i, make({0, 1}, {2}, opts(DType::Int64)));
        },
        {"remainder", "division by zero", "int64"});
    expect_error([&] { remainder(make({1}, {1}, opts(DType::Int32)), make({0}, {}, opts(DType::Int32))); },
                 {"remainder", "zero", "int32"});
    expect_error([&] { pow(i, make({-1, 1}, {2}, opts(DType::Int64))); }, {"pow", "negative", "int64"});
  }
  expect_error([&] { lerp(i, i, 0.5); }, {"lerp", "int64"});
  expect_error([&] { add(a, Tensor()); }, {"add", "second", "undefined"});
  expect_error([&] { remainder(bl, bl); }, {"remainder", "bool"});
}

KILN_INSTANTIATE_BACKENDS(ElementwiseBinaryTest);

}  // namespace
}  // namespace kiln

namespace kiln::testing {
namespace {

class AddNTest : public BackendTest {};

// Reference: the double sum of each position, rounded once to the dtype by make().
TEST_P(AddNTest, SumsManyTensorsInOnePass) {
  for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int64}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    for (int count : {2, 3, 40, 300}) {  // 300 needs more than one round on a GPU (256 inputs per kernel)
      std::vector<Tensor> inputs;
      std::vector<double> expected(6, 0.0);
      for (int k = 0; k < count; ++k) {
        std::vector<double> v = uniform(6, -4, 4, 10 + static_cast<uint64_t>(k));
        if (!is_floating_point(dtype)) {
          for (double& x : v) x = std::round(x);
        }
        Tensor t = make(v, {2, 3}, opts(dtype));
        const std::vector<double> stored = values(t);  // after rounding to the dtype
        for (size_t i = 0; i < 6; ++i) expected[i] += stored[i];
        inputs.push_back(k % 2 == 1 ? non_contiguous(t) : t);
      }
      Tensor out = add_n(inputs);
      EXPECT_EQ(out.dtype(), dtype);
      // Accumulated in float32 for 16-bit floats and rounded once, so one rounding of the result.
      const double rtol = dtype == DType::BFloat16 ? 8e-3 : dtype == DType::Float16 ? 1e-3 : 1e-6;
      expect_values(out, {2, 3}, expected, rtol, 1e-5 * count);
    }
  }
}

TEST_P(AddNTest, OneTensorIsCopiedAndBadInputsAreErrors) {
  Tensor a = make({1, 2}, {2}, opts());
  Tensor copy = add_n({a});
  EXPECT_FALSE(copy.is_alias_of(a));
  expect_values(copy, {2}, {1, 2});
  expect_error([&] { add_n({}); }, {"add_n", "at least one"});
  expect_error([&] { add_n({a, make({1, 2, 3}, {3}, opts())}); }, {"add_n", "tensor 1", "[3]"});
  expect_error([&] { add_n({a, make({1, 2}, {2}, opts(DType::Float64))}); }, {"add_n", "float64"});
  expect_error([&] { add_n({a > 0, a > 1}); }, {"add_n", "bool"});
}

KILN_INSTANTIATE_BACKENDS(AddNTest);

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

class MulBackwardTest : public BackendTest {};

// Reference: products in double of the values as stored, rounded by the expected-value tolerance.
TEST_P(MulBackwardTest, BothGradientsInOnePass) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    Tensor g = make(uniform(12, -2, 2, 1), {3, 4}, opts(dtype));
    Tensor a = make(uniform(12, -2, 2, 2), {3, 4}, opts(dtype));
    Tensor b = non_contiguous(make(uniform(12, -2, 2, 3), {3, 4}, opts(dtype)));
    auto [ga, gb] = internal::mul_backward(g, a, b);
    const std::vector<double> vg = values(g), va = values(a), vb = values(b);
    std::vector<double> ega(12), egb(12);
    for (size_t i = 0; i < 12; ++i) {
      ega[i] = vg[i] * vb[i];
      egb[i] = vg[i] * va[i];
    }
    EXPECT_EQ(ga.dtype(), dtype);
    expect_values(ga, {3, 4}, ega);
    expect_values(gb, {3, 4}, egb);
    // Exactly what two separate multiplications give.
    EXPECT_TRUE(equal(ga, g * b));
    EXPECT_TRUE(equal(gb, g * a));
  }
}

TEST_P(MulBackwardTest, BroadcastOperandsFallBackToTwoProducts) {
  Tensor g = make({1, 2, 3, 4}, {2, 2}, opts());
  Tensor a = make({10, 20}, {2}, opts());  // broadcast along rows
  Tensor b = make({2}, {}, opts());
  auto [ga, gb] = internal::mul_backward(g, a, b);
  expect_values(ga, {2, 2}, {2, 4, 6, 8});
  expect_values(gb, {2, 2}, {10, 40, 30, 80});
}

KILN_INSTANTIATE_BACKENDS(MulBackwardTest);

}  // namespace
}  // namespace kiln::testing
