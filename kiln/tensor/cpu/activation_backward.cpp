// CPU kernels: the activation gradients of BinaryOp (GeluErfBackward, GeluTanhBackward, SiluBackward,
// ReluBackward): out = g * f'(x) in one pass over the incoming gradient g and the saved x (ReLU: the saved
// result), as Eigen array expressions (elementwise_kernels.h). The formulas keep the order of operations of
// the op-by-op gradients they replace, so inf and NaN inputs give what those gave; cuda/activation_backward.cu
// computes the same formulas.
#include <algorithm>  // std::min
#include <cstdint>
#include <string_view>

#include <unsupported/Eigen/SpecialFunctions>  // the vectorised erf behind ArrayBase::erf

#include "kiln/tensor/activation_constants.h"  // GELU's constants
#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/elementwise_kernels.h"  // binary_kernel, kBlock
#include "kiln/tensor/dispatch.h"                 // visit_floating_dtype

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

// gelu(x) = x Φ(x): Φ(x) + x φ(x), with Φ the normal CDF and φ its density.
void gelu_erf(const Tensor& out, const Tensor& g, const Tensor& x) {
  floating("gelu_backward", out, g, x, [](auto gs, auto xs, auto o) {
    using C = scalar_of<decltype(gs)>;
    const auto cdf = ((xs * C(kSqrtHalf)).erf() + C(1)) * C(0.5);
    const auto pdf = (xs.square() * C(-0.5)).exp() * C(kInvSqrt2Pi);
    o = gs * (cdf + xs * pdf);
  });
}

// gelu(x) ~ x/2 (1 + t), t = tanh(k (x + c x^3)): (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2).
void gelu_tanh(const Tensor& out, const Tensor& g, const Tensor& x) {
  floating("gelu_backward", out, g, x, [](auto gs, auto xs, auto o) {
    using C = scalar_of<decltype(gs)>;
    in_blocks(xs.size(), [&](int64_t i, int64_t m) {
      const auto xb = xs.segment(i, m);
      const BlockArray<C> t = (xb * (xb.square() * C(kCubic) + C(1)) * C(kSqrt2OverPi)).tanh();
      const auto left = (t + C(1)) * C(0.5);
      const auto du = (xb.square() * C(3 * kCubic) + C(1)) * C(kSqrt2OverPi);
      const auto right = xb * (C(1) - t.square()) * du * C(0.5);
      o.segment(i, m) = gs.segment(i, m) * (left + right);
    });
  });
}

// silu(x) = x s, s = sigmoid(x): s (1 + x (1 - s)).
void silu(const Tensor& out, const Tensor& g, const Tensor& x) {
  floating("silu_backward", out, g, x, [](auto gs, auto xs, auto o) {
    using C = scalar_of<decltype(gs)>;
    in_blocks(xs.size(), [&](int64_t i, int64_t m) {
      const auto xb = xs.segment(i, m);
      // 1 / (1 + e^-x), as on CUDA: Eigen's logistic() for float is accurate in absolute terms only, which
      // shows here as a relative error of ~1e-4 where s is small (x in [-9, -4]); exp keeps it at an ulp or two.
      const BlockArray<C> s = (C(1) + (-xb).exp()).inverse();
      o.segment(i, m) = gs.segment(i, m) * (s * (xb * (C(1) - s) + C(1)));
    });
  });
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
