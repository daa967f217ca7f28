// CUDA kernels: the activation gradients of BinaryOp (GeluErfBackward, GeluTanhBackward, SiluBackward,
// ReluBackward): out = g * f'(x) in one elementwise kernel that reads the incoming gradient g and the saved
// x (ReLU: the saved result) and writes out, instead of a chain of small ops over the whole tensor. Half and
// BFloat16 compute in float and round once. The formulas, their order of operations and their values at the
// edges (special_values.h: f'(+inf) = 1, f'(-inf) = 0, NaN for NaN) are those of cpu/activation_backward.cpp
// (gelu' of the erf form in float through the normal tail on both: activations.cuh).
#include "kiln/tensor/cuda/activations.cuh"      // gelu_erf_grad, gelu_tanh_grad
#include "kiln/tensor/cuda/binary_ops.h"         // binary_activation_backward
#include "kiln/tensor/cuda/elementwise_ops.cuh"  // launch_same, m_erf, m_exp, m_tanh
#include "kiln/tensor/special_values.h"          // the derivatives' limits, the edges of exp, erf, tanh

namespace kiln::cuda {

namespace {
// f'(x), NaN for a NaN x and its limit at ±inf (special_values.h), with the edge-safe exp, erf and tanh of
// special_values.h, as on the CPU.
template <BinaryOp kOp, typename C>
__device__ __forceinline__ C derivative(C x) {
  if constexpr (kOp == BinaryOp::GeluErfBackward) {
    return gelu_erf_grad(x);  // activations.cuh, shared with the FP8 quantisation through a GELU
  } else if constexpr (kOp == BinaryOp::GeluTanhBackward) {
    return gelu_tanh_grad(x);
  } else {
    // silu(x) = x s, s = sigmoid(x): s (1 + x (1 - s)), s from e = exp(-|x|) as the CPU's sigmoid_n.
    const C a = special::sigmoid_arg(x);
    const C s = special::sigmoid_from_exp(x, special::exp_finish(a, m_exp(special::exp_arg(a))));
    return special::activation_grad_finish(x, s * (x * (C(1) - s) + C(1)));
  }
}

template <BinaryOp kOp, typename C>
struct ActivationBackwardF {
  __device__ C operator()(C g, C x) const {
    if constexpr (kOp == BinaryOp::ReluBackward) {
      return x > C(0) ? g : C(0);  // x is relu's result: 0 at 0 and for NaN (NaN > 0 is false)
    } else {
      static_assert(
          kOp == BinaryOp::GeluErfBackward || kOp == BinaryOp::GeluTanhBackward || kOp == BinaryOp::SiluBackward,
          "not an activation gradient");
      return g * derivative<kOp>(x);  // IEEE: an inf gradient times a zero derivative is NaN
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
