// nn::linear_gelu_linear, a transformer's MLP as one autograd node, and nn::gelu_backward_with_column_sums, the pass
// its backward takes through the GELU: against the composed ops (linear, gelu, linear) on the same backend, whose
// values the node keeps, and the column sums against float64 sums of the gradient as stored.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/autograd/autocast.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/layers/functional.h"
#include "kiln/profiler/profiler.h"    // the additions a backward makes
#include "kiln/tensor/internal_ops.h"  // internal::gelu_backward: the values dh must equal
#include "support/profile_counts.h"    // additions_of
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class MlpTest : public ExactFloat32Test {};

std::string str(const Shape& shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

bool is_mlp_node(const Tensor& y) {
  return y.grad_fn() && std::string(y.grad_fn()->name()).find("MlpFunction") != std::string::npos;
}

// |got - want| <= bound elementwise, NaN where want is NaN.
void expect_close(const Tensor& got, const Tensor& want, double rtol, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(got.defined() && want.defined());
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  const std::vector<double> g = values(got), w = values(want);
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_NEAR(g[i], w[i], rtol * scale + 1e-30) << "element " << i;
  }
}

void expect_same(const Tensor& got, const Tensor& want, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(got.defined() && want.defined());
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(bytes_of(got), bytes_of(want));
}

// ---------------------------------------------------------------- gelu_backward_with_column_sums

// dh equals internal::gelu_backward's bit for bit, and each column's sum equals the float64 sum of dh's stored values
// within the float32 bound of a sum of r terms (exact order aside), for the kernel's shapes (tiles of 64 rows, a last
// partial tile, one row, 3-D) and those it leaves to the composed path (columns not a multiple of 16 bytes, a
// transposed input, float64), in both GELU forms.
TEST_P(MlpTest, GeluBackwardWithColumnSumsEqualsTheGradientAndItsSums) {
  struct Case {
    Shape shape;
    bool transposed;
  };
  const std::vector<Case> cases = {{{200, 64}, false},   {{1, 8}, false},   {{64 * 41 + 5, 24}, false},
                                   {{2, 70, 32}, false}, {{70, 12}, false}, {{48, 40}, true}};
  for (const DType dtype : {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64}) {
    for (const Case& c : cases) {
      for (const bool tanh : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << str(c.shape) << (c.transposed ? " transposed" : "")
                                          << (tanh ? " tanh" : " erf"));
        const int64_t n = numel(c.shape), cols = c.shape.back(), rows = n / cols;
        Tensor g = make(uniform(n, -3, 3, 51), c.shape, opts(dtype));
        Tensor h = make(uniform(n, -5, 5, 52), c.shape, opts(dtype));
        if (c.transposed) {  // the same values, read through a transposed view
          g = make(uniform(n, -3, 3, 51), {cols, rows}, opts(dtype)).t();
          h = make(uniform(n, -5, 5, 52), {cols, rows}, opts(dtype)).t();
        }
        const auto [dh, sums] = nn::gelu_backward_with_column_sums(g, h, tanh);
        const Tensor want = internal::gelu_backward(g, h, tanh);
        expect_same(dh, want, "dh");
        const DType sum_dtype = dtype == DType::Float64 ? DType::Float64 : DType::Float32;
        ASSERT_EQ(sums.shape(), (Shape{cols}));
        ASSERT_EQ(sums.dtype(), sum_dtype);
        const std::vector<double> d = values(want), s = values(sums);
        const double eps = dtype == DType::Float64 ? 0x1p-53 : 0x1p-24;
        for (int64_t j = 0; j < cols; ++j) {
          double exact = 0, magnitude = 0;
          for (int64_t i = 0; i < rows; ++i) {
            exact += d[i * cols + j];
            magnitude += std::abs(d[i * cols + j]);
          }
          ASSERT_NEAR(s[j], exact, 4 * rows * eps * magnitude + 1e-300) << "column " << j;
        }
      }
    }
  }
}

