// Conformance of the copy primitives: dtype conversion between every pair of dtypes, copies between
// layouts (transposed, sliced, channels-last, broadcast sources), fill, arange and linspace.
#include <cmath>
#include <limits>

#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_values;
using testing::make;

const std::vector<DType> kAllTypes = {DType::Bool,    DType::UInt8,    DType::Int32,   DType::Int64,
                                      DType::Float16, DType::BFloat16, DType::Float32, DType::Float64};

// Values every dtype of a category holds exactly (including 16-bit floats).
std::vector<double> source_values(DType t) {
  if (t == DType::Bool) return {0, 1, 1, 0, 1, 0, 1};
  if (t == DType::UInt8) return {0, 1, 3, 2, 100, 7, 255};
  if (is_integral(t)) return {0, 1, -3, 2, 100, 7, -128};
  return {0, 1, -3, 2.5, -2.75, 100, 0.5};
}

// What converting v into `to` gives, as PyTorch defines it: floats truncate toward zero into integers,
// negative values wrap modulo 256 into uint8, anything nonzero is true.
double converted(double v, DType to) {
  switch (to) {
    case DType::Bool: return v != 0 ? 1 : 0;
    case DType::UInt8: {
      const int64_t i = static_cast<int64_t>(std::trunc(v));
      return static_cast<double>(((i % 256) + 256) % 256);
    }
    case DType::Int32:
    case DType::Int64: return std::trunc(v);
    default: return v;
  }
}

class CopyTest : public testing::BackendTest {};

TEST_P(CopyTest, CastsBetweenEveryPairOfDtypes) {
  for (DType from : kAllTypes) {
    const std::vector<double> in = source_values(from);
    const Tensor src = make(in, {7}, opts(from));
    for (DType to : kAllTypes) {
      SCOPED_TRACE(::testing::Message() << from << " -> " << to);
      std::vector<double> expected;
      for (double v : in) expected.push_back(converted(v, to));
      Tensor dst = src.to(to);
      EXPECT_EQ(dst.dtype(), to);
      expect_values(dst, {7}, expected, 0, 0);
      // The same conversion through a strided source and a strided destination.
      Tensor strided_dst = zeros({7, 2}, opts(to)).select(1, 1);
      strided_dst.copy_(testing::non_contiguous(src));
      expect_values(strided_dst, {7}, expected, 0, 0);
    }
  }
}

TEST_P(CopyTest, RoundsToHalfAndBFloat16ToNearestEven) {
  Tensor x = make({0.1, 1.0 / 3, 65519, 70000, -1e-8, 1 + std::ldexp(1.0, -11)}, {6}, opts(DType::Float64));
  expect_values(x.to(DType::Float16), {6},
                {0.0999755859375, 0.333251953125, 65504, std::numeric_limits<double>::infinity(), -0.0, 1}, 0, 0);
  Tensor y = make({0.1, 1 + std::ldexp(1.0, -8), 1 + 3 * std::ldexp(1.0, -8), std::numeric_limits<float>::max()}, {4},
                  opts(DType::Float32));
  expect_values(y.to(DType::BFloat16), {4},
                {0.10009765625, 1, 1 + std::ldexp(1.0, -6), std::numeric_limits<double>::infinity()}, 0, 0);
  // NaN survives every floating conversion, and is true as a bool.
  Tensor n = make({std::nan("")}, {1}, opts(DType::Float32));
  for (DType t : {DType::Float16, DType::BFloat16, DType::Float64})
    EXPECT_TRUE(std::isnan(testing::values(n.to(t))[0])) << t;
  expect_values(n.to(DType::Bool), {1}, {1});
}

TEST_P(CopyTest, FloatToIntegerTruncatesTowardZero) {
  Tensor x = make({-2.9, -0.5, 0.5, 2.9, 1e9}, {5}, opts(DType::Float64));
  expect_values(x.to(DType::Int32), {5}, {-2, 0, 0, 2, 1e9}, 0, 0);
  expect_values(x.to(DType::Int64), {5}, {-2, 0, 0, 2, 1e9}, 0, 0);
  expect_values(make({-1, -2.5, 256, 300.7}, {4}, opts()).to(DType::UInt8), {4}, {255, 254, 0, 44}, 0, 0);
  expect_values(make({1e12, -1e12}, {2}, opts(DType::Int64)).to(DType::Float32), {2}, {1e12, -1e12}, 1e-7, 0);
}

