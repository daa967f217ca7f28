// CUDA kernels: CudaBackend::binary for the arithmetic ops (output dtype = input dtype). Comparisons,
// logical ops and where are in compare.cu, the activation gradients in activation_backward.cu. Semantics
// are those of cpu/elementwise.cpp: Bool add is or and mul is and, integers wrap, remainder takes the
// divisor's sign, maximum/minimum propagate NaN.
//
// Integer remainder by zero and integer pow with a negative exponent throw on the CPU; a kernel cannot
// throw, and checking first would synchronise the host, so on CUDA those elements get an unspecified
// value (as in PyTorch). backend.h documents this.
#include "kiln/tensor/cuda/binary_ops.h"         // binary_compare, binary_activation_backward
#include "kiln/tensor/cuda/elementwise_ops.cuh"  // launch_same, wrapping_*, m_*

namespace kiln::cuda {
namespace {

// Python's modulo: the result takes the divisor's sign.
template <typename C>
__device__ __forceinline__ C python_mod(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    C r = m_fmod(a, b);
    if (r != C(0) && ((r < C(0)) != (b < C(0)))) r += b;
    return r;
  } else if constexpr (std::is_unsigned_v<C>) {
    return b == C(0) ? C(0) : static_cast<C>(a % b);  // 0 for a zero divisor: unspecified, but no trap
  } else {
    if (b == C(0) || b == C(-1)) return C(0);  // INT_MIN % -1 overflows; x % -1 is 0 (zero divisor: unspecified)
    C r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  }
}

// Integer power by squaring, wrapping on overflow (a negative exponent gives an unspecified value).
template <typename C>
__device__ __forceinline__ C int_pow(C base, C exponent) {
  using U = std::make_unsigned_t<C>;
  using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
  W result = 1, b = static_cast<W>(static_cast<U>(base));
  for (C e = exponent; e != 0; e /= 2) {
    if (e % 2 != 0) result = static_cast<U>(result * b);
    b = static_cast<U>(b * b);
  }
  return static_cast<C>(static_cast<U>(result));
}

template <BinaryOp kOp, typename C>
struct ArithF {
  __device__ C operator()(C x, C y) const {
    if constexpr (std::is_same_v<C, bool>) {
      if constexpr (kOp == BinaryOp::Add || kOp == BinaryOp::Maximum) return x || y;
      else if constexpr (kOp == BinaryOp::Mul || kOp == BinaryOp::Minimum) return x && y;
      else static_assert(kOp == BinaryOp::Add, "not a Bool op");
    } else if constexpr (kOp == BinaryOp::Add) {
      if constexpr (std::is_integral_v<C>) return wrapping_add(x, y);
      else return x + y;
    } else if constexpr (kOp == BinaryOp::Sub) {
      if constexpr (std::is_integral_v<C>) return wrapping_sub(x, y);
      else return x - y;
    } else if constexpr (kOp == BinaryOp::Mul) {
      if constexpr (std::is_integral_v<C>) return wrapping_mul(x, y);
      else return x * y;
    } else if constexpr (kOp == BinaryOp::Div) {
      return x / y;
    } else if constexpr (kOp == BinaryOp::Remainder) {
      return python_mod(x, y);
    } else if constexpr (kOp == BinaryOp::Pow) {
      if constexpr (std::is_integral_v<C>) return int_pow(x, y);
      else return m_pow(x, y);
    } else if constexpr (kOp == BinaryOp::Maximum || kOp == BinaryOp::Minimum) {
      if (m_isnan(x)) return x;  // NaN wins
      if (m_isnan(y)) return y;
      if constexpr (kOp == BinaryOp::Maximum) return x < y ? y : x;
      else return y < x ? y : x;
    } else {
      static_assert(kOp == BinaryOp::Add, "not an arithmetic op");
    }
  }
};

template <BinaryOp kOp, typename T>
void launch(const char* name, const Tensor& out, const Tensor& a, const Tensor& b) {
  launch_same<T>(name, out, a, b, ArithF<kOp, compute_t<T>>{});
}

// Every dtype, Bool included.
template <BinaryOp kOp>
void any_dtype(const char* name, const Tensor& out, const Tensor& a, const Tensor& b) {
  visit_dtype(a.dtype(), [&](auto tag) { launch<kOp, typename decltype(tag)::type>(name, out, a, b); });
}

template <BinaryOp kOp>
void numeric(const char* name, const Tensor& out, const Tensor& a, const Tensor& b) {
  visit_numeric_dtype(a.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, bool>) launch<kOp, T>(name, out, a, b);  // Bool was rejected at run time
  });
}

}  // namespace

void CudaBackend::binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  switch (op) {
    case BinaryOp::Add: return any_dtype<BinaryOp::Add>("add", out, a, b);
    case BinaryOp::Sub: return numeric<BinaryOp::Sub>("sub", out, a, b);
    case BinaryOp::Mul: return any_dtype<BinaryOp::Mul>("mul", out, a, b);
    case BinaryOp::Div:
      return visit_floating_dtype(
          a.dtype(), "div", [&](auto tag) { launch<BinaryOp::Div, typename decltype(tag)::type>("div", out, a, b); });
    case BinaryOp::Remainder: return numeric<BinaryOp::Remainder>("remainder", out, a, b);
    case BinaryOp::Pow: return numeric<BinaryOp::Pow>("pow", out, a, b);
    case BinaryOp::Maximum: return any_dtype<BinaryOp::Maximum>("maximum", out, a, b);
    case BinaryOp::Minimum: return any_dtype<BinaryOp::Minimum>("minimum", out, a, b);
    case BinaryOp::GeluErfBackward:
    case BinaryOp::GeluTanhBackward:
    case BinaryOp::SiluBackward:
    case BinaryOp::ReluBackward: return binary_activation_backward(op, out, a, b);
    default: return binary_compare(op, out, a, b);
  }
}

}  // namespace kiln::cuda
