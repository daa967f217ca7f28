// kiln/tensor/binary_ops.h — the binary elementwise ops, each declared once, in a table.
//
// Everything else about these ops comes from the rows below (X-macros), so adding one is one row here, its CPU
// kernel (a case of CpuBackend::binary, tensor/cpu/elementwise.cpp), its CUDA kernel (CudaBackend::binary,
// tensor/cuda/binary.cu, or binary_compare in compare.cu) and nothing more:
//   - the backend contract's BinaryOp value (backend.h) and its name, binary_op_name(), which the profiler's
//     ranges and the trace print (backend.cpp, trace_backend.cpp);
//   - the raw ops internal::name(a, b), with the dtype rule, and the scalar and in-place forms the row's `forms`
//     column names (internal_ops.h, ops/elementwise.cpp);
//   - the differentiable kiln::name(a, b) and, for the in-place forms, kiln::name_(a, b), recorded with a
//     BinaryBackward node named "<Enum>Backward" whose formulas are the row's derivatives (autograd/functions.h,
//     autograd/ops/binary.cpp, inplace.cpp); Tensor::name(other) and Tensor::name_(other) (tensor.h);
//   - the autocast policy (autograd/autocast.h);
//   - the conformance tests: every backend's kernel against the float64 reference below, in every floating
//     dtype, with broadcasting, and what a bool input gives (tests/tensor/test_binary_table.cpp); gradcheck of
//     both derivatives on the domain below, with broadcasting, on the CPU and on the GPU, and every row's
//     autocast dtype (tests/autograd/test_binary_table_grad.cpp).
//
// KILN_BINARY_OPS(X) calls
//   X(Enum, name, result, autocast, forms, grad_a, reads_a, grad_b, reads_b, both, reference, domain, on_bool):
//   Enum      the BinaryOp value, and autocast::Op's
//   name      the function: internal::name, kiln::name, Tensor::name(other), the _ forms, the profiler's name
//   result    Same: the promoted dtype (PyTorch's result_type of a and b; integers allowed); Float: true division,
//             the promoted dtype if floating, else kDefaultFloat
//   autocast  the dtype policy inside an autocast region: Keep or Float32 (autograd/autocast.h)
//   forms     what the table generates besides name(a, b): Plain, nothing more; Scalar, name(a, Scalar) and the
//             in-place name_(a, b), name_(a, Scalar); Alpha, as Scalar with a third argument alpha on the two
//             tensor forms, a + alpha * b (its gradient for b is grad_b times alpha)
//   grad_a    the gradient of a, from g (the incoming gradient, in the broadcast shape), a, b and y (the result),
//             written with the raw ops of namespace kiln::internal; the engine sums it to a's shape (broadcast
//             dims) and casts it to a's dtype, as for every op
//   reads_a   which of a, b and y grad_a reads: None, A, B, AB, Y, AY, BY, ABY; the node saves a tensor only when
//             a gradient that reads it is needed (an in-place form copies a before it writes, when needed)
//   grad_b    the gradient of b, likewise
//   reads_b   which of a, b and y grad_b reads
//   both      nullptr, or a raw op (g, a, b) -> {grad_a, grad_b} that gives both in one pass, used when both
//             inputs need a gradient (mul: internal::mul_backward, one kernel on a GPU)
//   reference f(u, v) in double for doubles u, v: what every kernel is compared with
//   domain    where gradcheck samples a and b: All ([-1, 1] each), NonzeroDivisor (|b| in [0.5, 2], both signs),
//             PositiveBase (a in [0.5, 2], b in [-2, 2]), or WithinDivisor (0.1 <= |a| <= 0.9 < 1.1 <= |b|, all
//             four sign pairs, so that a / b stays strictly between two integers and remainder does not jump)
//   on_bool   what two bool tensors give: Or, And (Add and Maximum are or, Mul and Minimum and), Numbers (taken as 0
//             and 1, with the dtype rule: true / false is inf in kDefaultFloat), or Refused (kiln::Error naming the
//             op). Integer inputs compute in the promoted integer dtype: Sub and Add wrap, Remainder is Python's %
//             (the divisor's sign) and Pow wraps like multiplication; a zero divisor or a negative exponent throws
//             on the CPU (backend.h says what CUDA does)
//
// KILN_BINARY_PREDICATES(X) calls X(Enum, name, forms, autocast, reference, on_bool): Bool results computed in the
// promoted dtype, no gradient (kiln::name is the raw op behind autocast), any input dtype; forms is Scalar (the
// comparisons, which also take a number) or Plain; reference gives 1.0 for true and 0.0 for false.
//
// KILN_BINARY_OTHER(X) calls X(Enum, name): BinaryOp values that are not ops of their own but fused gradients of
// the activations (one pass each); internal::gelu_backward etc. are written by hand, and the table gives them
// their enum value and profiler name only.
//
// Written by hand beside the table (each calls the row's raw op, so it shares the row's kernel, dtype rule and
// name): rsub(a, s) = s - a; div(s, b); pow(a, Scalar), which refuses integers to negative integer powers and
// takes x ** 2 as square(x); pow(s, b). Their kiln:: forms, and kiln::name(a, Scalar) and name_(a, Scalar) of
// the Scalar and Alpha rows, record nodes of their own (autograd/ops/binary.cpp, inplace.cpp): the number has no
// gradient and nothing of it needs saving, and the nodes keep the gradient in the tensor's dtype exactly as the
// forward computed it (a / s, not a * (1 / s)).
#pragma once

