// kiln/tensor/unary_ops.h — the unary elementwise ops, each declared once, in a table.
//
// Everything else about these ops comes from the rows below (X-macros), so adding one is one row here, its CPU
// kernel (tensor/cpu/unary.cpp), its CUDA kernel (tensor/cuda/unary_float.cu or unary.cu) and nothing more:
//   - the backend contract's UnaryOp value (backend.h);
//   - the raw op internal::name and its in-place form internal::name_ (ops.h, ops/unary.cpp), with the dtype rule;
//   - the differentiable kiln::name and kiln::name_ (autograd/functions.h, autograd/ops/unary.cpp), with the
//     derivative below, and Tensor::name() and Tensor::name_() (tensor.h);
//   - the autocast policy (autograd/autocast.h);
//   - the profiler's range name (trace_backend.cpp);
//   - the conformance tests: every backend's kernel against the float64 reference below, in every floating
//     dtype (tests/tensor/test_elementwise.cpp), and gradcheck of the derivative on the domain below, on the
//     CPU and on the GPU (tests/autograd/test_grad_unary.cpp).
//
// KILN_UNARY_OPS(X) calls X(Enum, name, result, autocast, save, derivative, reference, domain, bool_advice):
//   Enum        the UnaryOp value, and autocast::Op's
//   name        the function: internal::name, kiln::name, Tensor::name(), the _ forms, the profiler's name
//   result      Same: the input's dtype (integers allowed); Float: floating inputs keep their dtype, integers
//               give kDefaultFloat
//   autocast    the dtype policy inside an autocast region: Keep or Float32 (autograd/autocast.h)
//   save        what the derivative reads: Nothing, Input (x) or Result (y); an in-place form saves a copy of
//               the input before it writes when the derivative needs x
//   derivative  the gradient of the input, from g (the incoming gradient), x (the input) and y (the result),
//               written with the raw ops of namespace kiln::internal
//   reference   f(v) in double for one double v: what every kernel is compared with
//   domain      where gradcheck samples x: All, Positive (log, sqrt), AboveMinusOne (log1p), or Smooth (away
//               from the points where the function jumps or kinks: 0 and the multiples of 1/2)
//   bool_advice nullptr when a Bool input is taken as numbers (exp(true) = e), else the end of the error message
//               that refuses it
//
// KILN_UNARY_PREDICATES(X) calls X(Enum, name, reference): Bool results, no gradient, any input dtype.
// KILN_UNARY_OTHER(X) calls X(Enum, name): UnaryOp values whose functions take more than a tensor (gelu's
// approximation, clamp's bounds) or have a dtype rule of their own (square); they are written by hand, and the
// table gives them their enum value and profiler name only.
#pragma once

