// kiln/tensor/backend.h — the backend contract: the few primitive kernels a device must provide.
//
// Every op in ops.h checks its arguments, promotes types, broadcasts and allocates its output once,
// in shared code, and then calls these primitives on the backend of the inputs' device. A backend
// therefore never sees a shape mismatch or a wrong dtype; what it may assume is written beside each
// primitive. tensor/README.md lists the contract and the conformance suite (tests/tensor) that every
// backend passes. The CPU backend lives in tensor/cpu/, the CUDA backend in tensor/cuda/.
//
// Shared rules for all primitives:
//  - All tensors passed are on this backend's device type (copy() is the one exception, below).
//  - Inputs of elementwise primitives already have the output's shape (broadcast inputs carry stride 0).
//  - Outputs never overlap themselves (no stride 0 in an output); an output may be the same tensor
//    as an input (in-place ops), at the same positions, but never a shifted alias of it.
//  - Strides are arbitrary (negative strides do not occur); zero-element tensors do not reach a backend.
//  - Float16 and BFloat16 compute in float32 (reductions accumulate in float32, float64 in float64,
//    integers in int64) and round once when they store.
#pragma once

#include <string_view>

#include <cstdint>
#include <memory>
#include <string>  // IndexOpName::str

#include "kiln/tensor/binary_ops.h"
#include "kiln/tensor/generator.h"
#include "kiln/tensor/tensor.h"
#include "kiln/tensor/unary_ops.h"

namespace kiln {

// One value per row of the unary op table (unary_ops.h), in its order.
enum class UnaryOp : uint8_t {
#define KILN_X(Enum, ...) Enum,
  KILN_UNARY_OPS(KILN_X) KILN_UNARY_PREDICATES(KILN_X) KILN_UNARY_OTHER(KILN_X)
#undef KILN_X
};
// The op's name in the table ("exp", "gelu_tanh", ...): the profiler's range name, and what errors say.
std::string_view unary_op_name(UnaryOp op);

// One value per row of the binary op table (binary_ops.h), in its order. Output dtype = the compute dtype (the
// promoted one; Div: floating), Bool for the predicates. Bool: Add and Maximum are or, Mul and Minimum are and.
// Integers: Remainder is Python's % (the divisor's sign) and Pow wraps like multiplication; a zero divisor or
// negative exponent throws kiln::Error on the CPU. On CUDA a kernel cannot throw and checking first would
// synchronise the host, so there (as in PyTorch) those elements get an unspecified value and no error is raised.
// Maximum and Minimum propagate NaN. The activations' gradients (KILN_BINARY_OTHER) are floating only.
enum class BinaryOp : uint8_t {
#define KILN_X(Enum, ...) Enum,
  KILN_BINARY_OPS(KILN_X) KILN_BINARY_PREDICATES(KILN_X) KILN_BINARY_OTHER(KILN_X)
#undef KILN_X
};
// The op's name in the table ("add", "logical_xor", "gelu_tanh_backward", ...): the profiler's range name.
std::string_view binary_op_name(BinaryOp op);

// The reductions of Backend::reduce (Max and Min also of arg_reduce).
enum class ReduceOp : uint8_t {
  Sum,
  Mean,
  Prod,
  Max,
  Min,
  All,
  Any,
  // Floating only, computed in acc_t and rounded once:
  Var,        // sum((x - mean)^2) / max(n - params.correction, 0), two-pass
  Std,        // sqrt(Var)
  Norm,       // (sum |x|^p)^(1/p), p = params.p; p = 0 counts nonzeros, p = +-inf gives max/min |x|
  LogSumExp,  // max + log(sum(exp(x - max))); all -inf gives -inf, +inf gives +inf
};
// The floating-only ops above (Var, Std, Norm, LogSumExp): one floating dtype in and out (visit_stats_dtype,
// dispatch.h); each backend serves them on a path of their own.
constexpr bool is_statistics_op(ReduceOp op) {
  return op == ReduceOp::Var || op == ReduceOp::Std || op == ReduceOp::Norm || op == ReduceOp::LogSumExp;
}

// The distributions of Backend::random (see RandomParams).
enum class RandomKind : uint8_t { Uniform, Normal, Randint, Bernoulli };

// The extra arguments of a unary op (only Clamp has any).
struct UnaryParams {
  double a = 0;  // Clamp: lower bound
  double b = 0;  // Clamp: upper bound
};

// The extra arguments of a reduction (Var/Std and Norm).
struct ReduceParams {
  int64_t correction = 1;  // Var: the divisor is n - correction (Bessel's correction by default)
  double p = 2;            // Norm: the order
};

// What Backend::matmul_epilogue fuses into a product; an undefined tensor means not wanted.
struct MatmulEpilogue {
  Tensor bias;      // (N): added to every row of the product
  Tensor row_sums;  // (M): written with the row sums of a
};

// The distribution Backend::random draws from.
struct RandomParams {
  RandomKind kind = RandomKind::Uniform;  // which distribution
  // The real parameters a and b, as the comment at the right says.
  double a = 0, b = 1;  // Uniform [a, b); Normal mean a, std b; Bernoulli probability a
  // Randint's bounds low and high, as the comment at the right says.
  int64_t low = 0, high = 2;  // Randint [low, high)
};

// The primitive kernels of one device type (see above); backend() gives the one of a device.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceType device_type() const = 0;          // the device type it serves
  virtual int device_count() const = 0;                // devices of that type visible (1 for the CPU)
  virtual Allocator& allocator(int device_index) = 0;  // the allocator of one device
  virtual void synchronize(int device_index) = 0;      // waits for the device's queued work (CPU: nothing)

