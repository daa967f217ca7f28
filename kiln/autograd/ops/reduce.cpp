// Reductions, forward and backward side by side: sum, mean, prod, amax/amin, max/min, var/std/var_mean,
// norm, logsumexp. Backward formulas keep the reduced dims (size 1) and let broadcasting bring them back
// to the input's shape.
#include <algorithm>
#include <cmath>
#include "kiln/autograd/ops/op_recording.h"
#include "kiln/tensor/capture.h"

namespace kiln {

namespace {

// The reduced dims of a rank-`rank` input, wrapped and sorted (empty `dims` means all).
Dims reduced_dims(const Dims& dims, int64_t rank, std::string_view op) {
  Dims out;
  if (rank == 0) {
    for (int64_t d : dims) wrap_dim(d, rank, op);  // a 0-d tensor has nothing to bring back
    return out;
  }
  if (dims.empty()) {
    for (int64_t d = 0; d < rank; ++d) out.push_back(d);
  } else {
    for (int64_t d : dims) out.push_back(wrap_dim(d, rank, op));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A reduced-shape tensor with its reduced dims back as size 1 (what keepdim=true would have given).
Tensor keep_reduced(const Tensor& t, const Dims& dims, bool keepdim) {
  if (keepdim) return t;
  Tensor r = t;
  for (int64_t d : dims) r = internal::unsqueeze(r, d);
  return r;
}

// A gradient of the reduced shape brought back to the input's shape (a broadcasting view, no copy).
Tensor expand_reduced(const Tensor& g, const Shape& input_shape, const Dims& dims, bool keepdim) {
  return internal::expand(keep_reduced(g, dims, keepdim), input_shape);
}

// The number of elements each output element reduces over.
int64_t reduced_count(const Tensor& a, const Dims& dims) {
  int64_t count = 1;
  for (int64_t d : dims) count *= a.size(d);
  return count;
}

// g spread evenly over the positions where `mask` holds within each reduced slice (ties of a max share
// its gradient, as in PyTorch). g_keep and the count keep the reduced dims; mask has the input's shape.
Tensor split_among(const Tensor& g_keep, const Tensor& mask, const Dims& dims) {
  const Tensor count = internal::sum(mask, dims, /*keepdim=*/true);  // Int64, >= 1 where the slice has a match
  return internal::where(mask, internal::div(g_keep, count), 0.0);
}

// ---------------------------------------------------------------- sum, mean
// d/da sum = g broadcast back over the reduced dims; mean divides by the count.
struct SumBackward final : Node {
  Shape input_shape;
  Dims dims;
  bool keepdim = false;
  double scale = 1.0;  // 1 / count for mean
  std::string_view name() const override { return scale == 1.0 ? "SumBackward" : "MeanBackward"; }
  TensorList apply(TensorList&& grads) override {
    Tensor g = expand_reduced(grads[0], input_shape, dims, keepdim);
    return {scale == 1.0 ? g : internal::mul(g, scale)};
  }
};

}  // namespace

Tensor sum(const Tensor& a_in, const Dims& dims, bool keepdim, std::optional<DType> dtype) {
  capture::Op cap("sum");
  auto [a] = autocast::inputs(Op::Sum, a_in);
  return cap.done(record<SumBackward>(internal::sum(a, dims, keepdim, dtype), a,
                                      [&, &a = a](SumBackward& node) {
                                        node.input_shape = a.shape();
                                        node.dims = reduced_dims(dims, a.dim(), "sum");
                                        node.keepdim = keepdim;
                                      }),
                  [&] {
                    return capture::Args{{a_in}, {{"dims", dims}, {"keepdim", int64_t{keepdim}}}};
                  });
}

Tensor mean(const Tensor& a_in, const Dims& dims, bool keepdim) {
  capture::Op cap("mean");
  auto [a] = autocast::inputs(Op::Mean, a_in);
  return cap.done(record<SumBackward>(internal::mean(a, dims, keepdim), a,
                                      [&, &a = a](SumBackward& node) {
                                        node.input_shape = a.shape();
                                        node.dims = reduced_dims(dims, a.dim(), "mean");
                                        node.keepdim = keepdim;
                                        int64_t count = 1;
                                        for (int64_t d : node.dims) count *= a.size(d);
                                        node.scale = 1.0 / static_cast<double>(std::max<int64_t>(count, 1));
                                      }),
                  [&] {
                    return capture::Args{{a_in}, {{"dims", dims}, {"keepdim", int64_t{keepdim}}}};
                  });
}

namespace {

// ---------------------------------------------------------------- prod
// d/da_i prod = product of the other elements of a_i's slice. Without zeros that is prod / a_i; with one
// zero it is the product of the non-zeros at the zero and 0 elsewhere; with two or more zeros it is 0
// everywhere. Never divides by a zero, so no inf or NaN appears where the answer is finite.
struct ProdBackward final : Node {
  SavedTensor input;
  Dims dims;
  bool keepdim = false;
  std::string_view name() const override { return "ProdBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor a = input.unpack(*this);
    const Tensor g = keep_reduced(grads[0], dims, keepdim);            // reduced dims of size 1
    const Tensor zero = internal::eq(a, 0.0);                          // input shape
    const Tensor zeros = internal::sum(zero, dims, /*keepdim=*/true);  // zeros per slice, Int64
    const Tensor nonzero = internal::where(zero, 1.0, a);              // the zeros replaced by 1
    const Tensor g_prod =
        internal::mul(g, internal::prod(nonzero, dims, /*keepdim=*/true));  // g * product of non-zeros
    const Tensor no_zero = internal::div(g_prod, nonzero);                  // right for slices without zeros
    const Tensor one_zero = internal::where(internal::logical_and(zero, internal::eq(zeros, 1)), g_prod, 0.0);
    return {internal::where(internal::eq(zeros, 0), no_zero, one_zero)};
  }
  void release_saved() override { input.reset(); }
};

}  // namespace

Tensor prod(const Tensor& a_in, const Dims& dims, bool keepdim) {
  capture::Op cap("prod");
  auto [a] = autocast::inputs(Op::Prod, a_in);
  return cap.done(record<ProdBackward>(internal::prod(a, dims, keepdim), a,
                                       [&, &a = a](ProdBackward& node) {
                                         node.input = SavedTensor(a, false);
                                         node.dims = reduced_dims(dims, a.dim(), "prod");
                                         node.keepdim = keepdim;
                                       }),
                  [&] {
                    return capture::Args{{a_in}, {{"dims", dims}, {"keepdim", int64_t{keepdim}}}};
                  });
}

namespace {

// ---------------------------------------------------------------- amax, amin, max(), min()
// The gradient goes to the elements equal to the result, split evenly among ties.
struct ExtremumBackward final : Node {
  SavedTensor input, result;
  Dims dims;
  bool keepdim = false;
  std::string_view label;  // "AmaxBackward", "MaxBackward", ...
  std::string_view name() const override { return label; }
  TensorList apply(TensorList&& grads) override {
    const Tensor a = input.unpack(*this);
    const Tensor mask = internal::eq(a, keep_reduced(result.unpack(*this), dims, keepdim));  // input shape
    return {split_among(keep_reduced(grads[0], dims, keepdim), mask, dims)};
  }
  void release_saved() override {
    input.reset();
    result.reset();
  }
};

Tensor record_extremum(Tensor out, const Tensor& a, const Dims& dims, bool keepdim, std::string_view label,
                       std::string_view op) {
  return record<ExtremumBackward>(out, a, [&](ExtremumBackward& node) {
    node.input = SavedTensor(a, false);
    node.dims = reduced_dims(dims, a.dim(), op);
    node.keepdim = keepdim;
    node.label = label;
    node.result = SavedTensor(out, /*is_output=*/true);
  });
}

}  // namespace

Tensor amax(const Tensor& a_in, const Dims& dims, bool keepdim) {
  capture::Op cap("amax");
  auto [a] = autocast::inputs(Op::Amax, a_in);
  return cap.done(record_extremum(internal::amax(a, dims, keepdim), a, dims, keepdim, "AmaxBackward", "amax"), [&] {
    return capture::Args{{a_in}, {{"dims", dims}, {"keepdim", int64_t{keepdim}}}};
  });
}

Tensor amin(const Tensor& a_in, const Dims& dims, bool keepdim) {
  capture::Op cap("amin");
  auto [a] = autocast::inputs(Op::Amin, a_in);
  return cap.done(record_extremum(internal::amin(a, dims, keepdim), a, dims, keepdim, "AminBackward", "amin"), [&] {
    return capture::Args{{a_in}, {{"dims", dims}, {"keepdim", int64_t{keepdim}}}};
  });
}

Tensor max(const Tensor& a_in) {
  capture::Op cap("amax");
  auto [a] = autocast::inputs(Op::MaxMin, a_in);
  return cap.done(record_extremum(internal::max(a), a, {}, false, "MaxBackward", "max"), [&] {
    return capture::Args{{a_in}, {{"dims", Dims{}}, {"keepdim", int64_t{0}}}};
  });
}

Tensor min(const Tensor& a_in) {
  capture::Op cap("amin");
  auto [a] = autocast::inputs(Op::MaxMin, a_in);
  return cap.done(record_extremum(internal::min(a), a, {}, false, "MinBackward", "min"), [&] {
    return capture::Args{{a_in}, {{"dims", Dims{}}, {"keepdim", int64_t{0}}}};
  });
}

namespace {

// ---------------------------------------------------------------- max, min along a dim (values, indices)
// The gradient goes to the returned index only (the first of tied elements); indices get none.
struct IndexedExtremumBackward final : Node {
  SavedTensor indices;
  Shape input_shape;
  int64_t dim = 0;
  bool keepdim = false;
  bool is_max = true;
  std::string_view name() const override { return is_max ? "MaxBackward" : "MinBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    if (input_shape.empty()) return {g};  // a 0-d input is its own max
    const Tensor idx = indices.unpack(*this);
    const Tensor g_keep = keepdim ? g : internal::unsqueeze(g, dim);
    const Tensor idx_keep = keepdim ? idx : internal::unsqueeze(idx, dim);
    return {internal::scatter(internal::zeros(input_shape, g.options()), dim, idx_keep, g_keep)};
  }
  void release_saved() override { indices.reset(); }
};

std::tuple<Tensor, Tensor> indexed_extremum(const Tensor& a_in, int64_t dim, bool keepdim, bool is_max) {
  auto [a] = autocast::inputs(Op::MaxMin, a_in);
  auto [values, indices] = is_max ? internal::max(a, dim, keepdim) : internal::min(a, dim, keepdim);
  if (needs_grad(a)) {
    auto node = make_node<IndexedExtremumBackward>(a);
    node->indices = SavedTensor(indices, /*is_output=*/true);
    node->input_shape = a.shape();
    node->dim = a.dim() == 0 ? 0 : wrap_dim(dim, a.dim(), is_max ? "max" : "min");
    node->keepdim = keepdim;
    node->is_max = is_max;
    set_history(values, node);  // indices are integers: not differentiable
  }
  return {values, indices};
}

}  // namespace

std::tuple<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  capture::Op cap("max_dim");
  return cap.done(indexed_extremum(a, dim, keepdim, true), [&] {
    return capture::Args{{a}, {{"dim", dim}, {"keepdim", int64_t{keepdim}}}};
  });
}

std::tuple<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) {
  capture::Op cap("min_dim");
  return cap.done(indexed_extremum(a, dim, keepdim, false), [&] {
    return capture::Args{{a}, {{"dim", dim}, {"keepdim", int64_t{keepdim}}}};
  });
}

namespace {

// ---------------------------------------------------------------- var, std, var_mean
// var = sum((a - mean)^2) / (N - correction):
//   d var / da = 2 (a - mean) / (N - correction)         (the mean's own dependence on a cancels)
//   d std / da = (a - mean) / ((N - correction) * std)    (inf/NaN where std = 0, as in PyTorch)
//   d mean / da = 1 / N
// One node serves all three; var_mean's node has two outputs (var, mean), either of whose gradients may
// be missing.
struct VarianceBackward final : Node {
  enum class Kind { Var, Std, VarMean };
  Kind kind = Kind::Var;
  SavedTensor input, result;  // result: std (Kind::Std only)
  Dims dims;
  bool keepdim = false;
  int64_t correction = 1;
  std::string_view name() const override {
    return kind == Kind::Var ? "VarBackward" : kind == Kind::Std ? "StdBackward" : "VarMeanBackward";
  }
  TensorList apply(TensorList&& grads) override {
    const Tensor a = input.unpack(*this);
    const double count = static_cast<double>(reduced_count(a, dims));
    const double dof = count - static_cast<double>(correction);
    Tensor grad;
    if (grads[0].defined()) {
      const Tensor centered = internal::sub(a, internal::mean(a, dims, /*keepdim=*/true));  // input shape
      const Tensor g = keep_reduced(grads[0], dims, keepdim);
      if (kind == Kind::Std) {
        const Tensor s = keep_reduced(result.unpack(*this), dims, keepdim);
        grad = internal::div(internal::mul(centered, g), internal::mul(s, dof));
      } else {
        grad = internal::mul(internal::mul(centered, g), 2.0 / dof);
      }
    }
    if (kind == Kind::VarMean && grads.size() > 1 && grads[1].defined()) {
      const Tensor gm = internal::expand(internal::div(keep_reduced(grads[1], dims, keepdim), count), a.shape());
      grad = grad.defined() ? internal::add(grad, gm) : gm;
    }
    return {grad};
  }
  void release_saved() override {
    input.reset();
    result.reset();
  }
};

std::shared_ptr<VarianceBackward> variance_node(const Tensor& a, const Dims& dims, int64_t correction, bool keepdim,
                                                VarianceBackward::Kind kind, std::string_view op) {
  auto node = make_node<VarianceBackward>(a);
  node->kind = kind;
  node->input = SavedTensor(a, false);
  node->dims = reduced_dims(dims, a.dim(), op);
  node->keepdim = keepdim;
  node->correction = correction;
  return node;
}

}  // namespace

Tensor var(const Tensor& a_in, const Dims& dims, int64_t correction, bool keepdim) {
  capture::Op cap("var");
  auto [a] = autocast::inputs(Op::Var, a_in);
  Tensor out = internal::var(a, dims, correction, keepdim);
  if (needs_grad(a)) {
    set_history(out, variance_node(a, dims, correction, keepdim, VarianceBackward::Kind::Var, "var"));
  }
  return cap.done(out, [&] {
    return capture::Args{{a_in}, {{"dims", dims}, {"correction", correction}, {"keepdim", int64_t{keepdim}}}};
  });
}

Tensor std(const Tensor& a_in, const Dims& dims, int64_t correction, bool keepdim) {
  capture::Op cap("std");
  auto [a] = autocast::inputs(Op::Std, a_in);
  Tensor out = internal::std(a, dims, correction, keepdim);
  if (needs_grad(a)) {
    auto node = variance_node(a, dims, correction, keepdim, VarianceBackward::Kind::Std, "std");
    set_history(out, node);
    node->result = SavedTensor(out, /*is_output=*/true);
  }
  return cap.done(out, [&] {
    return capture::Args{{a_in}, {{"dims", dims}, {"correction", correction}, {"keepdim", int64_t{keepdim}}}};
  });
}

std::tuple<Tensor, Tensor> var_mean(const Tensor& a_in, const Dims& dims, int64_t correction, bool keepdim) {
  auto [a] = autocast::inputs(Op::Var, a_in);
  auto [v, m] = internal::var_mean(a, dims, correction, keepdim);
  if (needs_grad(a)) {
    auto node = variance_node(a, dims, correction, keepdim, VarianceBackward::Kind::VarMean, "var_mean");
    set_history(v, node);  // output 0
    set_history(m, node);  // output 1
  }
  return {v, m};
}

namespace {

// ---------------------------------------------------------------- norm
// n = (sum |a|^p)^(1/p):
//   p = 2:    g * a / n                          (0 for a zero slice, as in PyTorch)
//   p = 1:    g * sign(a)
//   p = inf:  g * sign(a) at the elements with |a| = n, split evenly among ties (-inf: |a| = min)
//   p = 0:    0 (n counts non-zeros)
//   other p:  g * sign(a) |a|^(p-1) / n^(p-1)    (0 for a zero slice)
struct NormBackward final : Node {
  SavedTensor input, result;
  Shape input_shape;
  double p = 2;
  Dims dims;
  bool keepdim = false;
  std::string_view name() const override { return "NormBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor g = keep_reduced(grads[0], dims, keepdim);
    if (p == 0) return {internal::zeros(input_shape, g.options())};
    const Tensor a = input.unpack(*this);
    if (p == 1) return {internal::mul(g, internal::sign(a))};
    const Tensor n = keep_reduced(result.unpack(*this), dims, keepdim);
    if (std::isinf(p)) {
      const Tensor mask = internal::eq(internal::abs(a), n);
      return {internal::mul(split_among(g, mask, dims), internal::sign(a))};
    }
    const Tensor zero_norm = internal::eq(n, 0.0);
    if (p == 2) return {internal::mul(g, internal::div(a, internal::where(zero_norm, 1.0, n)))};  // a = 0 where n = 0
    const Tensor scale = internal::where(zero_norm, 0.0, internal::div(g, internal::pow(n, p - 1)));
    return {internal::mul(internal::mul(scale, internal::sign(a)), internal::pow(internal::abs(a), p - 1))};
  }
  void release_saved() override {
    input.reset();
    result.reset();
  }
};

}  // namespace

Tensor norm(const Tensor& a_in, double p, const Dims& dims, bool keepdim) {
  capture::Op cap("norm");
  auto [a] = autocast::inputs(Op::Norm, a_in);
  Tensor out = internal::norm(a, p, dims, keepdim);
  return cap.done(record<NormBackward>(out, a,
                                       [&, &a = a](NormBackward& node) {
                                         node.p = p;
                                         node.input_shape = a.shape();
                                         node.dims = reduced_dims(dims, a.dim(), "norm");
                                         node.keepdim = keepdim;
                                         if (p != 0) node.input = SavedTensor(a, false);
                                         if (p != 0 && p != 1) node.result = SavedTensor(out, /*is_output=*/true);
                                       }),
                  [&] {
                    return capture::Args{{a_in}, {{"p", p}, {"dims", dims}, {"keepdim", int64_t{keepdim}}}};
                  });
}

namespace {

// ---------------------------------------------------------------- logsumexp
// d/da log(sum exp a) = exp(a - out): the softmax of a over the reduced dims.
struct LogSumExpBackward final : Node {
  SavedTensor input, result;
  Dims dims;
  bool keepdim = false;
  std::string_view name() const override { return "LogSumExpBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor a = input.unpack(*this);
    const Tensor out = keep_reduced(result.unpack(*this), dims, keepdim);
    return {internal::mul(keep_reduced(grads[0], dims, keepdim), internal::exp(internal::sub(a, out)))};
  }
  void release_saved() override {
    input.reset();
    result.reset();
  }
};

}  // namespace

Tensor logsumexp(const Tensor& a_in, const Dims& dims, bool keepdim) {
  capture::Op cap("logsumexp");
  auto [a] = autocast::inputs(Op::LogSumExp, a_in);
  Tensor out = internal::logsumexp(a, dims, keepdim);
  return cap.done(record<LogSumExpBackward>(out, a,
                                            [&, &a = a](LogSumExpBackward& node) {
                                              node.input = SavedTensor(a, false);
                                              node.dims = reduced_dims(dims, a.dim(), "logsumexp");
                                              node.keepdim = keepdim;
                                              node.result = SavedTensor(out, /*is_output=*/true);
                                            }),
                  [&] {
                    return capture::Args{{a_in}, {{"dims", dims}, {"keepdim", int64_t{keepdim}}}};
                  });
}

}  // namespace kiln
