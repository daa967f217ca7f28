// nn::max_pool2d, nn::avg_pool2d, nn::adaptive_avg_pool2d and their modules: values against plain double
// loops and hand-derived values, PyTorch's output sizes (ceil_mode), divisors (count_include_pad), adaptive
// cells for uneven sizes, gradients with check_gradients, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/layers/pooling.h"
#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class PoolingTest : public BackendTest {};

// PyTorch's pooling output size, written out independently of kiln.
int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  const double q = static_cast<double>(in + 2 * p - k) / static_cast<double>(s);
  int64_t out = static_cast<int64_t>(ceil_mode ? std::ceil(q) : std::floor(q)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

struct PoolCase {
  int64_t n, c, h, w;
  nn::Pool2dOptions o;
};

// Max or average over each window, in (N, C, OH, OW). The average divides by the window clipped to
// [-p, in + p) (count_include_pad) or to the input.
std::vector<double> pool_ref(const PoolCase& pc, const std::vector<double>& x, bool is_max, Shape* shape) {
  const auto& o = pc.o;
  const nn::Pair s = o.stride.value_or(o.kernel_size);
  const int64_t oh = pool_out(pc.h, o.kernel_size[0], s[0], o.padding[0], o.ceil_mode);
  const int64_t ow = pool_out(pc.w, o.kernel_size[1], s[1], o.padding[1], o.ceil_mode);
  *shape = {pc.n, pc.c, oh, ow};
  std::vector<double> y;
  for (int64_t nc = 0; nc < pc.n * pc.c; ++nc)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t r0 = i * s[0] - o.padding[0], c0 = j * s[1] - o.padding[1];
        double best = -std::numeric_limits<double>::infinity(), total = 0;
        int64_t real = 0;
        for (int64_t r = r0; r < r0 + o.kernel_size[0]; ++r)
          for (int64_t c = c0; c < c0 + o.kernel_size[1]; ++c) {
            if (r < 0 || r >= pc.h || c < 0 || c >= pc.w) continue;
            const double v = x[(nc * pc.h + r) * pc.w + c];
            best = std::max(best, v);
            total += v;
            ++real;
          }
        const int64_t rows = std::min(r0 + o.kernel_size[0], pc.h + o.padding[0]) - r0;
        const int64_t cols = std::min(c0 + o.kernel_size[1], pc.w + o.padding[1]) - c0;
        const double divisor = o.count_include_pad ? static_cast<double>(rows * cols) : static_cast<double>(real);
        y.push_back(is_max ? best : total / divisor);
      }
  return y;
}