// clang-format off
#define KILN_BINARY_OPS(X)                                                                                           \
  X(Add,       add,       Same,  Keep,    Alpha,                                                                     \
    g,                                                                                None,                          \
    g,                                                                                None,                          \
    nullptr,               u + v,                                   All,            Or)                              \
  X(Sub,       sub,       Same,  Keep,    Alpha,                                                                     \
    g,                                                                                None,                          \
    internal::neg(g),                                                                 None,                          \
    nullptr,               u - v,                                   All,            Refused)                         \
  X(Mul,       mul,       Same,  Keep,    Scalar,                                                                    \
    internal::mul(g, b),                                                              B,                             \
    internal::mul(g, a),                                                              A,                             \
    internal::mul_backward, u * v,                                  All,            And)                             \
  X(Div,       div,       Float, Keep,    Scalar,                                                                    \
    internal::div(g, b),                                                              B,                             \
    internal::neg(internal::div(internal::mul(g, a), internal::mul(b, b))),           AB,                            \
    nullptr,               u / v,                                   NonzeroDivisor, Numbers)                         \
  X(Remainder, remainder, Same,  Keep,    Plain,  /* a - floor(a / b) * b */                                         \
    g,                                                                                None,                          \
    internal::neg(internal::mul(g, internal::floor(internal::div(a, b)))),            AB,                            \
    nullptr,                                                                                                         \
    std::fmod(u, v) != 0 && (std::fmod(u, v) < 0) != (v < 0) ? std::fmod(u, v) + v : std::fmod(u, v),                \
                                                                    WithinDivisor,  Refused)                         \
  X(Pow,       pow,       Same,  Float32, Plain,  /* 0 where b == 0; 0 where a == 0 and b >= 0, as in PyTorch */     \
    internal::where(internal::eq(b, 0.0), 0.0, internal::mul(g, internal::mul(b, internal::pow(a, internal::sub(b, 1.0))))), \
                                                                                      AB,                            \
    internal::where(internal::logical_and(internal::eq(a, 0.0), internal::ge(b, 0.0)), 0.0,                          \
                    internal::mul(g, internal::mul(y, internal::log(a)))),            ABY,                           \
    nullptr,               std::pow(u, v),                          PositiveBase,   Refused)                         \
  X(Maximum,   maximum,   Same,  Keep,    Plain,  /* ties split half and half; a NaN gives its gradient to b */      \
    internal::where(internal::gt(a, b), g, internal::where(internal::eq(a, b), internal::mul(g, 0.5), 0.0)),         \
                                                                                      AB,                            \
    internal::where(internal::gt(a, b), 0.0, internal::where(internal::eq(a, b), internal::mul(g, 0.5), g)),         \
                                                                                      AB,                            \
    nullptr,               u != u || v != v ? u + v : u < v ? v : u, All,           Or)                              \
  X(Minimum,   minimum,   Same,  Keep,    Plain,                                                                     \
    internal::where(internal::lt(a, b), g, internal::where(internal::eq(a, b), internal::mul(g, 0.5), 0.0)),         \
                                                                                      AB,                            \
    internal::where(internal::lt(a, b), 0.0, internal::where(internal::eq(a, b), internal::mul(g, 0.5), g)),         \
                                                                                      AB,                            \
    nullptr,               u != u || v != v ? u + v : v < u ? v : u, All,           And)

#define KILN_BINARY_PREDICATES(X)                                                                                    \
  X(Eq,         eq,          Scalar, Keep, u == v ? 1.0 : 0.0,                          Numbers)                     \
  X(Ne,         ne,          Scalar, Keep, u != v ? 1.0 : 0.0,                          Numbers)                     \
  X(Lt,         lt,          Scalar, Keep, u < v ? 1.0 : 0.0,                           Numbers)                     \
  X(Le,         le,          Scalar, Keep, u <= v ? 1.0 : 0.0,                          Numbers)                     \
  X(Gt,         gt,          Scalar, Keep, u > v ? 1.0 : 0.0,                           Numbers)                     \
  X(Ge,         ge,          Scalar, Keep, u >= v ? 1.0 : 0.0,                          Numbers)                     \
  X(LogicalAnd, logical_and, Plain,  Keep, (u != 0) && (v != 0) ? 1.0 : 0.0,            Numbers)                     \
  X(LogicalOr,  logical_or,  Plain,  Keep, (u != 0) || (v != 0) ? 1.0 : 0.0,            Numbers)                     \
  X(LogicalXor, logical_xor, Plain,  Keep, (u != 0) != (v != 0) ? 1.0 : 0.0,            Numbers)

