// Indexing ops, forward and backward side by side. Each gradient sends g back along the same index:
// what gather/index_select read is summed back with scatter_add/index_add, what scatter wrote is
// read back with gather. Index tensors and masks get no gradient.

#include "kiln/autograd/ops/op_recording.h"
#include "kiln/tensor/capture.h"

namespace kiln {

namespace {

Tensor zeros_for(const Tensor& g, const Shape& shape) {
  return internal::zeros(shape, {.dtype = g.dtype(), .device = g.device()});
}

// t placed in the leading block of zeros of `shape` (scatter reads only the leading index.shape()
// block of a larger src; the rest of src gets no gradient).
Tensor pad_to(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  Tensor out = zeros_for(t, shape);
  Tensor block = out;
  for (int64_t d = 0; d < t.dim(); ++d) block = internal::narrow(block, d, 0, t.size(d));
  internal::copy_(block, t);
  return out;
}

// ---------------------------------------------------------------- index_select: out = a[..., index, ...]
//                                                                   gather: out[i][j] = a[index[i][j]][j] (dim 0)
// d/da: g summed back into the positions read (an index may repeat): with index_add for index_select, with
// scatter_add for gather.
struct IndexReadBackward final : Node {
  bool is_gather = false;
  Shape input_shape;
  int64_t dim = 0;
  SavedTensor index;
  std::string_view name() const override { return is_gather ? "GatherBackward" : "IndexSelectBackward"; }
  TensorList apply(TensorList&& grads) override {
    const auto sum_back = is_gather ? &internal::scatter_add : &internal::index_add;
    return {sum_back(zeros_for(grads[0], input_shape), dim, index.unpack(*this), grads[0])};
  }
  void release_saved() override { index.reset(); }
};

// ---------------------------------------------------------------- scatter, scatter_add (and their in-place forms)
// scatter: the written positions of a are overwritten, so a's gradient is g with them zeroed; src's is g
// read at those positions. scatter_add: a passes g through; src's is the same gather.
struct ScatterBackward final : Node {
  bool accumulate = false;
  bool has_src = true;  // false for scatter of a scalar value
  int64_t dim = 0;
  Shape src_shape;
  SavedTensor index;
  std::string_view name() const override { return accumulate ? "ScatterAddBackward" : "ScatterBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor idx = index.unpack(*this);
    Tensor ga, gsrc;
    if (needs_input_grad(0)) ga = accumulate ? g : internal::scatter(g, dim, idx, Scalar(0));
    if (has_src && needs_input_grad(1)) gsrc = pad_to(internal::gather(g, dim, idx), src_shape);
    if (!has_src) return {ga};
    return {ga, gsrc};
  }
  void release_saved() override { index.reset(); }
};

// ---------------------------------------------------------------- index_add: out = a; out[index] += src (along dim)
struct IndexAddBackward final : Node {
  int64_t dim = 0;
  Shape src_shape;
  SavedTensor index;
  std::string_view name() const override { return "IndexAddBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor gsrc;
    // A 0-d a takes a src of one element of any rank: reshape to it.
    if (needs_input_grad(1)) gsrc = internal::reshape(internal::index_select(g, dim, index.unpack(*this)), src_shape);
    return {needs_input_grad(0) ? g : Tensor(), gsrc};
  }
  void release_saved() override { index.reset(); }
};

// ---------------------------------------------------------------- masked_select: out = a[mask] (1-D, broadcast)
// g goes back to the true positions of the broadcast mask, in row-major order; zeros elsewhere. The
// gradient has the broadcast shape; the engine sums it down to a's.
struct MaskedSelectBackward final : Node {
  Shape shape;  // broadcast of a's and mask's shapes
  SavedTensor mask;
  std::string_view name() const override { return "MaskedSelectBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const int64_t n = numel(shape);
    const Tensor flat_mask = internal::reshape(internal::contiguous(internal::expand(mask.unpack(*this), shape)), {n});
    const Tensor positions = internal::nonzero(flat_mask);  // (count, 1)
    const Tensor flat = internal::index_add(zeros_for(g, {n}), 0, internal::reshape(positions, {positions.size(0)}), g);
    return {internal::reshape(flat, shape)};
  }
  void release_saved() override { mask.reset(); }
};

// ---------------------------------------------------------------- embedding: out[..., :] = weight[index[...], :]
// d/dweight: the rows of g summed into the rows they were read from. index gets none.
// Where the table's other uses have begun its gradient (a language model's output layer that shares the table), the
// engine offers that sum, and the rows are added into it in place: no table of zeros, and no addition of two tables.
struct EmbeddingBackward final : Node {
  Shape weight_shape;  // (V, D)
  SavedTensor index;
  std::string_view name() const override { return "EmbeddingBackward"; }
  bool accepts_gradient_buffers() const override { return true; }
  TensorList apply(TensorList&& grads) override {
    const Tensor idx = index.unpack(*this);
    const int64_t n = idx.numel();
    const Tensor rows = internal::reshape(grads[0], {n, weight_shape[1]});  // (N, D)
    const Tensor offered = offered_buffers().empty() ? Tensor() : offered_buffers()[0];
    Tensor sum = offered.defined() && offered.dtype() == rows.dtype() && offered.device() == rows.device() &&
                         offered.shape() == weight_shape
                     ? offered
                     : zeros_for(grads[0], weight_shape);
    internal::index_add_(sum, 0, internal::reshape(idx, {n}), rows);
    return {sum};
  }
  void release_saved() override { index.reset(); }
};

// ---------------------------------------------------------------- sort, topk: values = a gathered at indices
// Each value came from one input position (indices along dim are distinct): g is scattered back there.
struct SortBackward final : Node {
  std::string_view op_name;
  Shape input_shape;
  int64_t dim = 0;
  SavedTensor indices;
  std::string_view name() const override { return op_name; }
  TensorList apply(TensorList&& grads) override {
    return {internal::scatter(zeros_for(grads[0], input_shape), dim, indices.unpack(*this), grads[0])};
  }
  void release_saved() override { indices.reset(); }
};

// ---------------------------------------------------------------- tril, triu
// The kept triangle passes g through; the zeroed one gets none: the same triangle of g.
struct TriangleBackward final : Node {
  bool lower = true;
  int64_t diagonal = 0;
  std::string_view name() const override { return lower ? "TrilBackward" : "TriuBackward"; }
  TensorList apply(TensorList&& grads) override {
    return {lower ? internal::tril(grads[0], diagonal) : internal::triu(grads[0], diagonal)};
  }
};

std::shared_ptr<ScatterBackward> scatter_node(const Tensor& a, int64_t dim, const Tensor& index, const Tensor* src,
                                              bool accumulate) {
  auto node = src ? make_node<ScatterBackward>(a, *src) : make_node<ScatterBackward>(a);
  node->accumulate = accumulate;
  node->has_src = src != nullptr;
  node->dim = dim;
  if (src) node->src_shape = src->shape();
  const bool a_needs_index = !accumulate && node->needs_input_grad(0);
  if (a_needs_index || (src && node->needs_input_grad(1))) node->index = SavedTensor(index, false);
  return node;
}

Tensor scatter_impl(const Tensor& a_in, int64_t dim, const Tensor& index, const Tensor& src_in, bool accumulate) {
  auto [a, src] = autocast::inputs(accumulate ? Op::ScatterAdd : Op::Scatter, a_in, src_in);
  Tensor out = accumulate ? internal::scatter_add(a, dim, index, src) : internal::scatter(a, dim, index, src);
  if (needs_grad(a, src)) set_history(out, scatter_node(a, dim, index, &src, accumulate));
  return out;
}

// In place: the node is made before the op, so that its edge to a is a's history before the write.
Tensor& scatter_inplace(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src, bool accumulate) {
  const bool record = autograd::check_inplace(a, needs_grad(src), accumulate ? "scatter_add_" : "scatter_");
  std::shared_ptr<ScatterBackward> node;
  if (record) node = scatter_node(a, dim, index, &src, accumulate);
  if (accumulate) internal::scatter_add_(a, dim, index, src);
  else internal::scatter_(a, dim, index, src);
  if (record) set_history(a, node);
  return a;
}

std::tuple<Tensor, Tensor> record_sort(std::tuple<Tensor, Tensor> result, const Tensor& a, int64_t dim,
                                       std::string_view name) {
  auto& [values, indices] = result;
  if (!needs_grad(a)) return result;
  auto node = make_node<SortBackward>(a);
  node->op_name = name;
  node->input_shape = a.shape();
  node->dim = dim;
  node->indices = SavedTensor(indices, /*is_output=*/true);
  set_history(values, node);  // indices are integers: not differentiable
  return result;
}

Tensor triangle(const Tensor& a_in, int64_t diagonal, bool lower) {
  auto [a] = autocast::inputs(lower ? Op::Tril : Op::Triu, a_in);
  Tensor out = lower ? internal::tril(a, diagonal) : internal::triu(a, diagonal);
  return record<TriangleBackward>(out, a, [&](TriangleBackward& node) {
    node.lower = lower;
    node.diagonal = diagonal;
  });
}

Tensor index_read(const Tensor& a_in, int64_t dim, const Tensor& index, bool is_gather) {
  auto [a] = autocast::inputs(is_gather ? Op::Gather : Op::IndexSelect, a_in);
  Tensor out = is_gather ? internal::gather(a, dim, index) : internal::index_select(a, dim, index);
  return record<IndexReadBackward>(out, a, [&, &a = a](IndexReadBackward& node) {
    node.is_gather = is_gather;
    node.input_shape = a.shape();
    node.dim = dim;
    node.index = SavedTensor(index, false);
  });
}

}  // namespace

Tensor index_select(const Tensor& a_in, int64_t dim, const Tensor& index) {
  capture::Op cap("index_select");
  return cap.done(index_read(a_in, dim, index, false), [&] { return capture::Args{{a_in, index}, {{"dim", dim}}}; });
}
Tensor gather(const Tensor& a_in, int64_t dim, const Tensor& index) {
  capture::Op cap("gather");
  return cap.done(index_read(a_in, dim, index, true), [&] { return capture::Args{{a_in, index}, {{"dim", dim}}}; });
}

Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_impl(a, dim, index, src, false);
}