void expect_pool_matches(const PoolCase& pc, const TensorOptions& opts, bool channels_last = false) {
  auto xv = uniform(pc.n * pc.c * pc.h * pc.w, -1, 1, 5);
  Tensor x = make(xv, {pc.n, pc.c, pc.h, pc.w}, opts);
  if (channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  for (bool is_max : {true, false}) {
    SCOPED_TRACE(is_max ? "max_pool2d" : "avg_pool2d");
    Shape shape;
    auto ref = pool_ref(pc, xv, is_max, &shape);
    Tensor y = is_max ? nn::max_pool2d(x, pc.o) : nn::avg_pool2d(x, pc.o);
    expect_values(y, shape, ref, 1e-5, 1e-6);
    EXPECT_TRUE(y.is_contiguous(channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous));
  }
}

TEST_P(PoolingTest, HandDerivedValues) {
  // [[0 1 2 3] [4 5 6 7] [8 9 10 11] [12 13 14 15]], 2x2 windows, stride 2.
  Tensor x = arange(16, opts()).reshape({1, 1, 4, 4});
  expect_values(nn::max_pool2d(x, {.kernel_size = 2}), {1, 1, 2, 2}, {5, 7, 13, 15});
  expect_values(nn::avg_pool2d(x, {.kernel_size = 2}), {1, 1, 2, 2}, {2.5, 4.5, 10.5, 12.5});
  // [[1 2] [3 4]] with padding 1: each 2x2 window holds one real element.
  Tensor y = make({1, 2, 3, 4}, {1, 2, 2}, opts());
  expect_values(nn::avg_pool2d(y, {.kernel_size = 2, .padding = 1}), {1, 2, 2}, {0.25, 0.5, 0.75, 1});
  expect_values(nn::avg_pool2d(y, {.kernel_size = 2, .padding = 1, .count_include_pad = false}), {1, 2, 2},
                {1, 2, 3, 4});
  expect_values(nn::max_pool2d(-y, {.kernel_size = 2, .padding = 1}), {1, 2, 2}, {-1, -2, -3, -4});
  expect_values(nn::adaptive_avg_pool2d(x, {1, 1}), {1, 1, 1, 1}, {7.5});
}

TEST_P(PoolingTest, StridePaddingNonSquare) {
  expect_pool_matches({2, 3, 7, 6, {.kernel_size = {3, 2}, .stride = nn::Pair(2, 1), .padding = {1, 1}}}, opts());
  expect_pool_matches({1, 2, 8, 8, {.kernel_size = 3, .stride = 2, .padding = 1}}, opts());
  expect_pool_matches(
      {1, 2, 5, 7, {.kernel_size = {2, 4}, .stride = nn::Pair(1, 3), .padding = {0, 2}, .count_include_pad = false}},
      opts());
}

TEST_P(PoolingTest, CeilModeAndCountIncludePad) {
  for (bool include : {true, false}) {
    SCOPED_TRACE(include ? "count_include_pad" : "exclude pad");
    expect_pool_matches(
        {1, 2, 6, 6, {.kernel_size = 3, .stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = include}},
        opts());
    expect_pool_matches(
        {2, 1, 5, 7, {.kernel_size = 2, .stride = nn::Pair(2, 3), .ceil_mode = true, .count_include_pad = include}},
        opts());
    expect_pool_matches(
        {1, 1, 5, 5, {.kernel_size = 2, .stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = include}},
        opts());
  }
}

TEST_P(PoolingTest, ChannelsLastAndUnbatched) {
  expect_pool_matches({2, 3, 6, 5, {.kernel_size = 3, .stride = 2, .padding = 1}}, opts(), /*channels_last=*/true);
  auto xv = uniform(2 * 4 * 4, -1, 1, 9);
  Tensor x = make(xv, {2, 4, 4}, opts());
  Shape shape;
  auto ref = pool_ref({1, 2, 4, 4, {.kernel_size = 2}}, xv, true, &shape);
  expect_values(nn::max_pool2d(x, {.kernel_size = 2}), {2, 2, 2}, ref);
}

// Ties inside a window: the first maximum (row-major) takes the whole gradient, on every device (PyTorch's rule).
TEST_P(PoolingTest, MaxPoolTiesGiveTheGradientToTheFirstMaximum) {
  // (1, 1, 2, 4): window 0 is all 3s, window 1 has its maximum 5 twice (positions (0, 3) and (1, 2)).
  Tensor x = make({3, 3, 1, 5, 3, 3, 5, 2}, {1, 1, 2, 4}, opts()).requires_grad_();
  Tensor y = nn::max_pool2d(x, {.kernel_size = 2});
  expect_values(y, {1, 1, 1, 2}, {3, 5});
  y.backward(make({10, 20}, {1, 1, 1, 2}, opts()));
  expect_values(x.grad(), {1, 1, 2, 4}, {10, 0, 0, 20, 0, 0, 0, 0});
}

TEST(Pooling, OutputShapesAsTorch) {
  Tensor x = zeros({1, 1, 5, 5});
  // floor: (5 + 2 - 2) / 2 + 1 = 3; ceil would give 4, but that window would start in the right padding.
  EXPECT_EQ(nn::max_pool2d(x, {.kernel_size = 2, .padding = 1, .ceil_mode = true}).shape(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(nn::max_pool2d(x, {.kernel_size = 2, .ceil_mode = true}).shape(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(nn::max_pool2d(x, {.kernel_size = 2}).shape(), (Shape{1, 1, 2, 2}));
  Tensor y = zeros({1, 1, 6, 6});
  EXPECT_EQ(nn::avg_pool2d(y, {.kernel_size = 3, .stride = 2, .padding = 1}).shape(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(nn::avg_pool2d(y, {.kernel_size = 3, .stride = 2, .padding = 1, .ceil_mode = true}).shape(),
            (Shape{1, 1, 4, 4}));
  EXPECT_EQ(nn::avg_pool2d(zeros({2, 3, 112, 112}), {.kernel_size = 3, .stride = 2, .padding = 1}).shape(),
            (Shape{2, 3, 56, 56}));
}

// Cell i of out covers [floor(i in / out), ceil((i + 1) in / out)).
std::vector<double> adaptive_ref(const std::vector<double>& x, int64_t nc, int64_t h, int64_t w, int64_t oh,
                                 int64_t ow) {
  std::vector<double> y;
  for (int64_t p = 0; p < nc; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const auto r0 = static_cast<int64_t>(std::floor(static_cast<double>(i * h) / oh));
        const auto r1 = static_cast<int64_t>(std::ceil(static_cast<double>((i + 1) * h) / oh));
        const auto c0 = static_cast<int64_t>(std::floor(static_cast<double>(j * w) / ow));
        const auto c1 = static_cast<int64_t>(std::ceil(static_cast<double>((j + 1) * w) / ow));
        double total = 0;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) total += x[(p * h + r) * w + c];
        y.push_back(total / static_cast<double>((r1 - r0) * (c1 - c0)));
      }
  return y;
}

TEST_P(PoolingTest, AdaptiveAvgPoolEvenAndUnevenSizes) {
  auto xv = uniform(2 * 3 * 7 * 6, -1, 1, 3);
  Tensor x = make(xv, {2, 3, 7, 6}, opts());
  for (auto [oh, ow] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 3}, {3, 4}, {5, 6}, {2, 2}, {9, 8}}) {
    SCOPED_TRACE(::testing::Message() << "output " << oh << "x" << ow);
    expect_values(nn::adaptive_avg_pool2d(x, {oh, ow}), {2, 3, oh, ow}, adaptive_ref(xv, 6, 7, 6, oh, ow), 1e-5, 1e-6);
  }
  Tensor cl = nn::adaptive_avg_pool2d(x.contiguous(MemoryFormat::ChannelsLast), {3, 4});
  EXPECT_TRUE(cl.is_contiguous(MemoryFormat::ChannelsLast));
  expect_values(cl, {2, 3, 3, 4}, adaptive_ref(xv, 6, 7, 6, 3, 4), 1e-5, 1e-6);
  expect_values(nn::adaptive_avg_pool2d(make(xv, {6, 7, 6}, opts()), {3, 4}), {6, 3, 4},
                adaptive_ref(xv, 6, 7, 6, 3, 4), 1e-5, 1e-6);
}

TEST(Pooling, Gradients) {
  // make_input's values are distinct, so max pooling has no ties.
  auto max_fn = [](const nn::Pool2dOptions& o) {
    return [o](const TensorList& in) { return TensorList{nn::max_pool2d(in[0], o)}; };
  };
  auto avg_fn = [](const nn::Pool2dOptions& o) {
    return [o](const TensorList& in) { return TensorList{nn::avg_pool2d(in[0], o)}; };
  };
  const std::vector<nn::Pool2dOptions> cases = {
      {.kernel_size = 2},
      {.kernel_size = 3, .stride = 2, .padding = 1},
      {.kernel_size = {3, 2}, .stride = nn::Pair(1, 2), .padding = {1, 0}, .ceil_mode = true},
      {.kernel_size = 3, .stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = false},
  };
  for (const auto& o : cases) {
    check_gradients(max_fn(o), {make_input({2, 2, 5, 6}, -1, 1, 3)});
    check_gradients(avg_fn(o), {make_input({2, 2, 5, 6}, -1, 1, 4)});
  }
  for (nn::Pair size : {nn::Pair(1), nn::Pair(3, 2), nn::Pair(2, 4)}) {
    check_gradients([size](const TensorList& in) { return TensorList{nn::adaptive_avg_pool2d(in[0], size)}; },
                    {make_input({2, 2, 5, 6}, -1, 1, 5)});
  }
}

TEST_P(PoolingTest, Modules) {
  Tensor x = make(uniform(2 * 3 * 8 * 8, -1, 1, 6), {2, 3, 8, 8}, opts());
  nn::MaxPool2d max_pool({.kernel_size = 3, .stride = 2, .padding = 1});
  nn::AvgPool2d avg_pool({.kernel_size = 2});
  nn::AdaptiveAvgPool2d gap({1, 1});
  EXPECT_EQ(max_pool.type_name(), "MaxPool2d");
  EXPECT_TRUE(max_pool.named_parameters().empty());
  EXPECT_TRUE(equal(max_pool(x), nn::max_pool2d(x, max_pool.options)));
  EXPECT_TRUE(equal(avg_pool(x), nn::avg_pool2d(x, avg_pool.options)));
  EXPECT_TRUE(allclose(gap(x), x.mean({2, 3}, true)));
  EXPECT_EQ(gap(x).shape(), (Shape{2, 3, 1, 1}));
}

TEST(Pooling, BadInput) {
  expect_error(
      [] {
        nn::max_pool2d(zeros({1, 1, 4, 4}), {.kernel_size = 2, .padding = 2});
      },
      {"max_pool2d", "padding (2, 2)", "at most half the kernel size (2, 2)"});
  expect_error(
      [] {
        nn::avg_pool2d(zeros({1, 1, 4, 4}), {.kernel_size = 3, .padding = {1, 2}});
      },
      {"avg_pool2d", "at most half"});
  expect_error([] { nn::max_pool2d(zeros({4, 4}), {.kernel_size = 2}); }, {"max_pool2d", "4-d input", "[4, 4]"});
  expect_error(
      [] {
        nn::avg_pool2d(zeros({1, 1, 2, 4}), {.kernel_size = 3});
      },
      {"avg_pool2d", "input size 2", "kernel size 3"});
  expect_error(
      [] {
        nn::max_pool2d(zeros({1, 1, 4, 4}), {.kernel_size = 2, .stride = 0});
      },
      {"max_pool2d", "stride must be positive"});
  expect_error(
      [] {
        nn::max_pool2d(zeros({1, 1, 4, 4}, {.dtype = DType::Int64}), {.kernel_size = 2});
      },
      {"max_pool2d", "floating-point", "int64"});
  expect_error(
      [] {
        nn::adaptive_avg_pool2d(zeros({1, 1, 4, 4}), {0, 2});
      },
      {"adaptive_avg_pool2d", "output_size must be positive", "(0, 2)"});
  expect_error(
      [] {
        nn::adaptive_avg_pool2d(zeros({1, 1, 1, 4, 4}), 2);
      },
      {"adaptive_avg_pool2d", "4-d input", "[1, 1, 1, 4, 4]"});
  expect_error([] { nn::AdaptiveAvgPool2d({2, -1}); }, {"AdaptiveAvgPool2d", "positive"});
}

KILN_INSTANTIATE_BACKENDS(PoolingTest);

}  // namespace
}  // namespace kiln::testing