// A NaN in h makes its element and its column's sum NaN; an infinite gradient where gelu' is 0 (h = -inf) is NaN too
// (inf times 0), as gelu_backward gives it; the other columns keep finite sums.
TEST_P(MlpTest, GeluBackwardWithColumnSumsCarriesNaN) {
  const int64_t rows = 130, cols = 16;
  std::vector<double> gv = uniform(rows * cols, -1, 1, 61), hv = uniform(rows * cols, -2, 2, 62);
  hv[100 * cols + 3] = kNaN;
  gv[129 * cols + 9] = kInf;
  hv[129 * cols + 9] = -kInf;
  for (const DType dtype : {DType::Float32, DType::BFloat16}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const Tensor g = make(gv, {rows, cols}, opts(dtype)), h = make(hv, {rows, cols}, opts(dtype));
    const auto [dh, sums] = nn::gelu_backward_with_column_sums(g, h);
    expect_same(dh, internal::gelu_backward(g, h), "dh");
    const std::vector<double> s = values(sums);
    for (int64_t j = 0; j < cols; ++j) {
      EXPECT_EQ(std::isnan(s[j]), j == 3 || j == 9) << "column " << j << ": " << s[j];
    }
  }
}

TEST_P(MlpTest, GeluBackwardWithColumnSumsRejectsBadArguments) {
  const Tensor a = zeros({4, 8}, opts()), b = zeros({4, 16}, opts());
  expect_error([&] { nn::gelu_backward_with_column_sums(a, b); },
               {"gelu_backward_with_column_sums", "one shape", "[4, 8]", "[4, 16]"});
  expect_error(
      [&] {
        nn::gelu_backward_with_column_sums(a, zeros({4, 8}, opts(DType::BFloat16)));
      },
      {"gelu_backward_with_column_sums", "one floating dtype"});
  expect_error(
      [&] {
        nn::gelu_backward_with_column_sums(zeros({4, 8}, opts(DType::Int64)), zeros({4, 8}, opts(DType::Int64)));
      },
      {"gelu_backward_with_column_sums", "floating"});
  expect_error([&] { nn::gelu_backward_with_column_sums(Tensor(), a); }, {"gelu_backward_with_column_sums", "defined"});
}

// ---------------------------------------------------------------- linear_gelu_linear

struct MlpParams {
  Tensor w1, b1, w2, b2;
};
MlpParams make_params(int64_t in, int64_t hidden, int64_t out, const TensorOptions& o, bool biases, uint32_t seed) {
  MlpParams p;
  p.w1 = make(uniform(hidden * in, -0.3, 0.3, seed), {hidden, in}, o).requires_grad_();
  p.w2 = make(uniform(out * hidden, -0.3, 0.3, seed + 1), {out, hidden}, o).requires_grad_();
  if (biases) {
    p.b1 = make(uniform(hidden, -0.5, 0.5, seed + 2), {hidden}, o).requires_grad_();
    p.b2 = make(uniform(out, -0.5, 0.5, seed + 3), {out}, o).requires_grad_();
  }
  return p;
}
MlpParams copy_of(const MlpParams& p) {
  const auto c = [](const Tensor& t) { return t.defined() ? t.detach().clone().requires_grad_() : Tensor(); };
  return {c(p.w1), c(p.b1), c(p.w2), c(p.b2)};
}

