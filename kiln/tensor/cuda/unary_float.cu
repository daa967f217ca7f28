// CUDA kernels: the unary ops defined on floating dtypes only (exp, log, tanh, gelu, ...). Half and
// BFloat16 compute in float; the formulas are those of cpu/unary.cpp. The other unary ops are in unary.cu.
#include "kiln/tensor/activation_constants.h"    // GELU's constants
#include "kiln/tensor/cuda/elementwise_ops.cuh"  // m_exp, ..., launch_same
#include "kiln/tensor/cuda/unary_ops.h"          // unary_floating

namespace kiln::cuda {

using activation::kCubic;
using activation::kSqrt2OverPi;
using activation::kSqrtHalf;

namespace {

template <typename C>
__device__ __forceinline__ C sigmoid(C x) {
  return C(1) / (C(1) + m_exp(-x));  // exp(-x) = inf for very negative x gives 0, as wanted
}

// One functor for every floating unary op: the op is a template argument, so each instantiation
// compiles to the one formula.
template <UnaryOp kOp, typename C>
struct FloatF {
  __device__ C operator()(C x) const {
    if constexpr (kOp == UnaryOp::Exp) return m_exp(x);
    else if constexpr (kOp == UnaryOp::Expm1) return m_expm1(x);
    else if constexpr (kOp == UnaryOp::Log) return m_log(x);
    else if constexpr (kOp == UnaryOp::Log1p) return m_log1p(x);
    else if constexpr (kOp == UnaryOp::Log2) return m_log2(x);
    else if constexpr (kOp == UnaryOp::Sqrt) return m_sqrt(x);
    else if constexpr (kOp == UnaryOp::Rsqrt) return m_rsqrt(x);
    else if constexpr (kOp == UnaryOp::Sin) return m_sin(x);
    else if constexpr (kOp == UnaryOp::Cos) return m_cos(x);
    else if constexpr (kOp == UnaryOp::Tanh) return m_tanh(x);
    else if constexpr (kOp == UnaryOp::Erf) return m_erf(x);
    else if constexpr (kOp == UnaryOp::Sigmoid) return sigmoid(x);
    else if constexpr (kOp == UnaryOp::Silu) return x * sigmoid(x);
    else if constexpr (kOp == UnaryOp::GeluErf) return x * C(0.5) * (C(1) + m_erf(x * C(kSqrtHalf)));
    else if constexpr (kOp == UnaryOp::GeluTanh)
      return C(0.5) * x * (C(1) + m_tanh(C(kSqrt2OverPi) * (x + C(kCubic) * x * x * x)));
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
