// CPU kernels: binary elementwise ops and where, as Eigen array expressions (see elementwise_kernels.h).
// The unary ops are in unary.cpp, the activation gradients among the binary ops in activation_backward.cpp.
#include <algorithm>  // std::min
#include <cmath>      // std::fmod, std::signbit
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/elementwise_kernels.h"  // binary_kernel, for_each_run
#include "kiln/tensor/cpu/parallel.h"             // parallel_for
#include "kiln/tensor/dispatch.h"                 // visit_numeric_dtype, compute_t

namespace kiln::cpu {
namespace {

template <typename M>
using scalar_of = typename std::decay_t<M>::Scalar;

// Same dtype in and out; `name` names the op in the error for an unsupported dtype.
template <typename F>
void same_type(std::string_view name, bool allow_bool, const Tensor& out, const Tensor& a, const Tensor& b,
               const F& f) {
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    binary_kernel<T, T>(out, a, b, f);
  };
  if (allow_bool) visit_dtype(a.dtype(), run);
  else visit_numeric_dtype(a.dtype(), name, run);
}

// Any input dtype, Bool output.
template <typename F>
void predicate(const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    binary_kernel<T, bool>(out, a, b, f);
  });
}

// Integer power by squaring, wrapping on overflow like PyTorch (unsigned arithmetic is defined to wrap).
template <typename C>
C int_pow(C base, C exponent) {
  using U = std::make_unsigned_t<C>;
  U result = 1, b = static_cast<U>(base);
  for (auto e = exponent; e != 0; e /= 2) {
    if (e % 2 != 0) result *= b;
    b *= b;
  }
  return static_cast<C>(result);
}

// Python's modulo: the result takes the divisor's sign.
template <typename C>
C python_mod(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    C r = std::fmod(a, b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  } else if constexpr (std::is_unsigned_v<C>) {
    return a % b;
  } else {
    if (b == -1) return 0;  // INT_MIN % -1 overflows in C++; the answer is 0
    C r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  }
}

void remainder(const Tensor& out, const Tensor& a, const Tensor& b) {
  const DType dtype = a.dtype();
  same_type("remainder", false, out, a, b, [dtype](auto x, auto y, auto o) {
    using C = scalar_of<decltype(x)>;
    if constexpr (std::is_integral_v<C>) {
      KILN_CHECK(!(y == C(0)).any(), "remainder: integer division by zero (a divisor in the ", dtype,
                 " tensor is 0); check the divisor, or compute in a floating dtype where x % 0 is NaN");
    }
    o = x.binaryExpr(y, [](C u, C v) { return python_mod(u, v); });
  });
}

// pow(x, y) is negative for x = -0 or -inf and y an odd integer (C's pow: -0 ** 3 = -0, -inf ** -1 = -0).
template <typename C>
C pow_sign(C x, C y, C r) {
  if (!std::signbit(x) || !(x == C(0) || std::isinf(x))) return r;
  const bool odd = std::isfinite(y) && std::floor(y) == y && std::fmod(y, C(2)) != C(0);
  return odd ? -std::abs(r) : r;
}

void power(const Tensor& out, const Tensor& a, const Tensor& b) {
  const DType dtype = a.dtype();
  same_type("pow", false, out, a, b, [dtype](auto x, auto y, auto o) {
    using C = scalar_of<decltype(x)>;
    if constexpr (std::is_same_v<C, bool>) {
      // unreachable: visit_numeric_dtype rejects Bool before this runs
    } else if constexpr (std::is_integral_v<C>) {
      if constexpr (std::is_signed_v<C>) {
        KILN_CHECK(!(y < C(0)).any(), "pow: integers to negative integer powers are not allowed (an exponent in the ",
                   dtype, " tensor is negative); convert the base to a floating dtype first");
      }
      o = x.binaryExpr(y, [](C u, C v) { return int_pow(u, v); });
    } else {
      // Eigen's vectorised pow gives +0 and +inf for a base of -0 or -inf and an odd integer exponent, where C's
      // pow (and CUDA's) give -0 and -inf; the sign is decided here, on the operands, a block at a time (o may
      // alias x or y).
      alignas(64) C r[kBlock];
      for (int64_t i = 0, n = o.size(); i < n; i += kBlock) {
        const int64_t m = std::min(kBlock, n - i);
        ArrayMap<C>(r, m) = x.segment(i, m).pow(y.segment(i, m));
        for (int64_t j = 0; j < m; ++j) o[i + j] = pow_sign(x[i + j], y[i + j], r[j]);
      }
    }
  });
}

// Maximum and minimum: NaN wins (PyTorch's maximum/minimum propagate NaN); on Bool they are or/and.
template <bool kMax>
void extremum(const Tensor& out, const Tensor& a, const Tensor& b) {
  same_type(kMax ? "maximum" : "minimum", true, out, a, b, [](auto x, auto y, auto o) {
    using C = scalar_of<decltype(x)>;
    if constexpr (std::is_same_v<C, bool>) {
      if constexpr (kMax) o = x || y;
      else o = x && y;
    } else if constexpr (std::is_floating_point_v<C>) {
      using Max = Eigen::internal::scalar_max_op<C, C, Eigen::PropagateNaN>;
      using Min = Eigen::internal::scalar_min_op<C, C, Eigen::PropagateNaN>;
      if constexpr (kMax) o = x.binaryExpr(y, Max());
      else o = x.binaryExpr(y, Min());
    } else {
      if constexpr (kMax) o = x.max(y);
      else o = x.min(y);
    }
  });
}