TEST_P(CopyTest, CopiesBetweenLayouts) {
  std::vector<double> v(24);
  for (int i = 0; i < 24; ++i) v[i] = i;
  for (DType dt : {DType::Float32, DType::Float16, DType::Int64, DType::UInt8}) {
    SCOPED_TRACE(::testing::Message() << dt);
    Tensor a = make(v, {4, 6}, opts(dt));
    // Transposed source into a contiguous destination, and the reverse.
    Tensor t = a.transpose(0, 1).contiguous();
    std::vector<double> tv;
    for (int j = 0; j < 6; ++j)
      for (int i = 0; i < 4; ++i) tv.push_back(v[i * 6 + j]);
    expect_values(t, {6, 4}, tv);
    Tensor into_t = zeros({6, 4}, opts(dt)).transpose(0, 1);
    into_t.copy_(a);
    expect_values(into_t, {4, 6}, v);
    // Sliced with a step, both sides.
    Tensor s = a.slice(1, 1, 6, 2).contiguous();
    expect_values(s, {4, 3}, {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23});
    Tensor big = zeros({4, 12}, opts(dt));
    big.slice(1, 0, std::nullopt, 2).copy_(a);
    std::vector<double> bv(48, 0);
    for (int i = 0; i < 24; ++i) bv[(i / 6) * 12 + (i % 6) * 2] = v[i];
    expect_values(big, {4, 12}, bv);
    // Channels-last and back.
    Tensor x = make(v, {1, 2, 3, 4}, opts(dt));
    Tensor cl = x.contiguous(MemoryFormat::ChannelsLast);
    EXPECT_TRUE(cl.is_contiguous(MemoryFormat::ChannelsLast));
    expect_values(cl, {1, 2, 3, 4}, v);
    expect_values(cl.contiguous(), {1, 2, 3, 4}, v);
    std::vector<double> memory(24);  // NHWC memory order of x
    for (int c = 0; c < 2; ++c)
      for (int h = 0; h < 3; ++h)
        for (int w = 0; w < 4; ++w) memory[(h * 4 + w) * 2 + c] = v[(c * 3 + h) * 4 + w];
    expect_values(internal::as_strided(cl, {24}, {1}), {24}, memory);
    // Conversion into a channels-last destination.
    Tensor cl32 =
        empty({1, 2, 3, 4}, {.dtype = DType::Float32, .device = dev(), .memory_format = MemoryFormat::ChannelsLast});
    cl32.copy_(x);
    expect_values(cl32, {1, 2, 3, 4}, v);
  }
}

TEST_P(CopyTest, BroadcastSourcesFillEveryElement) {
  Tensor row = make({1, 2, 3}, {3}, opts());
  Tensor dst = zeros({2, 3}, opts(DType::Float64));
  dst.copy_(row);
  expect_values(dst, {2, 3}, {1, 2, 3, 1, 2, 3});
  Tensor col = make({5, 6}, {2, 1}, opts(DType::Int32));
  Tensor d2 = zeros({2, 3}, opts(DType::BFloat16));
  d2.copy_(col);
  expect_values(d2, {2, 3}, {5, 5, 5, 6, 6, 6});
  Tensor d3 = zeros({2, 2}, opts(DType::Int64));
  d3.copy_(make({7}, {}, opts(DType::Int64)));
  expect_values(d3, {2, 2}, {7, 7, 7, 7});
  Tensor e = make({4}, {1}, opts()).expand({3, 2}).contiguous();
  expect_values(e, {3, 2}, {4, 4, 4, 4, 4, 4});
}

TEST_P(CopyTest, LargeCopiesSplitOverThreads) {
  const int64_t rows = 517, cols = 301;  // over 2 * kGrainSize elements
  std::vector<double> v(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) v[i] = static_cast<double>(i % 1000);
  Tensor a = make(v, {rows, cols}, opts());
  Tensor t = a.transpose(0, 1).contiguous();
  std::vector<double> tv;
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i) tv.push_back(v[i * cols + j]);
  expect_values(t, {cols, rows}, tv, 0, 0);
  expect_values(a.to(DType::Float16), {rows, cols}, v, 0, 0);
  expect_values(a.transpose(0, 1).to(DType::Int32), {cols, rows}, tv, 0, 0);
}