Tensor scatter(const Tensor& a_in, int64_t dim, const Tensor& index, Scalar value) {
  auto [a] = autocast::inputs(Op::Scatter, a_in);
  Tensor out = internal::scatter(a, dim, index, value);
  if (needs_grad(a)) set_history(out, scatter_node(a, dim, index, nullptr, false));
  return out;
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_impl(a, dim, index, src, true);
}

Tensor& scatter_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_inplace(a, dim, index, src, false);
}

Tensor& scatter_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  return scatter_inplace(a, dim, index, src, true);
}

Tensor index_add(const Tensor& a_in, int64_t dim, const Tensor& index, const Tensor& src_in) {
  auto [a, src] = autocast::inputs(Op::IndexAdd, a_in, src_in);
  return record<IndexAddBackward>(internal::index_add(a, dim, index, src), a, src,
                                  [&, &src = src](IndexAddBackward& node) {
                                    node.dim = dim;
                                    node.src_shape = src.shape();
                                    if (node.needs_input_grad(1)) node.index = SavedTensor(index, false);
                                  });
}

Tensor masked_select(const Tensor& a_in, const Tensor& mask) {
  auto [a] = autocast::inputs(Op::MaskedSelect, a_in);
  return record<MaskedSelectBackward>(internal::masked_select(a, mask), a, [&, &a = a](MaskedSelectBackward& node) {
    node.shape = broadcast_shapes(a.shape(), mask.shape(), "masked_select");
    node.mask = SavedTensor(mask, false);
  });
}

