// kiln/tensor/internal_ops.h — kiln's internal ops: every op of the tensor core, in namespace kiln::internal.
//
// Not part of kiln's API. Programs call the ops through namespace kiln (kiln/autograd/functions.h) and
// Tensor's methods, which record gradients; these record nothing. kiln's own code calls them where no graph
// may be recorded: the backward formulas, the layers' fused forward and backward functions, optimizer steps
// and batch assembly.
//
//   Tensor c = internal::add(a, b);             // broadcasting, type promotion
//   Tensor s = internal::sum(x, {0, 2}, true);  // keepdim
//
// Each op checks its arguments (shapes, dtypes, devices) once, here, for every backend, then calls the
// backend of the inputs' device (backend.h). The ops that have no gradient (factories, random draws,
// comparisons, arg-reductions) are public under the same names: functions.h brings them into namespace kiln.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/tensor/binary_ops.h"
#include "kiln/tensor/generator.h"
#include "kiln/tensor/op_signatures.h"
#include "kiln/tensor/tensor.h"
#include "kiln/tensor/unary_ops.h"

namespace kiln::internal {

using Dims = std::vector<int64_t>;  // a list of dims (negative ones count from the end)

// ---------------------------------------------------------------- factories (factory.cpp)
Tensor empty(const Shape& shape, const TensorOptions& options = {});
// Uninitialised memory laid out with the given strides (each >= 0).
Tensor empty_strided(const Shape& shape, const Strides& strides, const TensorOptions& options = {});
Tensor zeros(const Shape& shape, const TensorOptions& options = {});               // as torch.zeros
Tensor ones(const Shape& shape, const TensorOptions& options = {});                // as torch.ones
Tensor full(const Shape& shape, Scalar value, const TensorOptions& options = {});  // every element value (see below)
// Like the given tensor (shape, dtype, device, and its memory format unless one is given).
Tensor empty_like(const Tensor& t, std::optional<DType> dtype = {}, MemoryFormat format = MemoryFormat::Preserve);
Tensor zeros_like(const Tensor& t, std::optional<DType> dtype = {});               // as empty_like, filled with 0
Tensor ones_like(const Tensor& t, std::optional<DType> dtype = {});                // as empty_like, filled with 1
Tensor full_like(const Tensor& t, Scalar value, std::optional<DType> dtype = {});  // as empty_like, filled with value
// [start, end) in steps; dtype Int64 when all three are integers, else the default float, unless given.
// full() without a dtype takes it from the value (Int64 for integers, Bool for bools), as in PyTorch.
Tensor arange(Scalar end, const TensorOptions& options = {});  // see TensorOptions::dtype for the dtype
Tensor arange(Scalar start, Scalar end, Scalar step = 1, const TensorOptions& options = {});  // step != 0
// `steps` values evenly spaced from start to end, both included.
Tensor linspace(double start, double end, int64_t steps, const TensorOptions& options = {});
// An (n, m) matrix (m defaults to n) with ones on the diagonal, zeros elsewhere.
Tensor eye(int64_t n, std::optional<int64_t> m = {}, const TensorOptions& options = {});
// Copies host data (row-major, numel(shape) elements) into a new tensor of dtype_of<T>() on options.device.
template <typename T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape, Device device = Device::cpu());
Tensor from_blob(const void* data, const Shape& shape, DType dtype, Device device = Device::cpu());  // copies
Tensor scalar_tensor(Scalar value, const TensorOptions& options = {});                               // 0-d

// ---------------------------------------------------------------- random (random.cpp)
// Every draw comes from a Philox generator (the device's default one unless given), so the same seed
// gives the same numbers on every backend.
Tensor rand(const Shape& shape, const TensorOptions& options = {}, Generator* gen = nullptr);   // U[0, 1)
Tensor randn(const Shape& shape, const TensorOptions& options = {}, Generator* gen = nullptr);  // N(0, 1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, const TensorOptions& options = {.dtype = DType::Int64},
               Generator* gen = nullptr);                     // [low, high)
