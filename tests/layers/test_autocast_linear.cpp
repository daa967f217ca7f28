// nn::linear under autocast from a float32 input: one node takes x's gradient straight to x, computes dX as float32
// sums of the 16-bit product, and adds it into the float32 sum x's other uses began (a residual stream's) without an
// addition of its own. Values against float64 references on inputs that 16 bits represent exactly (quarters), where
// every product and sum is exact in float32.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kiln/autograd/autocast.h"
#include "kiln/layers/functional.h"
#include "kiln/profiler/profiler.h"  // the additions a backward makes
#include "support/profile_counts.h"  // additions_of
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class AutocastLinearTest : public ExactFloat32Test {};

// Quarters in [-1, 1]: exact in float16 and bfloat16; products of two are sixteenths, sums of a few exact in float32.
std::vector<double> quarter_values(int64_t n, uint32_t seed) { return exact_grid(n, 4, 4.0, seed); }

// y = x W^T (+ b), dx = g W, dW = g^T x, db = column sums of g, over rows of x (rows, in), W (out, in), g (rows, out).
struct LinearReference {
  std::vector<double> y, dx, dw, db;
};
LinearReference reference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                          const std::vector<double>& g, int64_t rows, int64_t in, int64_t out) {
  LinearReference r{std::vector<double>(rows * out), std::vector<double>(rows * in, 0.0),
                    std::vector<double>(out * in, 0.0), std::vector<double>(out, 0.0)};
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[o];
      for (int64_t k = 0; k < in; ++k) acc += x[i * in + k] * w[o * in + k];
      r.y[i * out + o] = acc;
      const double gi = g[i * out + o];
      r.db[o] += gi;
      for (int64_t k = 0; k < in; ++k) {
        r.dx[i * in + k] += gi * w[o * in + k];
        r.dw[o * in + k] += gi * x[i * in + k];
      }
    }
  }
  return r;
}

// The first node of x's gradient, from y's node: the one of x's own producer (h = 1.5 r), with no cast or reshape
// between; the values and dtypes of the output and of every gradient, in both 16-bit dtypes, with and without a bias,
// for 2-D and 3-D inputs.
TEST_P(AutocastLinearTest, OneNodeGivesEveryGradientAsFloat64Says) {
  const int64_t in = 8, out = 5;
  for (const DType dtype : {DType::BFloat16, DType::Float16}) {
    for (const bool with_bias : {true, false}) {
      for (const Shape& shape : {Shape{6, in}, Shape{2, 3, in}}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype << (with_bias ? ", bias" : ", no bias") << ", input of " << shape.size() << " dims");
        const int64_t rows = 6;
        const auto xv = quarter_values(rows * in, 1), wv = quarter_values(out * in, 2), bv = quarter_values(out, 3);
        const auto gv = quarter_values(rows * out, 4);
        Tensor r = make(xv, shape, opts()).requires_grad_();
        Tensor w = make(wv, {out, in}, opts()).requires_grad_();
        Tensor b = make(bv, {out}, opts()).requires_grad_();
        Tensor y, h;
        {
          autocast::Guard on(dev().type(), dtype);
          h = r * 2.0;  // a float32 activation with a node of its own
          y = nn::linear(h, w, with_bias ? b : Tensor());
        }
        EXPECT_EQ(y.dtype(), dtype);
        ASSERT_TRUE(y.grad_fn());
        EXPECT_NE(std::string(y.grad_fn()->name()).find("AutocastLinearFunction"), std::string::npos)
            << y.grad_fn()->name();
        EXPECT_EQ(y.grad_fn()->next_edges()[0].fn.get(), h.grad_fn().get()) << "x's gradient goes straight to x";
        std::vector<double> hv(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) hv[i] = 2.0 * xv[i];
        const LinearReference ref = reference(hv, wv, with_bias ? bv : std::vector<double>{}, gv, rows, in, out);
        Shape y_shape = shape;
        y_shape.back() = out;
        expect_values(y, y_shape, ref.y, 0, 0);  // sums of sixteenths, up to 16: exact in 16 bits too
        y.backward(make(gv, y_shape, opts(dtype)));
        ASSERT_TRUE(r.grad().defined() && w.grad().defined());
        EXPECT_EQ(r.grad().dtype(), DType::Float32);
        EXPECT_EQ(w.grad().dtype(), DType::Float32);
        std::vector<double> dr(ref.dx.size());
        for (size_t i = 0; i < dr.size(); ++i) dr[i] = 2.0 * ref.dx[i];
        expect_values(r.grad(), shape, dr, 0, 0);
        expect_values(w.grad(), {out, in}, ref.dw, 0, 0);
        if (with_bias) {
          ASSERT_TRUE(b.grad().defined());
          EXPECT_EQ(b.grad().dtype(), DType::Float32);
          expect_values(b.grad(), {out}, ref.db, 0, 0);
        } else {
          EXPECT_FALSE(b.grad().defined());
        }
      }
    }
  }
}

