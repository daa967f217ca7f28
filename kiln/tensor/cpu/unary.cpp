// CPU kernels: unary elementwise ops, as Eigen array expressions (see elementwise_kernels.h).
#include <algorithm>  // std::min
#include <cmath>      // std::isnan
#include <cstdint>
#include <limits>  // std::numeric_limits
#include <string_view>

#include "kiln/tensor/activation_constants.h"  // GELU's constants
#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/elementwise_kernels.h"  // unary_kernel, ArrayMap, kBlock
#include "kiln/tensor/cpu/special_math.h"         // exp_n, tanh_n, ...: the transcendental functions and their edges
#include "kiln/tensor/special_values.h"           // special::activation_finish

namespace kiln::cpu {

using activation::kCubic;
using activation::kSqrt2OverPi;
using activation::kSqrtHalf;

namespace {

// The scalar type of a mapped Eigen array (what a functor computes in).
template <typename M>
using scalar_of = typename std::decay_t<M>::Scalar;

template <typename F>
void floating(std::string_view name, const Tensor& out, const Tensor& a, const F& f) {
  visit_floating_dtype(a.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    unary_kernel<T, T>(out, a, f);
  });
}

template <typename F>
void numeric(std::string_view name, const Tensor& out, const Tensor& a, const F& f) {
  visit_numeric_dtype(a.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    unary_kernel<T, T>(out, a, f);
  });
}

// Any input dtype, Bool output.
template <typename F>
void predicate(const Tensor& out, const Tensor& a, const F& f) {
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    unary_kernel<T, bool>(out, a, f);
  });
}

// A clamp bound in the compute type; integer types saturate (a missing bound is +-inf).
template <typename C>
C clamp_bound(double v) {
  if constexpr (std::is_integral_v<C>) {
    if (v <= static_cast<double>(std::numeric_limits<C>::lowest())) return std::numeric_limits<C>::lowest();
    if (v >= static_cast<double>(std::numeric_limits<C>::max())) return std::numeric_limits<C>::max();
  }
  return static_cast<C>(v);
}

// y = f(x) for an activation whose formula is x times a factor that tends to 0 at -inf (gelu, silu), kBlock
// elements at a time through a buffer; special::activation_finish gives -0 at -inf, where the formula gives
// -inf * 0 = NaN. o may alias x. f(ConstArrayMap<C> x, ArrayMap<C> y) fills y.
template <typename C, typename F>
void activation_n(const C* x, C* o, int64_t n, const F& f) {
  alignas(64) C y[kBlock];
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t m = std::min(kBlock, n - i);
    f(ConstArrayMap<C>(x + i, m), ArrayMap<C>(y, m));
    for (int64_t j = 0; j < m; ++j) o[i + j] = special::activation_finish(x[i + j], y[j]);
  }
}

}  // namespace