TEST_P(CopyTest, TransposingCopiesOfEveryShape) {
  // Sizes that are not multiples of the tile, with an outer dim, same dtype and converting.
  const Shape shape = {3, 41, 67};
  std::vector<double> v(numel(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 251);
  for (DType to : {DType::Float32, DType::BFloat16, DType::Int64, DType::UInt8}) {
    SCOPED_TRACE(::testing::Message() << to);
    Tensor p = make(v, shape, opts()).permute({0, 2, 1});  // (3, 67, 41)
    std::vector<double> pv;
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t j = 0; j < 67; ++j)
        for (int64_t i = 0; i < 41; ++i) pv.push_back(v[(b * 41 + i) * 67 + j]);
    Tensor out = empty({3, 67, 41}, opts(to));
    out.copy_(p);
    expect_values(out, {3, 67, 41}, pv, 0, 0);
  }
  // NCHW <-> NHWC with C = 20 and H * W = 323.
  const Shape nchw = {2, 20, 17, 19};
  std::vector<double> w(numel(nchw));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<double>(i % 239) - 100;
  Tensor x = make(w, nchw, opts());
  Tensor cl = x.contiguous(MemoryFormat::ChannelsLast);
  expect_values(cl, nchw, w, 0, 0);
  expect_values(cl.contiguous(), nchw, w, 0, 0);
  Tensor cl16 = empty(nchw, {.dtype = DType::Float16, .device = dev(), .memory_format = MemoryFormat::ChannelsLast});
  cl16.copy_(x);
  expect_values(cl16, nchw, w, 0, 0);
}

TEST_P(CopyTest, FillWritesEveryElementOfAnyLayout) {
  for (DType dt : kAllTypes) {
    SCOPED_TRACE(::testing::Message() << dt);
    Tensor base = zeros({3, 4}, opts(dt));
    Tensor view = base.slice(1, 1, 3);
    view.fill_(1);
    expect_values(base, {3, 4}, {0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0});
  }
  expect_values(full({2}, 2.75, opts(DType::Int32)), {2}, {2, 2});
  expect_values(full({2}, -1, opts(DType::UInt8)), {2}, {255, 255});
  expect_values(full({2}, 0.3, opts(DType::Bool)), {2}, {1, 1});
  expect_values(full({2}, 0.1, opts(DType::BFloat16)), {2}, {0.10009765625, 0.10009765625}, 0, 0);
  Tensor z = zeros({0, 3}, opts());
  z.fill_(3);  // nothing to do, no error
  EXPECT_EQ(z.numel(), 0);
}

TEST_P(CopyTest, ArangeAndLinspaceValues) {
  expect_values(arange(0, 10, 3, opts(DType::Int64)), {4}, {0, 3, 6, 9}, 0, 0);
  expect_values(arange(5, 0, -2, opts(DType::Int32)), {3}, {5, 3, 1}, 0, 0);
  expect_values(arange(0, 1, 0.25, opts(DType::Float64)), {4}, {0, 0.25, 0.5, 0.75}, 0, 0);
  expect_values(arange(-1, 1, 0.5, opts(DType::Float16)), {4}, {-1, -0.5, 0, 0.5}, 0, 0);
  // Long ranges step exactly: element i is start + i * step, not a running sum.
  Tensor r = arange(0, 100000, 1, opts(DType::Float32));
  EXPECT_EQ(testing::values(r)[99999], 99999);
  expect_values(linspace(0, 1, 5, opts(DType::Float64)), {5}, {0, 0.25, 0.5, 0.75, 1}, 0, 0);
  expect_values(linspace(-1, 1, 7, opts()), {7}, {-1, -2.0 / 3, -1.0 / 3, 0, 1.0 / 3, 2.0 / 3, 1});
  // Symmetric: the ends are exact, the second half steps down from end.
  const std::vector<double> l = testing::values(linspace(0.1, 0.7, 4, opts(DType::Float64)));
  EXPECT_EQ(l[0], 0.1);
  EXPECT_EQ(l[3], 0.7);
  EXPECT_EQ(l[2], 0.7 - (0.7 - 0.1) / 3);
  expect_values(linspace(0, 10, 4, opts(DType::Int64)), {4}, {0, 3, 6, 10}, 0, 0);
  expect_values(linspace(2, 2, 1, opts()), {1}, {2}, 0, 0);
}

KILN_INSTANTIATE_BACKENDS(CopyTest);

}  // namespace
}  // namespace kiln