Tensor bernoulli(const Tensor& p, Generator* gen = nullptr);  // 1 with probability p, in p's dtype
// 1 with probability p (in [0, 1]), else 0, in options' dtype.
Tensor bernoulli(const Shape& shape, double p, const TensorOptions& options = {}, Generator* gen = nullptr);
// N(mean, std^2); std finite and >= 0.
Tensor normal(const Shape& shape, double mean, double std, const TensorOptions& options = {}, Generator* gen = nullptr);
Tensor& uniform_(Tensor& t, double from = 0, double to = 1, Generator* gen = nullptr);  // U[from, to), floating t
Tensor& normal_(Tensor& t, double mean = 0, double std = 1, Generator* gen = nullptr);  // N(mean, std^2), floating t
// A random permutation of 0 .. n-1.
Tensor randperm(int64_t n, const TensorOptions& options = {.dtype = DType::Int64}, Generator* gen = nullptr);
// Inverted dropout in one pass and one draw: {out, mask}, both x's shape and dtype (floating), where mask holds
// 0 or 1 / (1 - p) (rounded to the dtype) and out == x * mask. The mask is exactly
// bernoulli(x.shape(), 1 - p, x's options, gen) scaled by 1 / (1 - p): the same generator state gives the
// same mask as that, on every backend, and leaves the generator where that leaves it. p in [0, 1).
std::tuple<Tensor, Tensor> dropout(const Tensor& x, double p, Generator* gen = nullptr);
// One draw of `gen` (the device's default generator when null) for a kernel on `device`. During a CUDA graph
// capture the draw's offset stays in device memory that every replay refreshes (GeneratorState::device_offset),
// so each replay draws new numbers.
GeneratorState draw_for(Generator* gen, Device device);

// ---------------------------------------------------------------- copy and cast (copy.cpp)
KILN_COPY_DECLARE_ALL()
Tensor pin_memory(const Tensor& t);  // a CPU tensor copied into page-locked memory (t itself if it already is)
bool is_pinned(const Tensor& t);     // in page-locked host memory from pinned_host_allocator()

// ---------------------------------------------------------------- views (view.cpp)
KILN_VIEW_DECLARE_ALL()
// Inferred -1 and validity of a target shape for numel elements; throws naming op.
Shape infer_shape(const Shape& shape, int64_t numel, std::string_view op);

// ---------------------------------------------------------------- elementwise (elementwise.cpp)
// The unary ops of the table (unary_ops.h): internal::exp(a), and exp_(a) in place; gelu, square, clamp and clamp_.
// The predicates give Bool.
KILN_UNARY_DECLARE_ALL()
#define KILN_X(Enum, name, ...) Tensor name(const Tensor& a);
KILN_UNARY_PREDICATES(KILN_X)
#undef KILN_X

// The binary ops of the table (binary_ops.h), with broadcasting and type promotion: add(a, b, alpha) = a + alpha * b,
// sub, mul, div (true division: integers give kDefaultFloat), remainder (Python's %, the divisor's sign), pow,
// maximum, minimum; mul(a, 2.5) and the in-place forms add_, sub_, mul_, div_, which write into `a` (the promoted
// type must be castable to a's dtype: float into int is an error). The predicates give Bool: eq, ne, lt, le, gt,
// ge (also with a number), logical_and, logical_or, logical_xor. masked_fill_ writes into `a` likewise.
KILN_BINARY_DECLARE_ALL()
// (g * b, g * a): the gradients of a * b, in one pass (one kernel on a GPU) when g, a and b have one shape
// and floating dtype; otherwise the two products with broadcasting and promotion.
std::tuple<Tensor, Tensor> mul_backward(const Tensor& g, const Tensor& a, const Tensor& b);
// The gradients of the activations, g * f'(x) for the incoming gradient g, in one pass (one kernel on a GPU)
// that reads g and the activation's input x and writes the result; floating dtypes, promoted and broadcast as
// mul(g, x) would be. relu_backward takes relu's result y instead: g where y > 0, else 0 (0 at 0).
Tensor gelu_backward(const Tensor& g, const Tensor& x, bool tanh_approximation = false);
Tensor silu_backward(const Tensor& g, const Tensor& x);  // g * silu'(x)
Tensor relu_backward(const Tensor& g, const Tensor& y);  // g where y > 0, else 0

