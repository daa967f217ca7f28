// A Backend that opens a trace range around each op of the backend it wraps. backend() hands it out
// instead of the real one while a trace listener is installed, so op ranges cost nothing otherwise.
#include "kiln/tensor/trace_backend.h"

#include <array>

#include "kiln/tensor/tensor.h"
#include "kiln/tensor/trace.h"

namespace kiln::detail {

namespace {

constexpr std::array<std::string_view, static_cast<size_t>(ReduceOp::LogSumExp) + 1> kReduceNames = {
    "sum", "mean", "prod", "max", "min", "all", "any", "var", "std", "norm", "logsumexp"};
constexpr std::array<std::string_view, static_cast<size_t>(ReduceOp::LogSumExp) + 1> kArgReduceNames = {
    "arg_sum", "arg_mean", "arg_prod", "argmax",   "argmin",       "arg_all",
    "arg_any", "arg_var",  "arg_std",  "arg_norm", "arg_logsumexp"};
constexpr std::array<std::string_view, 4> kRandomNames = {"uniform", "normal", "randint", "bernoulli"};

// A name for every enum value (the unary and binary ops take theirs from their tables): adding one to an enum
// without naming it here fails to compile.
static_assert(!kReduceNames.back().empty() && !kArgReduceNames.back().empty());

template <typename E, size_t N>
std::string_view name_of(const std::array<std::string_view, N>& names, E e) {
  const auto i = static_cast<size_t>(e);
  return i < N ? names[i] : std::string_view("?");
}

// The device whose work an op is: the first CUDA tensor's, else the CPU.
Device device_of(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && t->device().is_cuda()) return t->device();
  return Device::cpu();
}

class TracingBackend final : public Backend {
 public:
  explicit TracingBackend(Backend& inner) : inner_(inner) {}

  DeviceType device_type() const override { return inner_.device_type(); }
  int device_count() const override { return inner_.device_count(); }
  Allocator& allocator(int device_index) override { return inner_.allocator(device_index); }
  void synchronize(int device_index) override {
    trace::Scope s(trace::Kind::Op, "synchronize");
    inner_.synchronize(device_index);
  }