// clang-format off
#define KILN_UNARY_OPS(X)                                                                                                           \
  X(Neg,        neg,        Same,  Keep,    Nothing, internal::neg(g),                                                              \
    -v,                                              All,           "; negation, the - operator, on a bool tensor: "                \
                                                                    "use logical_not() or the ~ operator")                          \
  X(Abs,        abs,        Same,  Keep,    Input,   internal::mul(g, internal::sign(x)),                                           \
    std::fabs(v),                                    Smooth,        "; convert it with .to(DType::Int64) first")                    \
  X(Exp,        exp,        Float, Float32, Result,  internal::mul(g, y),                                                           \
    std::exp(v),                                     All,           nullptr)                                                        \
  X(Expm1,      expm1,      Float, Float32, Result,  internal::mul(g, internal::add(y, 1.0)),                                       \
    std::expm1(v),                                   All,           nullptr)                                                        \
  X(Log,        log,        Float, Float32, Input,   internal::div(g, x),                                                           \
    std::log(v),                                     Positive,      nullptr)                                                        \
  X(Log1p,      log1p,      Float, Float32, Input,   internal::div(g, internal::add(x, 1.0)),                                       \
    std::log1p(v),                                   AboveMinusOne, nullptr)                                                        \
  X(Log2,       log2,       Float, Float32, Input,   internal::div(g, internal::mul(x, 0.69314718055994530942)),                    \
    std::log2(v),                                    Positive,      nullptr)                                                        \
  X(Sqrt,       sqrt,       Float, Keep,    Result,  internal::div(g, internal::mul(y, 2.0)),                                       \
    std::sqrt(v),                                    Positive,      nullptr)                                                        \
  X(Rsqrt,      rsqrt,      Float, Float32, Result,  internal::mul(g, internal::mul(internal::mul(internal::square(y), y), -0.5)),  \
    1.0 / std::sqrt(v),                              Positive,      nullptr)                                                        \
  X(Sin,        sin,        Float, Keep,    Input,   internal::mul(g, internal::cos(x)),                                            \
    std::sin(v),                                     All,           nullptr)                                                        \
  X(Cos,        cos,        Float, Keep,    Input,   internal::neg(internal::mul(g, internal::sin(x))),                             \
    std::cos(v),                                     All,           nullptr)                                                        \
  X(Tanh,       tanh,       Float, Keep,    Result,  internal::mul(g, internal::rsub(internal::square(y), 1.0)),                    \
    std::tanh(v),                                    All,           nullptr)                                                        \
  X(Erf,        erf,        Float, Keep,    Input,                                                                                  \
    internal::mul(g, internal::mul(internal::exp(internal::neg(internal::square(x))), 1.12837916709551257390)),  /* 2 / sqrt(pi) */ \
    std::erf(v),                                     All,           nullptr)                                                        \
  X(Sigmoid,    sigmoid,    Float, Keep,    Result,  internal::mul(g, internal::mul(y, internal::rsub(y, 1.0))),                    \
    1.0 / (1.0 + std::exp(-v)),                      All,           nullptr)                                                        \
  X(Relu,       relu,       Same,  Keep,    Result,  internal::relu_backward(g, y),                                                 \
    v > 0 ? v : 0.0,                                 Smooth,        "; convert it with .to(DType::Float32) first")                  \
  X(Silu,       silu,       Float, Keep,    Input,   internal::silu_backward(g, x),                                                 \
    v / (1.0 + std::exp(-v)),                        All,           nullptr)                                                        \
  X(Sign,       sign,       Same,  Keep,    Nothing, internal::zeros_like(g),                                                       \
    v > 0 ? 1.0 : v < 0 ? -1.0 : 0.0,                Smooth,        nullptr)                                                        \
  X(Floor,      floor,      Same,  Keep,    Nothing, internal::zeros_like(g),                                                       \
    std::floor(v),                                   Smooth,        nullptr)                                                        \
  X(Ceil,       ceil,       Same,  Keep,    Nothing, internal::zeros_like(g),                                                       \
    std::ceil(v),                                    Smooth,        nullptr)                                                        \
  X(Round,      round,      Same,  Keep,    Nothing, internal::zeros_like(g),  /* half to even */                                   \
    std::nearbyint(v),                               Smooth,        nullptr)                                                        \
  X(Reciprocal, reciprocal, Float, Float32, Result,  internal::neg(internal::mul(g, internal::square(y))),                          \
    1.0 / v,                                         Smooth,        nullptr)

#define KILN_UNARY_PREDICATES(X)                                                                                                    \
  X(LogicalNot, logical_not, v == 0 ? 1.0 : 0.0)                                                                                    \
  X(IsNan,      isnan,       std::isnan(v) ? 1.0 : 0.0)                                                                             \
  X(IsInf,      isinf,       std::isinf(v) ? 1.0 : 0.0)                                                                             \
  X(IsFinite,   isfinite,    std::isfinite(v) ? 1.0 : 0.0)

#define KILN_UNARY_OTHER(X)                                                                                                         \
  X(GeluErf,  gelu)       /* x * Φ(x) */                                                                                            \
  X(GeluTanh, gelu_tanh)  /* 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))) */                                                          \
  X(Square,   square)     /* a Bool input is squared as int64, as pow(x, 2) */                                                      \
  X(Clamp,    clamp)      /* min(max(x, params.a), params.b); a = -inf or b = +inf when absent; NaN stays NaN */
// clang-format on

// Every function of the unary ops, declared alike in kiln::internal (internal_ops.h) and kiln (autograd/functions.h,
// differentiable there): name(a) and name_(a) of the table's rows, and those written by hand beside it. Floating
// inputs keep their dtype; integer inputs to floating functions (exp, sqrt, sigmoid, ...) give kDefaultFloat. The
// in-place forms write into `a`; the result's dtype must be castable to a's (float into int is an error).
#define KILN_UNARY_DECLARE_ROW(Enum, name, ...) \
  Tensor name(const Tensor& a);                 \
  Tensor& name##_(Tensor& a);
#define KILN_UNARY_DECLARE_ALL()                                                       \
  KILN_UNARY_OPS(KILN_UNARY_DECLARE_ROW)                                               \
  Tensor gelu(const Tensor& a, bool tanh_approximation = false);                       \
  Tensor square(const Tensor& a);                                                      \
  Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max); \
  Tensor& clamp_(Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max);
