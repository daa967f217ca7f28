// CUDA kernels: CudaBackend::unary. The ops defined on every numeric dtype (neg, abs, relu, rounding,
// square, clamp), sign, and the Bool-valued predicates are here; the floating-only ops (exp, log, gelu,
// ...) are in unary_float.cu. Semantics are those of cpu/unary.cpp: relu and clamp keep NaN, sign(NaN) = 0,
// round is half to even, integers are already whole.
#include <limits>

#include "kiln/tensor/cuda/elementwise_ops.cuh"  // launch_same, m_*
#include "kiln/tensor/cuda/unary_ops.h"          // unary_floating

namespace kiln::cuda {
namespace {

template <UnaryOp kOp, typename C>
struct NumericF {
  __device__ C operator()(C x) const {
    if constexpr (kOp == UnaryOp::Neg) {
      if constexpr (std::is_integral_v<C>) return wrapping_sub(C(0), x);
      else return -x;
    } else if constexpr (kOp == UnaryOp::Abs) {
      if constexpr (std::is_floating_point_v<C>) return m_fabs(x);
      else if constexpr (std::is_unsigned_v<C>) return x;
      else return x < C(0) ? wrapping_sub(C(0), x) : x;
    } else if constexpr (kOp == UnaryOp::Relu) {
      if constexpr (std::is_unsigned_v<C>) return x;
      else return x < C(0) ? C(0) : x;  // NaN < 0 is false: NaN stays, as PyTorch
    } else if constexpr (kOp == UnaryOp::Floor || kOp == UnaryOp::Ceil || kOp == UnaryOp::Round) {
      if constexpr (std::is_floating_point_v<C>) {
        if constexpr (kOp == UnaryOp::Floor) return m_floor(x);
        else if constexpr (kOp == UnaryOp::Ceil) return m_ceil(x);
        else return m_rint(x);
      } else {
        return x;
      }
    } else if constexpr (kOp == UnaryOp::Square) {
      if constexpr (std::is_integral_v<C>) return wrapping_mul(x, x);
      else return x * x;
    } else {
      static_assert(kOp == UnaryOp::Neg, "not a numeric unary op");
    }
  }
};

// min(max(x, lo), hi) in two selects, which keep a NaN x (comparisons with NaN are false).
template <typename C>
struct ClampF {
  C lo, hi;
  bool nan_bound;  // a NaN bound makes every result NaN, as in PyTorch
  __device__ C operator()(C x) const {
    if constexpr (std::is_floating_point_v<C>) {
      if (nan_bound) return lo != lo ? lo : hi;
    }
    const C o = x < lo ? lo : x;
    return o > hi ? hi : o;
  }
};

// -1, 0 or 1; NaN gives 0 (neither NaN > 0 nor NaN < 0); Bool is its own sign.
template <typename C>
struct SignF {
  __device__ C operator()(C x) const {
    if constexpr (std::is_same_v<C, bool>) return x;
    else if constexpr (std::is_unsigned_v<C>) return x > C(0) ? C(1) : C(0);
    else return static_cast<C>(static_cast<int>(x > C(0)) - static_cast<int>(x < C(0)));
  }
};

template <UnaryOp kOp, typename C>
struct PredicateF {
  __device__ bool operator()(C x) const {
    if constexpr (kOp == UnaryOp::LogicalNot) return x == C(0);
    else if constexpr (!std::is_floating_point_v<C>) return kOp == UnaryOp::IsFinite;  // integers are finite
    else if constexpr (kOp == UnaryOp::IsNan) return x != x;
    else if constexpr (kOp == UnaryOp::IsInf)
      return x == std::numeric_limits<C>::infinity() || x == -std::numeric_limits<C>::infinity();
    else if constexpr (kOp == UnaryOp::IsFinite) return x - x == C(0);  // false for inf (inf - inf = NaN) and NaN
    else static_assert(kOp == UnaryOp::IsNan, "not a predicate");
  }
};

template <UnaryOp kOp>
void numeric(const char* name, const Tensor& out, const Tensor& a) {
  visit_numeric_dtype(a.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, bool>)
      launch_same<T>(name, out, a, NumericF<kOp, compute_t<T>>{});  // Bool: rejected
  });
}

template <UnaryOp kOp>
void predicate(const char* name, const Tensor& out, const Tensor& a) {
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise(name, Types<bool, T>{}, {out, a}, PredicateF<kOp, compute_t<T>>{});
  });
}

// A clamp bound in the compute type; integer types saturate (a missing bound is +-inf).
template <typename C>
C clamp_bound(double v) {
  if constexpr (std::is_integral_v<C>) {
    if (v != v) return C(0);  // unused: integers reject NaN bounds upstream
    if (v <= static_cast<double>(std::numeric_limits<C>::lowest())) return std::numeric_limits<C>::lowest();
    if (v >= static_cast<double>(std::numeric_limits<C>::max())) return std::numeric_limits<C>::max();
  }
  return static_cast<C>(v);
}

}  // namespace

void CudaBackend::unary(UnaryOp op, const Tensor& out, const Tensor& a, const UnaryParams& params) {
  if (out.numel() == 0) return;
  if (unary_floating(op, out, a)) return;
  switch (op) {
    case UnaryOp::Neg: return numeric<UnaryOp::Neg>("neg", out, a);
    case UnaryOp::Abs: return numeric<UnaryOp::Abs>("abs", out, a);
    case UnaryOp::Relu: return numeric<UnaryOp::Relu>("relu", out, a);
    case UnaryOp::Floor: return numeric<UnaryOp::Floor>("floor", out, a);
    case UnaryOp::Ceil: return numeric<UnaryOp::Ceil>("ceil", out, a);
    case UnaryOp::Round: return numeric<UnaryOp::Round>("round", out, a);
    case UnaryOp::Square: return numeric<UnaryOp::Square>("square", out, a);
    case UnaryOp::Clamp:
      return visit_numeric_dtype(a.dtype(), "clamp", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = compute_t<T>;
        if constexpr (!std::is_same_v<T, bool>) {  // Bool was rejected at run time
          const ClampF<C> f{clamp_bound<C>(params.a), clamp_bound<C>(params.b),
                            params.a != params.a || params.b != params.b};
          launch_same<T>("clamp", out, a, f);
        }
      });
    case UnaryOp::Sign:
      return visit_dtype(a.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        launch_same<T>("sign", out, a, SignF<compute_t<T>>{});
      });
    case UnaryOp::LogicalNot: return predicate<UnaryOp::LogicalNot>("logical_not", out, a);
    case UnaryOp::IsNan: return predicate<UnaryOp::IsNan>("isnan", out, a);
    case UnaryOp::IsInf: return predicate<UnaryOp::IsInf>("isinf", out, a);
    case UnaryOp::IsFinite: return predicate<UnaryOp::IsFinite>("isfinite", out, a);
    default: break;
  }
  KILN_FAIL("cuda::unary: '", unary_op_name(op), "' (UnaryOp ", static_cast<int>(op),
            ") has no kernel here; add its case to this switch");
}

}  // namespace kiln::cuda