// Under autocast (bfloat16, float16) from a float32 input and without autocast (float32, float64): one MlpFunction
// node whose output is the composed ops' bit for bit, and whose gradients are theirs: w2's and b2's bit for bit (the
// same product), x's too where both run the same kernels (the CPU), the others within float32 rounding (b1's sums
// come from the GELU's pass). Gradients reach every parameter in its own dtype
// and x's producer directly.
TEST_P(MlpTest, OneNodeGivesTheComposedOpsValues) {
  const int64_t in = 32, hidden = 64, out = 16;
  struct Mode {
    DType param_dtype;
    std::optional<DType> autocast;
  };
  for (const Mode mode : {Mode{DType::Float32, DType::BFloat16}, Mode{DType::Float32, DType::Float16},
                          Mode{DType::Float32, std::nullopt}, Mode{DType::Float64, std::nullopt}}) {
    for (const bool biases : {true, false}) {
      for (const bool tanh : {false, true}) {
        for (const Shape& shape : {Shape{96, in}, Shape{3, 50, in}}) {
          ::testing::Message trace;
          trace << mode.param_dtype << ", autocast ";
          if (mode.autocast) {
            trace << *mode.autocast;
          } else {
            trace << "off";
          }
          SCOPED_TRACE(trace << (biases ? ", biases" : ", no biases") << (tanh ? ", tanh" : ", erf") << ", input "
                             << str(shape));
          const TensorOptions o = opts(mode.param_dtype);
          const MlpParams p = make_params(in, hidden, out, o, biases, 70);
          const MlpParams q = copy_of(p);
          Tensor r1 = make(uniform(numel(shape), -2, 2, 74), shape, o).requires_grad_();
          Tensor r2 = r1.detach().clone().requires_grad_();
          Shape y_shape = shape;
          y_shape.back() = out;
          Tensor y1, y2, x1;
          {
            std::optional<autocast::Guard> on;
            if (mode.autocast) on.emplace(dev().type(), *mode.autocast);
            x1 = r1 * 2.0;  // an activation with a node of its own
            y1 = nn::linear_gelu_linear(x1, p.w1, p.b1, p.w2, p.b2, tanh);
            y2 = nn::linear(gelu(nn::linear(r2 * 2.0, q.w1, q.b1), tanh), q.w2, q.b2);
          }
          ASSERT_TRUE(is_mlp_node(y1)) << (y1.grad_fn() ? y1.grad_fn()->name() : "no node");
          EXPECT_EQ(y1.grad_fn()->next_edges()[0].fn.get(), x1.grad_fn().get()) << "x's gradient goes straight to x";
          EXPECT_FALSE(is_mlp_node(y2));
          expect_same(y1, y2, "y");
          const Tensor g = make(uniform(numel(y_shape), -1, 1, 75), y_shape, opts(y1.dtype()));
          y1.backward(g);
          y2.backward(g);
          const bool same_kernels = dev().is_cpu();
          const double rtol = mode.param_dtype == DType::Float64 ? 1e-12 : 2e-6;
          const auto check = [&](const Tensor& a, const Tensor& b, const char* what, bool bitwise) {
            if (bitwise) {
              expect_same(a, b, what);
            } else {
              expect_close(a, b, rtol, what);
            }
          };
          check(r1.grad(), r2.grad(), "x's gradient", same_kernels);
          // The composed path takes w1's gradient with its bias's sums (mm_with_row_sums), and w2's without a bias as
          // (a^T g)^T: other products, whose sums may round differently.
          check(p.w1.grad(), q.w1.grad(), "w1's gradient", false);
          check(p.w2.grad(), q.w2.grad(), "w2's gradient", biases);
          if (biases) {
            check(p.b2.grad(), q.b2.grad(), "b2's gradient", true);
            check(p.b1.grad(), q.b1.grad(), "b1's gradient", false);
          }
        }
      }
    }
  }
}

// Under autocast from an input already in the autocast dtype (a 16-bit activation): the node takes it as it is and
// gives its gradient in that dtype, the composed ops' values.
TEST_P(MlpTest, SixteenBitInputUnderAutocast) {
  const int64_t in = 16, hidden = 32, out = 8, rows = 40;
  const MlpParams p = make_params(in, hidden, out, opts(), true, 100), q = copy_of(p);
  Tensor r1 = make(uniform(rows * in, -1, 1, 104), {rows, in}, opts(DType::BFloat16)).requires_grad_();
  Tensor r2 = r1.detach().clone().requires_grad_();
  Tensor y1, y2;
  {
    autocast::Guard on(dev().type(), DType::BFloat16);
    y1 = nn::linear_gelu_linear(r1 * 1.0, p.w1, p.b1, p.w2, p.b2);
    y2 = nn::linear(gelu(nn::linear(r2 * 1.0, q.w1, q.b1)), q.w2, q.b2);
  }
  ASSERT_TRUE(is_mlp_node(y1));
  expect_same(y1, y2, "y");
  const Tensor g = make(uniform(rows * out, -1, 1, 105), {rows, out}, opts(DType::BFloat16));
  y1.backward(g);
  y2.backward(g);
  EXPECT_EQ(r1.grad().dtype(), DType::BFloat16);
  expect_close(r1.grad(), r2.grad(), 1e-2, "x's gradient");  // bfloat16: rounded once or twice
  expect_close(p.w1.grad(), q.w1.grad(), 2e-6, "w1's gradient");
  expect_close(p.b1.grad(), q.b1.grad(), 2e-6, "b1's gradient");
  expect_same(p.w2.grad(), q.w2.grad(), "w2's gradient");
}