  // ---- data movement ----
  // dst = src converted to dst's dtype; src has dst's shape. Either side may be on the CPU when this
  // backend is not the CPU's (host <-> device copies are done by the device's backend).
  virtual void copy(const Tensor& dst, const Tensor& src, bool non_blocking) = 0;
  virtual void fill(const Tensor& dst, Scalar value) = 0;  // every element of dst = value in dst's dtype
  // 1-D dst: dst[i] = start + i * step, computed in dst's dtype (double for floating dtypes).
  virtual void arange(const Tensor& dst, Scalar start, Scalar step) = 0;
  // 1-D dst of n >= 2 elements, symmetric as PyTorch: start + i*step for i < n/2, else end - (n-1-i)*step.
  virtual void linspace(const Tensor& dst, double start, double end) = 0;

  // ---- elementwise ----
  // out and a have the same dtype, except for ops whose output is Bool.
  virtual void unary(UnaryOp op, const Tensor& out, const Tensor& a, const UnaryParams& params) = 0;
  // a and b have the same dtype; out has it too, or Bool for comparisons and logical ops.
  virtual void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  // cond is Bool; a, b and out share one dtype.
  virtual void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) = 0;
  // out = inputs[0] + inputs[1] + ..., in one pass: out and at least two inputs, all contiguous, of one
  // shape and one non-Bool dtype; summed in compute_t and rounded once.
  virtual void add_n(const Tensor& out, const std::vector<Tensor>& inputs) = 0;
  // The gradients of a * b in one pass: ga = g * b, gb = g * a. All five contiguous, of one shape and
  // one floating dtype; each product computed in compute_t and rounded once (as binary Mul does).
  virtual void mul_backward(const Tensor& ga, const Tensor& gb, const Tensor& g, const Tensor& a, const Tensor& b) = 0;

  // ---- reductions ----
  // out has in's rank with size 1 in each reduced dim (keepdim form); reduce[d] says whether dim d is
  // reduced. Sum/Mean/Prod: out's dtype may be wider than in's (int32 -> int64). Max/Min: same dtype,
  // NaN propagates. All/Any: in is Bool, out is Bool. Var/Norm/LogSumExp: one floating dtype, params
  // apply. At least one element per output.
  virtual void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce,
                      const ReduceParams& params) = 0;
  // Max or Min along one dim with the index of the first extreme (NaN counts as the extreme).
  // values (in's dtype) and indices (Int64) are in keepdim form.
  virtual void arg_reduce(ReduceOp op, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) = 0;
  // Softmax (or log-softmax) along dim; out has in's shape and dtype.
  virtual void softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log) = 0;

  // ---- matrix multiply ----
  // out = alpha * a @ b + beta * out, batched: a (B, M, K), b (B, K, N), out (B, M, N), one dtype; or, for
  // Float16/BFloat16 a and b, a Float32 out, which gets the product's float32 sums without a rounding to 16 bits.
  // In a and b one of the two matrix dims has stride 1 (row- or column-major); batch strides may be 0.
  // out's rows are contiguous (column stride 1) and its row stride is N or the pitch matmul_row_pitch gave.
  // beta == 0 ignores out's previous contents (NaN included).
  virtual void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) = 0;
  // The row stride (in elements, >= n) that a new (M, n) product of `dtype` should get: n, or more where rows of n
  // elements would leave the rows misaligned for this backend's fast kernels. mm, addmm and 2-D matmul allocate
  // (M, pitch) and return the (M, n) view, so their results may have a row stride larger than n.
  virtual int64_t matmul_row_pitch(DType dtype, int64_t n) const {
    (void)dtype;
    return n;
  }
  // A product with a fused epilogue, where the backend has one: out = a @ b for one matrix (a (1, M, K), b (1, K, N),
  // out (1, M, N) with rows as for matmul, layouts as for matmul), and besides, as e says:
  //  - e.bias (N) defined: out[i, j] += bias[j] (the forward of a linear layer);
  //  - e.row_sums (M) defined: row_sums[i] = sum_k a[0, i, k] (the bias gradient of a linear layer, computed
  //    while its weight gradient is).
  // Both tensors are contiguous with out's dtype (which may be Float32 for 16-bit a and b, as for matmul). Returns
  // false, having written nothing, where this backend or
  // this problem has no such epilogue; the caller then does the same work with matmul and other ops.
  virtual bool matmul_epilogue(const Tensor& out, const Tensor& a, const Tensor& b, const MatmulEpilogue& e) {
    (void)out, (void)a, (void)b, (void)e;
    return false;
  }

  // ---- indexing (indices are Int64; backends check bounds and throw kiln::Error naming the op) ----
  // The CUDA backend checks bounds on the device and reads the result back, so index_select, gather and
  // scatter synchronise the stream once per call (nonzero must anyway, for its output size). A later
  // optimisation may make the check asynchronous (report at the next synchronisation point instead).
  // out = a.index_select(dim, index), index 1-D.
  virtual void index_select(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) = 0;
  // out[i][j][k] = a[index[i][j][k]][j][k] for dim 0, etc.; out and index share a shape.
  virtual void gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) = 0;
  // In place: out[index[i][j][k]][j][k] = src[i][j][k] (or +=, when accumulate); index and src share a shape.
  virtual void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) = 0;
  // The indices of the nonzero elements of a, as a new (count, rank) Int64 tensor, in row-major order.
  virtual Tensor nonzero(const Tensor& a) = 0;
  // Sorts along dim; values (a's dtype) and indices (Int64) have a's shape. NaN sorts as the largest.
  virtual void sort(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t dim, bool descending,
                    bool stable) = 0;
  // The k largest (or smallest) along dim; values and indices have a's shape with size k at dim.
  virtual void topk(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t k, int64_t dim, bool largest,
                    bool sorted) = 0;

  // ---- random numbers: the numbering of generator.h, element i being the i-th in row-major order ----
  virtual void random(const Tensor& out, const RandomParams& params, GeneratorState draw) = 0;
  // Inverted dropout in one pass: element i (row-major) is kept exactly when random() with
  // {Bernoulli, a = 1 - p} and the same draw would give it 1 (philox::keep_float / keep_double); then
  // mask[i] = s and out[i] = x[i] * s where kept, mask[i] = 0 and out[i] = x[i] * 0 where dropped, with
  // s = Scalar(1 / (1 - p)).to<T>() (as fill stores it) and the product in compute_t, rounded once (binary
  // Mul's rounding, so out == x * mask). out, mask and x share one floating dtype and a shape; any strides.
  // p in [0, 1).
  virtual void dropout(const Tensor& out, const Tensor& mask, const Tensor& x, double p, GeneratorState draw) = 0;
};