// The gradients of the activations, one pass each: out = a * f'(b), with a the incoming gradient and b the
// activation's input (ReluBackward: its result). Floating dtypes only; computed in compute_t, rounded once.
// Where the derivative is inf * 0 (x = +-inf, and the tanh form's x^2 overflowing) the result is NaN, as in
// PyTorch; a NaN input gives NaN.
#define KILN_BINARY_OTHER(X)                                                                                         \
  X(GeluErfBackward,  gelu_backward)       /* a * (Φ(b) + b φ(b)), Φ the normal CDF, φ its density */                 \
  X(GeluTanhBackward, gelu_tanh_backward)  /* a * d/db [0.5 b (1 + tanh(√(2/π) (b + 0.044715 b³)))] */               \
  X(SiluBackward,     silu_backward)       /* a * s (1 + b (1 - s)), s = sigmoid(b) */                               \
  X(ReluBackward,     relu_backward)       /* b > 0 ? a : 0 (0 at b = 0 and for a NaN b) */
// clang-format on

// The functions a row declares, by its `forms` column (internal_ops.h and autograd/functions.h declare the same).
#define KILN_BINARY_DECLARE(name, forms) KILN_BINARY_DECLARE_##forms(name)
#define KILN_BINARY_DECLARE_Plain(name) Tensor name(const Tensor& a, const Tensor& b);
#define KILN_BINARY_DECLARE_Scalar(name)         \
  Tensor name(const Tensor& a, const Tensor& b); \
  Tensor name(const Tensor& a, Scalar b);        \
  Tensor& name##_(Tensor& a, const Tensor& b);   \
  Tensor& name##_(Tensor& a, Scalar b);
#define KILN_BINARY_DECLARE_Alpha(name)                                                               \
  Tensor name(const Tensor& a, const Tensor& b, Scalar alpha = 1); /* a + alpha * b, a - alpha * b */ \
  Tensor name(const Tensor& a, Scalar b);                                                             \
  Tensor& name##_(Tensor& a, const Tensor& b, Scalar alpha = 1);                                      \
  Tensor& name##_(Tensor& a, Scalar b);
// A predicate's: name(a, b), and name(a, Scalar) for the Scalar ones (no in-place form: the result is Bool).
#define KILN_BINARY_DECLARE_PREDICATE(name, forms) KILN_BINARY_DECLARE_PREDICATE_##forms(name)
#define KILN_BINARY_DECLARE_PREDICATE_Plain(name) Tensor name(const Tensor& a, const Tensor& b);
#define KILN_BINARY_DECLARE_PREDICATE_Scalar(name) \
  Tensor name(const Tensor& a, const Tensor& b);   \
  Tensor name(const Tensor& a, Scalar b);
// Every function of the binary ops: the table's rows, and those written by hand beside it (they do not fit its
// forms). internal_ops.h declares them in kiln::internal, autograd/functions.h in kiln (differentiable there).
#define KILN_BINARY_DECLARE_ROW(Enum, name, result, autocast, forms, ...) KILN_BINARY_DECLARE(name, forms)
#define KILN_BINARY_DECLARE_PREDICATE_ROW(Enum, name, forms, ...) KILN_BINARY_DECLARE_PREDICATE(name, forms)
#define KILN_BINARY_DECLARE_ALL()                                                                         \
  KILN_BINARY_OPS(KILN_BINARY_DECLARE_ROW)                                                                \
  KILN_BINARY_PREDICATES(KILN_BINARY_DECLARE_PREDICATE_ROW)                                               \
  Tensor rsub(const Tensor& a, Scalar b); /* b - a */                                                     \
  Tensor div(Scalar a, const Tensor& b);                                                                  \
  Tensor pow(const Tensor& a, Scalar exponent);                                                           \
  Tensor pow(Scalar base, const Tensor& exponent);                                                        \
  Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);                                \
  Tensor where(const Tensor& condition, Scalar a, const Tensor& b);                                       \
  Tensor where(const Tensor& condition, const Tensor& a, Scalar b);                                       \
  Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value);                                  \
  Tensor& masked_fill_(Tensor& a, const Tensor& mask, Scalar value);                                      \
  Tensor lerp(const Tensor& a, const Tensor& b, Scalar weight); /* a + weight * (b - a) */                \
  /* The sum of one or more tensors of one shape, dtype and device, in one pass (one kernel on a GPU). */ \
  Tensor add_n(const std::vector<Tensor>& tensors);
// Tensor's methods (tensor.h): t.name(other), and t.name_(other), t.name_(number) for the in-place forms.
#define KILN_BINARY_METHODS(name, forms) KILN_BINARY_METHODS_##forms(name)
#define KILN_BINARY_METHODS_Plain(name) Tensor name(const Tensor& other) const;
#define KILN_BINARY_METHODS_Scalar(name)  \
  Tensor name(const Tensor& other) const; \
  Tensor& name##_(const Tensor& other);   \
  Tensor& name##_(Scalar other);
#define KILN_BINARY_METHODS_Alpha(name)                     \
  Tensor name(const Tensor& other, Scalar alpha = 1) const; \
  Tensor& name##_(const Tensor& other, Scalar alpha = 1);   \
  Tensor& name##_(Scalar other);