Tensor embedding(const Tensor& weight_in, const Tensor& index) {
  capture::Op cap("embedding");
  auto [weight] = autocast::inputs(Op::Embedding, weight_in);
  return cap.done(record<EmbeddingBackward>(internal::embedding(weight, index), weight,
                                            [&, &weight = weight](EmbeddingBackward& node) {
                                              node.weight_shape = weight.shape();
                                              node.index = SavedTensor(index, false);
                                            }),
                  [&] {
                    return capture::Args{{weight_in, index}, {}};
                  });
}

std::tuple<Tensor, Tensor> sort(const Tensor& a_in, int64_t dim, bool descending, bool stable) {
  auto [a] = autocast::inputs(Op::Sort, a_in);
  return record_sort(internal::sort(a, dim, descending, stable), a, dim, "SortBackward");
}

std::tuple<Tensor, Tensor> topk(const Tensor& a_in, int64_t k, int64_t dim, bool largest, bool sorted) {
  auto [a] = autocast::inputs(Op::Topk, a_in);
  return record_sort(internal::topk(a, k, dim, largest, sorted), a, dim, "TopkBackward");
}

Tensor tril(const Tensor& a, int64_t diagonal) {
  capture::Op cap("tril");
  return cap.done(triangle(a, diagonal, true), [&] { return capture::Args{{a}, {{"diagonal", diagonal}}}; });
}
Tensor triu(const Tensor& a, int64_t diagonal) {
  capture::Op cap("triu");
  return cap.done(triangle(a, diagonal, false), [&] { return capture::Args{{a}, {{"diagonal", diagonal}}}; });
}

}  // namespace kiln