// out = cond ? a : b on elements of `Bits` width (the dtype does not matter, only its size).
template <typename Bits>
void select_run(char* const* p, const int64_t* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const bool c = *reinterpret_cast<const bool*>(p[1] + i * s[1]);
    *reinterpret_cast<Bits*>(p[0] + i * s[0]) = *reinterpret_cast<const Bits*>(p[c ? 2 : 3] + i * s[c ? 2 : 3]);
  }
}

}  // namespace

void CpuBackend::binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  switch (op) {
    case BinaryOp::Add:  // on Bool: or, as PyTorch (True + True = True)
      return same_type("add", true, out, a, b, [](auto x, auto y, auto o) {
        if constexpr (std::is_same_v<scalar_of<decltype(x)>, bool>) o = x || y;
        else o = x + y;
      });
    case BinaryOp::Sub: return same_type("sub", false, out, a, b, [](auto x, auto y, auto o) { o = x - y; });
    case BinaryOp::Mul:  // on Bool: and
      return same_type("mul", true, out, a, b, [](auto x, auto y, auto o) {
        if constexpr (std::is_same_v<scalar_of<decltype(x)>, bool>) o = x && y;
        else o = x * y;
      });
    case BinaryOp::Div:
      return visit_floating_dtype(a.dtype(), "div", [&](auto tag) {
        using T = typename decltype(tag)::type;
        binary_kernel<T, T>(out, a, b, [](auto x, auto y, auto o) { o = x / y; });
      });
    case BinaryOp::Remainder: return remainder(out, a, b);
    case BinaryOp::Pow: return power(out, a, b);
    case BinaryOp::Maximum: return extremum<true>(out, a, b);
    case BinaryOp::Minimum: return extremum<false>(out, a, b);
    case BinaryOp::Eq: return predicate(out, a, b, [](auto x, auto y, auto o) { o = x == y; });
    case BinaryOp::Ne: return predicate(out, a, b, [](auto x, auto y, auto o) { o = x != y; });
    case BinaryOp::Lt: return predicate(out, a, b, [](auto x, auto y, auto o) { o = x < y; });
    case BinaryOp::Le: return predicate(out, a, b, [](auto x, auto y, auto o) { o = x <= y; });
    case BinaryOp::Gt: return predicate(out, a, b, [](auto x, auto y, auto o) { o = x > y; });
    case BinaryOp::Ge: return predicate(out, a, b, [](auto x, auto y, auto o) { o = x >= y; });
    case BinaryOp::LogicalAnd:
      return predicate(out, a, b, [](auto x, auto y, auto o) {
        using C = scalar_of<decltype(x)>;
        o = (x != C(0)) && (y != C(0));
      });
    case BinaryOp::LogicalOr:
      return predicate(out, a, b, [](auto x, auto y, auto o) {
        using C = scalar_of<decltype(x)>;
        o = (x != C(0)) || (y != C(0));
      });
    case BinaryOp::LogicalXor:
      return predicate(out, a, b, [](auto x, auto y, auto o) {
        using C = scalar_of<decltype(x)>;
        o = (x != C(0)) != (y != C(0));
      });
    case BinaryOp::GeluErfBackward:
    case BinaryOp::GeluTanhBackward:
    case BinaryOp::SiluBackward:
    case BinaryOp::ReluBackward: return activation_backward(op, out, a, b);
  }
  KILN_FAIL("cpu::binary: unknown op ", static_cast<int>(op));
}

void CpuBackend::where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  switch (out.element_size()) {
    case 1: return for_each_run<4>({out, cond, a, b}, select_run<uint8_t>);
    case 2: return for_each_run<4>({out, cond, a, b}, select_run<uint16_t>);
    case 4: return for_each_run<4>({out, cond, a, b}, select_run<uint32_t>);
    case 8: return for_each_run<4>({out, cond, a, b}, select_run<uint64_t>);
  }
  KILN_FAIL("cpu::where: unexpected element size ", out.element_size());
}

void CpuBackend::add_n(const Tensor& out, const std::vector<Tensor>& inputs) {
  const int64_t n = out.numel();
  visit_numeric_dtype(out.dtype(), "add_n", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    std::vector<const T*> in;
    in.reserve(inputs.size());
    for (const Tensor& t : inputs) in.push_back(t.data_ptr<T>());
    T* o = out.data_ptr<T>();
    constexpr int64_t kGrain = 32768;
    parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        C sum = static_cast<C>(in[0][i]);
        for (size_t k = 1; k < in.size(); ++k) sum += static_cast<C>(in[k][i]);
        o[i] = static_cast<T>(sum);
      }
    });
  });
}

void CpuBackend::mul_backward(const Tensor& ga, const Tensor& gb, const Tensor& g, const Tensor& a, const Tensor& b) {
  visit_floating_dtype(g.dtype(), "mul_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const T *pg = g.data_ptr<T>(), *pa = a.data_ptr<T>(), *pb = b.data_ptr<T>();
    T *pga = ga.data_ptr<T>(), *pgb = gb.data_ptr<T>();
    constexpr int64_t kGrain = 32768;
    parallel_for(0, g.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const C gi = static_cast<C>(pg[i]);
        pga[i] = static_cast<T>(gi * static_cast<C>(pb[i]));
        pgb[i] = static_cast<T>(gi * static_cast<C>(pa[i]));
      }
    });
  });
}

}  // namespace kiln::cpu