// What a backend class declares to implement the pure primitives of Backend, copy to dropout (each is defined in
// the backend's file of its family). The compiler holds the list to the contract: an entry that is not a primitive
// does not override, and a primitive missing from it leaves the backend abstract. Each backend declares the device
// queries (device_type to synchronize) and the optional primitives (matmul_row_pitch, matmul_epilogue) it has.
#define KILN_BACKEND_PRIMITIVES_OVERRIDE()                                                                           \
  void copy(const Tensor& dst, const Tensor& src, bool non_blocking) override;                                       \
  void fill(const Tensor& dst, Scalar value) override;                                                               \
  void arange(const Tensor& dst, Scalar start, Scalar step) override;                                                \
  void linspace(const Tensor& dst, double start, double end) override;                                               \
  void unary(UnaryOp op, const Tensor& out, const Tensor& a, const UnaryParams& params) override;                    \
  void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) override;                            \
  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) override;                      \
  void add_n(const Tensor& out, const std::vector<Tensor>& inputs) override;                                         \
  void mul_backward(const Tensor& ga, const Tensor& gb, const Tensor& g, const Tensor& a, const Tensor& b) override; \
  void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce,                     \
              const ReduceParams& params) override;                                                                  \
  void arg_reduce(ReduceOp op, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) override; \
  void softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log) override;                                 \
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) override;              \
  void index_select(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) override;                  \
  void gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) override;                        \
  void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) override;    \
  Tensor nonzero(const Tensor& a) override;                                                                          \
  void sort(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t dim, bool descending, bool stable) \
      override;                                                                                                      \
  void topk(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t k, int64_t dim, bool largest,      \
            bool sorted) override;                                                                                   \
  void random(const Tensor& out, const RandomParams& params, GeneratorState draw) override;                          \
  void dropout(const Tensor& out, const Tensor& mask, const Tensor& x, double p, GeneratorState draw) override;

