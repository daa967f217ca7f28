// CUDA kernels: the unary ops defined on floating dtypes only (exp, log, tanh, gelu, ...). Half and
// BFloat16 compute in float; the formulas and their edges (special_values.h) are those of cpu/unary.cpp (GELU's erf
// form in float through the normal tail on both: activations.cuh). The other unary ops are in unary.cu.
#include "kiln/tensor/cuda/activations.cuh"      // safe_tanh, safe_erf, gelu_erf, gelu_tanh
#include "kiln/tensor/cuda/elementwise_ops.cuh"  // m_exp, ..., launch_same
#include "kiln/tensor/cuda/unary_ops.h"          // unary_floating
#include "kiln/tensor/special_values.h"          // the functions' values at NaN, ±inf, ±0, subnormals

namespace kiln::cuda {

namespace {

// Every edge (NaN, ±inf, ±0, subnormals, saturation) is decided by special_values.h, as on the CPU, around the
// CUDA math library (which is accurate at the edges too, so this costs a few compares and keeps the backends'
// results at the edges identical bit for bit).
template <typename C>
__device__ __forceinline__ C safe_exp(C x) {
  return special::exp_finish(x, m_exp(special::exp_arg(x)));
}

// e / (1 + e) for x < 0, 1 / (1 + e) otherwise, with e = exp(-|x|): 0 and 1 at -inf and +inf, and the subnormal
// values of the far negative tail rather than 1 / (1 + inf) = 0.
template <typename C>
__device__ __forceinline__ C sigmoid(C x) {
  return special::sigmoid_from_exp(x, safe_exp(special::sigmoid_arg(x)));
}

// One functor for every floating unary op: the op is a template argument, so each instantiation
// compiles to the one formula.
template <UnaryOp kOp, typename C>
struct FloatF {
  __device__ C operator()(C x) const {
    using special::activation_finish;
    if constexpr (kOp == UnaryOp::Exp) return safe_exp(x);
    else if constexpr (kOp == UnaryOp::Expm1) return special::expm1_finish(x, m_expm1(special::expm1_arg(x)));
    else if constexpr (kOp == UnaryOp::Log) return special::log_finish(x, m_log(special::log_arg(x)));
    else if constexpr (kOp == UnaryOp::Log1p) return special::log1p_finish(x, m_log1p(special::log1p_arg(x)));
    else if constexpr (kOp == UnaryOp::Log2) return special::log2_finish(x, m_log2(special::log_arg(x)));
    else if constexpr (kOp == UnaryOp::Sqrt) return m_sqrt(x);
    else if constexpr (kOp == UnaryOp::Rsqrt) return C(1) / m_sqrt(x);  // as the CPU: two correctly rounded steps
    else if constexpr (kOp == UnaryOp::Sin) return m_sin(x);
    else if constexpr (kOp == UnaryOp::Cos) return m_cos(x);
    else if constexpr (kOp == UnaryOp::Tanh) return safe_tanh(x);
    else if constexpr (kOp == UnaryOp::Erf) return safe_erf(x);
    else if constexpr (kOp == UnaryOp::Sigmoid) return sigmoid(x);
    else if constexpr (kOp == UnaryOp::Silu) return activation_finish(x, x * sigmoid(x));
    else if constexpr (kOp == UnaryOp::GeluErf) return gelu_erf(x);
    else if constexpr (kOp == UnaryOp::GeluTanh) return gelu_tanh(x);
    else if constexpr (kOp == UnaryOp::Reciprocal) return C(1) / x;
    else static_assert(kOp == UnaryOp::Exp, "not a floating unary op");
  }
};

template <UnaryOp kOp>
void run(const char* name, const Tensor& out, const Tensor& a) {
  visit_floating_dtype(a.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_same<T>(name, out, a, FloatF<kOp, compute_t<T>>{});
  });
}

}  // namespace

bool unary_floating(UnaryOp op, const Tensor& out, const Tensor& a) {
  switch (op) {
    case UnaryOp::Exp: run<UnaryOp::Exp>("exp", out, a); return true;
    case UnaryOp::Expm1: run<UnaryOp::Expm1>("expm1", out, a); return true;
    case UnaryOp::Log: run<UnaryOp::Log>("log", out, a); return true;
    case UnaryOp::Log1p: run<UnaryOp::Log1p>("log1p", out, a); return true;
    case UnaryOp::Log2: run<UnaryOp::Log2>("log2", out, a); return true;
    case UnaryOp::Sqrt: run<UnaryOp::Sqrt>("sqrt", out, a); return true;
    case UnaryOp::Rsqrt: run<UnaryOp::Rsqrt>("rsqrt", out, a); return true;
    case UnaryOp::Sin: run<UnaryOp::Sin>("sin", out, a); return true;
    case UnaryOp::Cos: run<UnaryOp::Cos>("cos", out, a); return true;
    case UnaryOp::Tanh: run<UnaryOp::Tanh>("tanh", out, a); return true;
    case UnaryOp::Erf: run<UnaryOp::Erf>("erf", out, a); return true;
    case UnaryOp::Sigmoid: run<UnaryOp::Sigmoid>("sigmoid", out, a); return true;
    case UnaryOp::Silu: run<UnaryOp::Silu>("silu", out, a); return true;
    case UnaryOp::GeluErf: run<UnaryOp::GeluErf>("gelu", out, a); return true;
    case UnaryOp::GeluTanh: run<UnaryOp::GeluTanh>("gelu", out, a); return true;
    case UnaryOp::Reciprocal: run<UnaryOp::Reciprocal>("reciprocal", out, a); return true;
    default: return false;
  }
}

}  // namespace kiln::cuda