// The dtype PyTorch would compute a binary op in (0-d tensors and scalars count less than dimensioned tensors).
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, Scalar b);  // the same with a number

// ---------------------------------------------------------------- reductions (reduce.cpp)
KILN_REDUCE_DECLARE_ALL()
Tensor argmax(const Tensor& a, std::optional<int64_t> dim = {}, bool keepdim = false);
Tensor argmin(const Tensor& a, std::optional<int64_t> dim = {}, bool keepdim = false);  // as argmax, of the smallest
Tensor all(const Tensor& a, const Dims& dims = {}, bool keepdim = false);               // Bool: every element nonzero
Tensor any(const Tensor& a, const Dims& dims = {}, bool keepdim = false);               // Bool: some element nonzero
Tensor count_nonzero(const Tensor& a, const Dims& dims = {});                           // Int64, over dims (empty: all)

// ---------------------------------------------------------------- linear algebra (linalg.cpp)
KILN_LINALG_DECLARE_ALL()
// In place: c = beta*c + alpha*a@b, for a (M, K), b (K, N) and c (M, N) on one device, c's rows contiguous (column
// stride 1, row stride N): one product that adds into c (a gradient summed where it is, say). c has the operands'
// dtype, or Float32 for Float16/BFloat16 operands (their float32 sums added into c without a rounding to 16 bits).
Tensor& addmm_(Tensor& c, const Tensor& a, const Tensor& b, Scalar beta = 1, Scalar alpha = 1);
// a @ b for 2-D a and b, stored in out_dtype: a's dtype, or Float32 for Float16/BFloat16 operands (a widening
// product: the float32 sums the product accumulates are kept, not rounded to 16 bits first).
Tensor mm(const Tensor& a, const Tensor& b, DType out_dtype);
// {a @ b, the row sums of a} for a (M, K), b (K, N): with a = g^T, the weight and bias gradients of a linear layer.
// One product on the GPU: for 16-bit a with M >= 8 N, a @ [b | 1] (the sums as one more column), else where the dims
// allow the product's epilogue sums; elsewhere the product and a matrix-vector product with ones (a reduction for
// float32, whose product may run in TF32). Both in out_dtype (a's by default; Float32 widens as mm's does).
std::pair<Tensor, Tensor> mm_with_row_sums(const Tensor& a, const Tensor& b,
                                           std::optional<DType> out_dtype = std::nullopt);
// Whether matmul copies this operand (of 3 dims or more) before its product: its batch dims (all but the last two)
// do not walk with one stride, as heads transposed out of a (B, S, H, D) activation do not.
bool matmul_copies_operand(const Tensor& t);

// ---------------------------------------------------------------- indexing (index.cpp)
KILN_INDEX_DECLARE_ALL()
Tensor nonzero(const Tensor& a);                                             // (count, rank) Int64
Tensor one_hot(const Tensor& index, int64_t num_classes = -1);               // Int64 output, (..., num_classes)
Tensor argsort(const Tensor& a, int64_t dim = -1, bool descending = false);  // Int64 indices of a stable sort
// In place: a[index[i]] += src[i] along dim (index_add without the copy of a): an embedding's gradient rows summed
// into a table of zeros, or into the gradient its table's other uses began.
Tensor& index_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);

// ---------------------------------------------------------------- comparison helpers (compare.cpp)
// |a - b| <= atol + rtol * |b| elementwise, NaNs equal when equal_nan; shapes must broadcast.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
// The same test elementwise, as a Bool tensor.
Tensor isclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
bool equal(const Tensor& a, const Tensor& b);  // same shape and same values (and dtype category)

}  // namespace kiln::internal