  void copy(const Tensor& dst, const Tensor& src, bool non_blocking) override {
    std::string_view name = "copy";
    if (dst.device().is_cuda() && src.device().is_cpu()) name = "copy_h2d";
    if (dst.device().is_cpu() && src.device().is_cuda()) name = "copy_d2h";
    trace::Scope s(trace::Kind::Op, name, device_of({&dst, &src}), {&dst, &src});
    inner_.copy(dst, src, non_blocking);
  }
  void fill(const Tensor& dst, Scalar value) override {
    trace::Scope s(trace::Kind::Op, "fill", dst.device(), {&dst});
    inner_.fill(dst, value);
  }
  void arange(const Tensor& dst, Scalar start, Scalar step) override {
    trace::Scope s(trace::Kind::Op, "arange", dst.device(), {&dst});
    inner_.arange(dst, start, step);
  }
  void linspace(const Tensor& dst, double start, double end) override {
    trace::Scope s(trace::Kind::Op, "linspace", dst.device(), {&dst});
    inner_.linspace(dst, start, end);
  }
  void unary(UnaryOp op, const Tensor& out, const Tensor& a, const UnaryParams& params) override {
    trace::Scope s(trace::Kind::Op, unary_op_name(op), out.device(), {&out, &a});
    inner_.unary(op, out, a, params);
  }
  void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) override {
    trace::Scope s(trace::Kind::Op, binary_op_name(op), out.device(), {&out, &a, &b});
    inner_.binary(op, out, a, b);
  }
  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) override {
    trace::Scope s(trace::Kind::Op, "where", out.device(), {&out, &cond, &a, &b});
    inner_.where(out, cond, a, b);
  }
  void add_n(const Tensor& out, const std::vector<Tensor>& inputs) override {
    trace::Scope s(trace::Kind::Op, "add_n", out.device(), {&out});
    inner_.add_n(out, inputs);
  }
  void mul_backward(const Tensor& ga, const Tensor& gb, const Tensor& g, const Tensor& a, const Tensor& b) override {
    trace::Scope s(trace::Kind::Op, "mul_backward", g.device(), {&ga, &gb, &g, &a, &b});
    inner_.mul_backward(ga, gb, g, a, b);
  }
  void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& dims,
              const ReduceParams& params) override {
    trace::Scope s(trace::Kind::Op, name_of(kReduceNames, op), in.device(), {&out, &in});
    inner_.reduce(op, out, in, dims, params);
  }
  void arg_reduce(ReduceOp op, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) override {
    trace::Scope s(trace::Kind::Op, name_of(kArgReduceNames, op), in.device(), {&values, &indices, &in});
    inner_.arg_reduce(op, values, indices, in, dim);
  }
  void softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log) override {
    trace::Scope s(trace::Kind::Op, log ? "log_softmax" : "softmax", in.device(), {&out, &in});
    inner_.softmax(out, in, dim, log);
  }
  void matmul(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) override {
    trace::Scope s(trace::Kind::Op, "matmul", out.device(), {&out, &a, &b});
    inner_.matmul(out, a, b, alpha, beta);
  }
  int64_t matmul_row_pitch(DType dtype, int64_t n) const override { return inner_.matmul_row_pitch(dtype, n); }
  bool matmul_epilogue(const Tensor& out, const Tensor& a, const Tensor& b, const MatmulEpilogue& e) override {
    trace::Scope s(trace::Kind::Op, e.bias.defined() ? "matmul_bias" : "matmul_row_sums", out.device(), {&out, &a, &b});
    return inner_.matmul_epilogue(out, a, b, e);
  }
  void index_select(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) override {
    trace::Scope s(trace::Kind::Op, "index_select", out.device(), {&out, &a, &index});
    inner_.index_select(out, a, dim, index);
  }
  void gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) override {
    trace::Scope s(trace::Kind::Op, "gather", out.device(), {&out, &a, &index});
    inner_.gather(out, a, dim, index);
  }
  void scatter(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) override {
    trace::Scope s(trace::Kind::Op, accumulate ? "scatter_add" : "scatter", out.device(), {&out, &index, &src});
    inner_.scatter(out, dim, index, src, accumulate);
  }
  Tensor nonzero(const Tensor& a) override {
    trace::Scope s(trace::Kind::Op, "nonzero", a.device(), {&a});
    return inner_.nonzero(a);
  }
  void sort(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t dim, bool descending,
            bool stable) override {
    trace::Scope s(trace::Kind::Op, "sort", a.device(), {&values, &indices, &a});
    inner_.sort(values, indices, a, dim, descending, stable);
  }
  void topk(const Tensor& values, const Tensor& indices, const Tensor& a, int64_t k, int64_t dim, bool largest,
            bool sorted) override {
    trace::Scope s(trace::Kind::Op, "topk", a.device(), {&values, &indices, &a});
    inner_.topk(values, indices, a, k, dim, largest, sorted);
  }
  void random(const Tensor& out, const RandomParams& params, GeneratorState draw) override {
    trace::Scope s(trace::Kind::Op, name_of(kRandomNames, params.kind), out.device(), {&out});
    inner_.random(out, params, draw);
  }
  void dropout(const Tensor& out, const Tensor& mask, const Tensor& x, double p, GeneratorState draw) override {
    trace::Scope s(trace::Kind::Op, "dropout", x.device(), {&out, &mask, &x});
    inner_.dropout(out, mask, x, p, draw);
  }

 private:
  Backend& inner_;
};

}  // namespace

Backend& tracing_backend(Backend& inner) {
  // One wrapper per backend; there are two backends (CPU, CUDA), each a process-wide singleton.
  static TracingBackend cpu_wrapper(backend_untraced(DeviceType::CPU));
  if (&inner == &backend_untraced(DeviceType::CPU)) return cpu_wrapper;
  static TracingBackend cuda_wrapper(inner);
  return cuda_wrapper;
}

}  // namespace kiln::detail
