// CUDA kernels: the activation gradients of BinaryOp (GeluErfBackward, GeluTanhBackward, SiluBackward,
// ReluBackward): out = g * f'(x) in one elementwise kernel that reads the incoming gradient g and the saved
// x (ReLU: the saved result) and writes out, instead of a chain of small ops over the whole tensor. Half and
// BFloat16 compute in float and round once. The formulas, and their order of operations (so inf and NaN give
// what the op-by-op gradients gave), are those of cpu/activation_backward.cpp.
#include "kiln/tensor/activation_constants.h"    // GELU's constants
#include "kiln/tensor/cuda/binary_ops.h"         // binary_activation_backward
#include "kiln/tensor/cuda/elementwise_ops.cuh"  // launch_same, m_erf, m_exp, m_tanh

namespace kiln::cuda {

using activation::kCubic;
using activation::kInvSqrt2Pi;
using activation::kSqrt2OverPi;
using activation::kSqrtHalf;

namespace {
template <BinaryOp kOp, typename C>
struct ActivationBackwardF {
  __device__ C operator()(C g, C x) const {
    if constexpr (kOp == BinaryOp::GeluErfBackward) {
      // gelu(x) = x Φ(x): Φ(x) + x φ(x), with Φ the normal CDF and φ its density.
      const C cdf = (m_erf(x * C(kSqrtHalf)) + C(1)) * C(0.5);
      const C pdf = m_exp(x * x * C(-0.5)) * C(kInvSqrt2Pi);
      return g * (cdf + x * pdf);
    } else if constexpr (kOp == BinaryOp::GeluTanhBackward) {
      // gelu(x) ~ x/2 (1 + t), t = tanh(k (x + c x^3)): (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2).
      const C x2 = x * x;
      const C t = m_tanh(x * (x2 * C(kCubic) + C(1)) * C(kSqrt2OverPi));
      const C left = (t + C(1)) * C(0.5);
      const C du = (x2 * C(3 * kCubic) + C(1)) * C(kSqrt2OverPi);
      const C right = x * (C(1) - t * t) * du * C(0.5);
      return g * (left + right);
    } else if constexpr (kOp == BinaryOp::SiluBackward) {
      // silu(x) = x s, s = sigmoid(x): s (1 + x (1 - s)). exp(-x) = inf for very negative x gives s = 0.
      const C s = C(1) / (C(1) + m_exp(-x));
      return g * (s * (x * (C(1) - s) + C(1)));
    } else if constexpr (kOp == BinaryOp::ReluBackward) {
      return x > C(0) ? g : C(0);  // x is relu's result: 0 at 0 and for NaN (NaN > 0 is false)
    } else {
      static_assert(kOp == BinaryOp::GeluErfBackward, "not an activation gradient");
    }
  }
};

template <BinaryOp kOp>
void run(const char* name, const Tensor& out, const Tensor& g, const Tensor& x) {
  visit_floating_dtype(g.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_same<T>(name, out, g, x, ActivationBackwardF<kOp, compute_t<T>>{});
  });
}

}  // namespace

void binary_activation_backward(BinaryOp op, const Tensor& out, const Tensor& g, const Tensor& x) {
  switch (op) {
    case BinaryOp::GeluErfBackward: return run<BinaryOp::GeluErfBackward>("gelu_backward", out, g, x);
    case BinaryOp::GeluTanhBackward: return run<BinaryOp::GeluTanhBackward>("gelu_backward", out, g, x);
    case BinaryOp::SiluBackward: return run<BinaryOp::SiluBackward>("silu_backward", out, g, x);
    case BinaryOp::ReluBackward: return run<BinaryOp::ReluBackward>("relu_backward", out, g, x);
    default: break;
  }
  KILN_FAIL("cuda::activation_backward: not an activation gradient: op ", static_cast<int>(op));
}

}  // namespace kiln::cuda