// A residual stream: h = 2 r is used by the MLP and by h * u. Backward adds the MLP's dX into the sum h * u's gradient
// began (one product with beta = 1), so it runs no addition of h's gradients, and r's gradient is the composed path's.
TEST_P(MlpTest, InputGradientIsAddedIntoTheResidualSum) {
  const int64_t in = 16, hidden = 32, out = 16, rows = 32;
  const Shape shape{2, 16, in};
  const MlpParams p = make_params(in, hidden, out, opts(), true, 80), q = copy_of(p);
  Tensor r1 = make(uniform(rows * in, -1, 1, 84), shape, opts()).requires_grad_();
  Tensor r2 = r1.detach().clone().requires_grad_();
  const Tensor u = make(uniform(rows * in, -1, 1, 85), shape, opts());
  const Tensor g = make(uniform(rows * out, -1, 1, 86), {2, 16, out}, opts());
  Tensor loss1, loss2;
  {
    autocast::Guard on(dev().type(), DType::BFloat16);
    const Tensor h1 = r1 * 2.0, h2 = r2 * 2.0;
    const Tensor y1 = nn::linear_gelu_linear(h1, p.w1, p.b1, p.w2, p.b2);
    ASSERT_TRUE(is_mlp_node(y1));
    loss1 = (y1.to(DType::Float32) * g).sum() + (h1 * u).sum();
    const Tensor y2 = nn::linear(gelu(nn::linear(h2, q.w1, q.b1)), q.w2, q.b2);
    loss2 = (y2.to(DType::Float32) * g).sum() + (h2 * u).sum();
  }
  profiler::Profile prof;
  loss1.backward();
  prof.stop();
  loss2.backward();
  expect_close(r1.grad(), r2.grad(), 2e-6, "r's gradient");
  EXPECT_EQ(additions_of(prof.result(), "[2, 16, 16]"), 0u) << "additions of h's gradients";
}

// Where the node does not apply, linear_gelu_linear is the composition itself, with its values: without gradients
// (grad mode off, or no input that requires one), for a 1-D input, for parameters of another dtype than x's without
// autocast (its error is the composition's). With frozen weights the node still runs, and gives x's and the biases'
// gradients alone.
TEST_P(MlpTest, OtherCallsTakeTheComposedPath) {
  const int64_t in = 16, hidden = 32, out = 8, rows = 10;
  const MlpParams p = make_params(in, hidden, out, opts(), true, 90);
  const Tensor x = make(uniform(rows * in, -1, 1, 94), {rows, in}, opts());
  const auto composed = [&](const Tensor& xx, const MlpParams& m) {
    return nn::linear(gelu(nn::linear(xx, m.w1, m.b1)), m.w2, m.b2);
  };
  {
    NoGradGuard no_grad;
    const Tensor y = nn::linear_gelu_linear(x, p.w1, p.b1, p.w2, p.b2);
    EXPECT_FALSE(y.grad_fn());
    expect_same(y, composed(x, p), "grad mode off");
  }
  {
    const Tensor x1 = make(uniform(in, -1, 1, 95), {in}, opts()).requires_grad_();
    const Tensor y = nn::linear_gelu_linear(x1, p.w1, p.b1, p.w2, p.b2);
    EXPECT_FALSE(is_mlp_node(y));
    expect_same(y, composed(x1, p), "1-D");
  }
  {  // the composed path raises its error
    const Tensor x64 = make(uniform(rows * in, -1, 1, 96), {rows, in}, opts(DType::Float64)).requires_grad_();
    expect_error([&] { nn::linear_gelu_linear(x64, p.w1, p.b1, p.w2, p.b2); }, {"same dtype", "float64", "float32"});
  }
  {  // frozen weights
    MlpParams f = copy_of(p), c = copy_of(p);
    f.w1 = f.w1.detach();
    f.w2 = f.w2.detach();
    c.w1 = c.w1.detach();
    c.w2 = c.w2.detach();
    Tensor x1 = x.clone().requires_grad_(), x2 = x.clone().requires_grad_();
    const Tensor y1 = nn::linear_gelu_linear(x1, f.w1, f.b1, f.w2, f.b2), y2 = composed(x2, c);
    ASSERT_TRUE(is_mlp_node(y1));
    const Tensor g = make(uniform(rows * out, -1, 1, 97), {rows, out}, opts());
    y1.backward(g);
    y2.backward(g);
    expect_close(x1.grad(), x2.grad(), 2e-6, "x's gradient");
    expect_close(f.b1.grad(), c.b1.grad(), 2e-6, "b1's gradient");
    expect_same(f.b2.grad(), c.b2.grad(), "b2's gradient");
  }
}

KILN_INSTANTIATE_BACKENDS(MlpTest);

}  // namespace
}  // namespace kiln::testing