// A residual stream: h = 2 r is used by the product and by h * u. Backward adds the product's dX into the sum h * u's
// gradient began (one product with beta = 1, float32 sums), so it runs no addition of h's gradients; r's gradient is
// 2 (g W + u), exact here.
TEST_P(AutocastLinearTest, InputGradientIsAddedIntoTheResidualSum) {
  const int64_t in = 8, out = 5, rows = 32;
  const Shape shape{2, 16, in};
  const auto xv = quarter_values(rows * in, 11), wv = quarter_values(out * in, 12), bv = quarter_values(out, 13);
  const auto gv = quarter_values(rows * out, 14), uv = quarter_values(rows * in, 15);
  Tensor r = make(xv, shape, opts()).requires_grad_();
  Tensor w = make(wv, {out, in}, opts()).requires_grad_();
  Tensor b = make(bv, {out}, opts()).requires_grad_();
  const Tensor u = make(uv, shape, opts());
  const Tensor g = make(gv, {2, 16, out}, opts());
  Tensor loss;
  {
    autocast::Guard on(dev().type(), DType::BFloat16);
    const Tensor h = r * 2.0;
    const Tensor y = nn::linear(h, w, b);
    loss = (y.to(DType::Float32) * g).sum() + (h * u).sum();
  }
  profiler::Profile prof;
  loss.backward();
  prof.stop();
  std::vector<double> hv(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) hv[i] = 2.0 * xv[i];
  const LinearReference ref = reference(hv, wv, bv, gv, rows, in, out);
  std::vector<double> want(ref.dx.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = 2.0 * (ref.dx[i] + uv[i]);
  expect_values(r.grad(), shape, want, 0, 0);
  expect_values(w.grad(), {out, in}, ref.dw, 0, 0);
  expect_values(b.grad(), {out}, ref.db, 0, 0);
  EXPECT_EQ(additions_of(prof.result(), "[2, 16, 8]"), 0u) << "additions of h's gradients";
}

// Where the one-node path does not apply, nn::linear composes its ops as before, with the same values: a 1-D input, a
// 16-bit input, an input that needs no gradient. And the one-node path with a frozen weight: x's and the bias's
// gradients alone.
TEST_P(AutocastLinearTest, OtherInputsTakeTheComposedPath) {
  const int64_t in = 8, out = 5, rows = 6;
  const auto xv = quarter_values(rows * in, 21), wv = quarter_values(out * in, 22), bv = quarter_values(out, 23);
  const auto gv = quarter_values(rows * out, 24);
  const LinearReference ref = reference(xv, wv, bv, gv, rows, in, out);
  const Tensor w = make(wv, {out, in}, opts()), b = make(bv, {out}, opts());
  autocast::Guard on(dev().type(), DType::BFloat16);
  {  // 1-D
    const std::vector<double> x1(xv.begin(), xv.begin() + in);
    Tensor x = make(x1, {in}, opts()).requires_grad_();
    const Tensor y = nn::linear(x, w, b);
    EXPECT_EQ(std::string(y.grad_fn()->name()).find("AutocastLinearFunction"), std::string::npos);
    expect_values(y, {out}, std::vector<double>(ref.y.begin(), ref.y.begin() + out), 0, 0);
  }
  {  // already 16-bit, and no gradient wanted for x
    const Tensor y16 = nn::linear(make(xv, {rows, in}, opts(DType::BFloat16)), w, b);
    const Tensor y32 = nn::linear(make(xv, {rows, in}, opts()), w, b);
    expect_values(y16, {rows, out}, ref.y, 0, 0);
    expect_values(y32, {rows, out}, ref.y, 0, 0);
  }
  {  // a frozen weight: the bias's gradient alone, the column sums of g
    Tensor x = make(xv, {rows, in}, opts()).requires_grad_();
    Tensor bt = b.clone().requires_grad_();
    const Tensor y = nn::linear(x, w, bt);
    y.backward(make(gv, {rows, out}, opts(DType::BFloat16)));
    expect_values(bt.grad(), {out}, ref.db, 0, 0);
    expect_values(x.grad(), {rows, in}, ref.dx, 0, 0);
  }
}

KILN_INSTANTIATE_BACKENDS(AutocastLinearTest);

}  // namespace
}  // namespace kiln::testing