// The backend of a device type. CUDA throws a kiln::Error when kiln was built without CUDA.
Backend& backend(DeviceType type);
// The backend of device's type.
inline Backend& backend(Device device) { return backend(device.type()); }

// Page-locked host memory for asynchronous copies to and from GPUs; null when no GPU can be used.
Allocator* pinned_host_allocator();

namespace detail {
// The op a user called (embedding, index_add, one_hot...) while it runs a backend's index kernels, on this
// thread: the backends name this op, rather than their kernel, in a bad index's error (the CPU's at once; CUDA's,
// found after the call returned, at a later call). The outermost scope names it: a module opens one with its own
// label around its call (nn::Embedding: `Embedding "tables.17" (1000 x 16 table)`), and the ops it calls
// (embedding opens "embedding") keep that label, so the error names the table rather than the op inside it.
// What a scope names: a fixed text, or a text made only when it is needed (a bad index on the CPU, a launch on a
// GPU) by make(arg), so that a module's label costs nothing on the calls that never need it.
struct IndexOpName {
  std::string_view text{};                     // viewed, not copied
  std::string (*make)(const void*) = nullptr;  // when set: the name is make(arg)
  const void* arg = nullptr;
  bool empty() const { return make == nullptr && text.empty(); }
  std::string str() const { return make != nullptr ? make(arg) : std::string(text); }
};

class IndexOpScope {
 public:
  // Names `op`, unless an outer scope on this thread already names one. Viewed, not copied: op must outlive the scope.
  explicit IndexOpScope(std::string_view op);
  // Names make(arg), made when asked for, unless an outer scope names one. Both must outlive the scope.
  IndexOpScope(std::string (*make)(const void*), const void* arg);
  ~IndexOpScope();
  IndexOpScope(const IndexOpScope&) = delete;
  IndexOpScope& operator=(const IndexOpScope&) = delete;
  static IndexOpName current_name();  // the outermost scope's name, not yet made (empty outside every scope)
  static std::string current() { return current_name().str(); }  // that name, made

 private:
  void open(const IndexOpName& name);
  IndexOpName previous_;
};
}  // namespace detail

}  // namespace kiln
