// kiln/tensor/dispatch.h — calling a template with the C++ type of a run-time DType (backend-internal).
//
//   visit_dtype(t.dtype(), [&](auto tag) { using T = typename decltype(tag)::type; ...; });
//
// visit_floating_dtype / visit_numeric_dtype restrict the set and throw a kiln::Error naming `op`
// for the rest. None of them calls f with the float8 storage types (float8.h): no kernel computes in them, and they
// throw. visit_storage_dtype adds Float8_e4m3fn and Float8_e5m2, for the kernels that only move or convert values
// (copy, fill, item).
#pragma once

#include <string_view>
#include <type_traits>

#include "kiln/tensor/dtype.h"
#include "kiln/tensor/error.h"

namespace kiln {

template <typename T>
// An empty value that carries the C++ type T to a generic lambda.
struct TypeTag {
  using type = T;  // the element type
};

template <typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Bool: return f(TypeTag<bool>{});
    case DType::UInt8: return f(TypeTag<uint8_t>{});
    case DType::Int32: return f(TypeTag<int32_t>{});
    case DType::Int64: return f(TypeTag<int64_t>{});
    case DType::Float16: return f(TypeTag<Half>{});
    case DType::BFloat16: return f(TypeTag<BFloat16>{});
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    case DType::Float8_e4m3fn:
    case DType::Float8_e5m2:
      // The frontends refuse float8 tensors naming the op (check_not_float8); this is the backstop for a kernel
      // reached without that check.
      check_not_float8("this kernel", t);
      break;
  }
  KILN_FAIL("visit_dtype: invalid dtype value ", static_cast<int>(t));
}

// Every dtype, the float8 storage types included: for kernels that only copy, convert or fill values.
template <typename F>
decltype(auto) visit_storage_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Float8_e4m3fn: return f(TypeTag<Float8_e4m3fn>{});
    case DType::Float8_e5m2: return f(TypeTag<Float8_e5m2>{});
    default: return visit_dtype(t, std::forward<F>(f));
  }
}

// Every dtype but Bool.
template <typename F>
decltype(auto) visit_numeric_dtype(DType t, std::string_view op, F&& f) {
  check_not_float8(op, t);
  KILN_CHECK_AS(NotImplementedError, t != DType::Bool, op,
                ": not supported for bool tensors; convert with .to(DType::Int64) or .to(DType::Float32) first");
  return visit_dtype(t, std::forward<F>(f));
}

template <typename F>
// Float16, BFloat16, Float32 and Float64 only; any other dtype throws NotImplementedError naming `op`.
decltype(auto) visit_floating_dtype(DType t, std::string_view op, F&& f) {
  switch (t) {
    case DType::Float16: return f(TypeTag<Half>{});
    case DType::BFloat16: return f(TypeTag<BFloat16>{});
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    case DType::Float8_e4m3fn:
    case DType::Float8_e5m2: check_not_float8(op, t); break;
    default: break;
  }
  throw NotImplementedError(detail::str_cat(op, ": expected a floating-point tensor, got ", t,
                                            "; convert it with .to(DType::Float32) first"));
}

// The dtype rule of every backend's reduce primitive: the output has the input's dtype, except sums and
// products of integers narrower than int64, which widen to int64. Calls typed.template operator()<In, Out>()
// for the pair, or throws naming `who` for any other.
template <typename F>
void visit_reduce_dtypes(std::string_view who, DType in, DType out, const F& typed) {
  visit_dtype(in, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (out == in) return typed.template operator()<T, T>();
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, int64_t>) {
      if (out == DType::Int64) return typed.template operator()<T, int64_t>();
    }
    KILN_FAIL(who, ": cannot reduce ", in, " into ", out);
  });
}

// The dtype rule of every backend's statistics reductions (Var, Std, Norm, LogSumExp: is_statistics_op, backend.h):
// one floating dtype in and out. Calls typed.template operator()<T>() for it, or throws naming `who`.
template <typename F>
void visit_stats_dtype(std::string_view who, DType in, DType out, const F& typed) {
  KILN_CHECK(out == in, who, ": var/norm/logsumexp expect one dtype, got ", in, " into ", out);
  visit_floating_dtype(in, "reduce", [&](auto tag) { typed.template operator()<typename decltype(tag)::type>(); });
}

// T with kiln's 16-bit floats replaced: Half by HalfAs, BFloat16 by BFloat16As, every other type kept. The one
// rule behind compute_t, acc_t and the CUDA backend's device_t (cuda/device_types.cuh).
template <typename T, typename HalfAs, typename BFloat16As>
using map_16bit_t =
    std::conditional_t<std::is_same_v<T, Half>, HalfAs, std::conditional_t<std::is_same_v<T, BFloat16>, BFloat16As, T>>;

// The type arithmetic on T is done in: float for Half/BFloat16, T otherwise.
template <typename T>
using compute_t = map_16bit_t<T, float, float>;

// The type reductions accumulate in: float for 16-bit floats and float, double for double, int64 for integers
// (and Bool).
template <typename T>
using acc_t = std::conditional_t<std::is_integral_v<T>, int64_t, compute_t<T>>;

}  // namespace kiln
