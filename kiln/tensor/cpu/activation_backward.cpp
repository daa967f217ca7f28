// CPU kernels: the activation gradients of BinaryOp (GeluErfBackward, GeluTanhBackward, SiluBackward,
// ReluBackward): out = g * f'(x) in one pass over the incoming gradient g and the saved x (ReLU: the saved
// result), as Eigen array expressions (elementwise_kernels.h). f'(x) is its limit at ±inf (1 at +inf, 0 at
// -inf; kiln/tensor/special_values.h), NaN for a NaN x, and the exp, erf, tanh and sigmoid inside are
// special_math.h's, whose edges do not depend on the vector instruction set; the product with g follows IEEE
// (inf * 0 = NaN). cuda/activation_backward.cu computes the same formulas and edges.
#include <algorithm>  // std::min
#include <cstdint>
#include <string_view>

#include "kiln/tensor/activation_constants.h"  // GELU's constants
#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/elementwise_kernels.h"  // binary_kernel, kBlock
#include "kiln/tensor/cpu/special_math.h"         // exp_n, erf_n, tanh_n, sigmoid_n
#include "kiln/tensor/dispatch.h"                 // visit_floating_dtype
#include "kiln/tensor/special_values.h"           // the derivatives' limits

namespace kiln::cpu {

using activation::kCubic;
using activation::kInvSqrt2Pi;
using activation::kSqrt2OverPi;
using activation::kSqrtHalf;

namespace {
template <typename M>
using scalar_of = typename std::decay_t<M>::Scalar;

// At most kBlock elements on the stack: where a formula uses a transcendental twice (tanh, sigmoid), it is
// computed once per block into one of these, whatever the length of the run.
template <typename C>
using BlockArray = Eigen::Array<C, Eigen::Dynamic, 1, Eigen::ColMajor, kBlock, 1>;

template <typename F>
void in_blocks(int64_t n, const F& f) {
  for (int64_t i = 0; i < n; i += kBlock) f(i, std::min(kBlock, n - i));
}

template <typename F>
void floating(std::string_view name, const Tensor& out, const Tensor& g, const Tensor& x, const F& f) {
  visit_floating_dtype(g.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    binary_kernel<T, T>(out, g, x, f);
  });
}

// out = g * f'(x), kBlock elements at a time: d(x, f') fills f' for a block of x, `finish` (special_values.h)
// replaces it at the edges (its limits at ±inf, where the formulas give inf * 0 = NaN), then one product with g.
// out may alias g or x: every element is read before it is written.
template <typename F, typename Finish>
void grad_times(const Tensor& out, const Tensor& g, const Tensor& x, std::string_view name, const F& d,
                const Finish& finish) {
  floating(name, out, g, x, [&](auto gs, auto xs, auto o) {
    using C = scalar_of<decltype(gs)>;
    in_blocks(xs.size(), [&](int64_t i, int64_t m) {
      alignas(64) C buffer[kBlock];
      Eigen::Map<BlockArray<C>> db(buffer, m);
      const auto xb = xs.segment(i, m);
      d(xb, db);
      const C* px = xb.data();
      for (int64_t j = 0; j < m; ++j) buffer[j] = finish(px[j], buffer[j]);
      o.segment(i, m) = gs.segment(i, m) * db;
    });
  });
}

// gelu(x) = x Φ(x): Φ(x) + x φ(x), with Φ the normal CDF and φ its density.
void gelu_erf(const Tensor& out, const Tensor& g, const Tensor& x) {
  grad_times(
      out, g, x, "gelu_backward",
      [](const auto& xb, auto& d) {
        using C = scalar_of<decltype(xb)>;
        if constexpr (std::is_same_v<C, float>) {  // from the normal tail (special_math.h), as the GPU
          alignas(64) float e[kBlock];
          normal_cdf_n(xb.data(), d.data(), e, xb.size());  // d = Phi(x)
          d += xb * (Eigen::Map<const Eigen::ArrayXf>(e, xb.size()) * float(kInvSqrt2Pi));
        } else {
          BlockArray<C> pdf = xb.square() * C(-0.5);
          exp_n(pdf.data(), pdf.data(), pdf.size());
          d = xb * C(kSqrtHalf);
          erf_n(d.data(), d.data(), d.size());
          d = (d + C(1)) * C(0.5) + xb * (pdf * C(kInvSqrt2Pi));
        }
      },
      [](auto v, auto dv) { return special::activation_grad_finish(v, dv); });
}

// gelu(x) ~ x/2 (1 + t), t = tanh(k (x + c x^3)): (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2).
void gelu_tanh(const Tensor& out, const Tensor& g, const Tensor& x) {
  grad_times(
      out, g, x, "gelu_backward",
      [](const auto& xb, auto& d) {
        using C = scalar_of<decltype(xb)>;
        BlockArray<C> t = xb * (xb.square() * C(kCubic) + C(1)) * C(kSqrt2OverPi);
        tanh_n(t.data(), t.data(), t.size());
        const auto left = (t + C(1)) * C(0.5);
        const auto du = (xb.square() * C(3 * kCubic) + C(1)) * C(kSqrt2OverPi);
        d = left + xb * (C(1) - t.square()) * du * C(0.5);
      },
      [](auto v, auto dv) { return special::gelu_tanh_grad_finish(v, dv); });
}

// silu(x) = x s, s = sigmoid(x): s (1 + x (1 - s)). sigmoid_n is accurate in relative terms where s is small (Eigen's
// logistic() for float is accurate in absolute terms only: a relative error of ~1e-4 for x in [-9, -4]).
void silu(const Tensor& out, const Tensor& g, const Tensor& x) {
  grad_times(
      out, g, x, "silu_backward",
      [](const auto& xb, auto& d) {
        using C = scalar_of<decltype(xb)>;
        sigmoid_n(xb.data(), d.data(), d.size());
        d = d * (xb * (C(1) - d) + C(1));
      },
      [](auto v, auto dv) { return special::activation_grad_finish(v, dv); });
}

// Where the result y is > 0 the input was; 0 at y = 0 (as PyTorch) and for a NaN y (NaN > 0 is false).
void relu(const Tensor& out, const Tensor& g, const Tensor& y) {
  floating("relu_backward", out, g, y, [](auto gs, auto ys, auto o) {
    using C = scalar_of<decltype(gs)>;
    // A plain loop with both loads unconditional, which the compiler turns into vector blends; Eigen 3.4's
    // select() runs one branch per element, mispredicted half the time on activations.
    const C *pg = gs.data(), *py = ys.data();
    C* po = o.data();
    for (int64_t i = 0, n = o.size(); i < n; ++i) {
      const C gi = pg[i], yi = py[i];
      po[i] = yi > C(0) ? gi : C(0);
    }
  });
}

}  // namespace

void activation_backward(BinaryOp op, const Tensor& out, const Tensor& g, const Tensor& x) {
  switch (op) {
    case BinaryOp::GeluErfBackward: return gelu_erf(out, g, x);
    case BinaryOp::GeluTanhBackward: return gelu_tanh(out, g, x);
    case BinaryOp::SiluBackward: return silu(out, g, x);
    case BinaryOp::ReluBackward: return relu(out, g, x);
    default: break;
  }
  KILN_FAIL("cpu::activation_backward: not an activation gradient: op ", static_cast<int>(op));
}

}  // namespace kiln::cpu