void CpuBackend::unary(UnaryOp op, const Tensor& out, const Tensor& a, const UnaryParams& params) {
  if (out.numel() == 0) return;
  switch (op) {
    case UnaryOp::Neg: return numeric("neg", out, a, [](auto x, auto o) { o = -x; });
    case UnaryOp::Abs: return numeric("abs", out, a, [](auto x, auto o) { o = x.abs(); });
    // The transcendental functions: Eigen's vectorised versions inside their accurate range, every edge (NaN,
    // ±inf, ±0, subnormals, saturation) by special_values.h, as on CUDA (special_math.h).
    case UnaryOp::Exp: return floating("exp", out, a, [](auto x, auto o) { exp_n(x.data(), o.data(), x.size()); });
    case UnaryOp::Expm1:
      return floating("expm1", out, a, [](auto x, auto o) { expm1_n(x.data(), o.data(), x.size()); });
    case UnaryOp::Log: return floating("log", out, a, [](auto x, auto o) { log_n(x.data(), o.data(), x.size()); });
    case UnaryOp::Log1p:
      return floating("log1p", out, a, [](auto x, auto o) { log1p_n(x.data(), o.data(), x.size()); });
    case UnaryOp::Log2: return floating("log2", out, a, [](auto x, auto o) { log2_n(x.data(), o.data(), x.size()); });
    // Correctly rounded (IEEE sqrt; EIGEN_FAST_MATH is off for kiln_tensor, see its CMakeLists.txt), and rsqrt
    // as 1 / sqrt(x), two correctly rounded steps, so no rsqrt approximation instruction decides the result.
    case UnaryOp::Sqrt: return floating("sqrt", out, a, [](auto x, auto o) { o = x.sqrt(); });
    case UnaryOp::Rsqrt: return floating("rsqrt", out, a, [](auto x, auto o) { o = x.sqrt().inverse(); });
    case UnaryOp::Sin: return floating("sin", out, a, [](auto x, auto o) { o = x.sin(); });
    case UnaryOp::Cos: return floating("cos", out, a, [](auto x, auto o) { o = x.cos(); });
    case UnaryOp::Tanh: return floating("tanh", out, a, [](auto x, auto o) { tanh_n(x.data(), o.data(), x.size()); });
    case UnaryOp::Erf: return floating("erf", out, a, [](auto x, auto o) { erf_n(x.data(), o.data(), x.size()); });
    case UnaryOp::Sigmoid:
      return floating("sigmoid", out, a, [](auto x, auto o) { sigmoid_n(x.data(), o.data(), x.size()); });
    case UnaryOp::Silu:  // x sigmoid(x)
      return floating("silu", out, a, [](auto x, auto o) {
        activation_n(x.data(), o.data(), x.size(), [](auto xb, auto y) {
          sigmoid_n(xb.data(), y.data(), xb.size());
          y = xb * y;
        });
      });
    case UnaryOp::GeluErf:  // x/2 (1 + erf(x/sqrt(2))); float: x Phi(x), Phi from its tail (special_math.h)
      return floating("gelu", out, a, [](auto x, auto o) {
        activation_n(x.data(), o.data(), x.size(), [](auto xb, auto y) {
          using C = scalar_of<decltype(xb)>;
          if constexpr (std::is_same_v<C, float>) {
            alignas(64) float e[kBlock];
            normal_cdf_n(xb.data(), y.data(), e, xb.size());  // y = Phi(x)
            y *= xb;
          } else {
            y = xb * C(kSqrtHalf);
            erf_n(y.data(), y.data(), y.size());
            y = xb * C(0.5) * (C(1) + y);
          }
        });
      });
    case UnaryOp::GeluTanh:  // x/2 (1 + tanh(sqrt(2/pi) (x + c x^3)))
      return floating("gelu", out, a, [](auto x, auto o) {
        activation_n(x.data(), o.data(), x.size(), [](auto xb, auto y) {
          using C = scalar_of<decltype(xb)>;
          y = C(kSqrt2OverPi) * (xb + C(kCubic) * xb.cube());
          tanh_n(y.data(), y.data(), y.size());
          y = C(0.5) * xb * (C(1) + y);
        });
      });
    case UnaryOp::Relu:
      // select keeps NaN (NaN < 0 is false), as PyTorch's relu does.
      return numeric("relu", out, a, [](auto x, auto o) {
        using C = scalar_of<decltype(x)>;
        o = (x < C(0)).select(C(0), x);
      });
    case UnaryOp::Sign:
      // NaN gives 0, as PyTorch's sign does (neither NaN > 0 nor NaN < 0). Bool is its own sign.
      return visit_dtype(a.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        unary_kernel<T, T>(out, a, [](auto x, auto o) {
          using C = scalar_of<decltype(x)>;
          if constexpr (std::is_same_v<C, bool>) {
            o = x;
          } else {
            o = (x > C(0)).template cast<C>() - (x < C(0)).template cast<C>();
          }
        });
      });
    case UnaryOp::Floor:
    case UnaryOp::Ceil:
    case UnaryOp::Round:
      // Integers are already whole: a copy, as in PyTorch. Round is half to even (rint).
      return numeric(op == UnaryOp::Floor  ? "floor"
                     : op == UnaryOp::Ceil ? "ceil"
                                           : "round",
                     out, a, [op](auto x, auto o) {
                       using C = scalar_of<decltype(x)>;
                       if constexpr (std::is_floating_point_v<C>) {
                         if (op == UnaryOp::Floor) o = x.floor();
                         else if (op == UnaryOp::Ceil) o = x.ceil();
                         else o = x.rint();
                       } else {
                         o = x;
                       }
                     });
    case UnaryOp::Square: return numeric("square", out, a, [](auto x, auto o) { o = x.square(); });
    case UnaryOp::Reciprocal: return floating("reciprocal", out, a, [](auto x, auto o) { o = x.inverse(); });
    case UnaryOp::Clamp:
      return numeric("clamp", out, a, [&params](auto x, auto o) {
        using C = scalar_of<decltype(x)>;
        const C lo = clamp_bound<C>(params.a), hi = clamp_bound<C>(params.b);
        if constexpr (std::is_floating_point_v<C>) {
          if (std::isnan(lo) || std::isnan(hi)) {  // a NaN bound makes every result NaN, as in PyTorch
            o.setConstant(std::numeric_limits<C>::quiet_NaN());
            return;
          }
        }
        // min(max(x, lo), hi) in two selects, which keep a NaN x (comparisons with NaN are false).
        o = (x < lo).select(lo, x);
        o = (o > hi).select(hi, o);
      });
    case UnaryOp::LogicalNot: return predicate(out, a, [](auto x, auto o) { o = x == scalar_of<decltype(x)>(0); });
    case UnaryOp::IsNan:
      return predicate(out, a, [](auto x, auto o) {
        if constexpr (std::is_floating_point_v<scalar_of<decltype(x)>>) o = x.isNaN();
        else o.setConstant(false);
      });
    case UnaryOp::IsInf:
      return predicate(out, a, [](auto x, auto o) {
        if constexpr (std::is_floating_point_v<scalar_of<decltype(x)>>) o = x.isInf();
        else o.setConstant(false);
      });
    case UnaryOp::IsFinite:
      return predicate(out, a, [](auto x, auto o) {
        if constexpr (std::is_floating_point_v<scalar_of<decltype(x)>>) o = x.isFinite();
        else o.setConstant(true);
      });
  }
  KILN_FAIL("cpu::unary: '", unary_op_name(op), "' (UnaryOp ", static_cast<int>(op),
            ") has no kernel here; add its case to this switch");
}

}  // namespace kiln::cpu
