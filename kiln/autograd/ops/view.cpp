// View ops, forward and backward side by side. A view's gradient goes to its base: reshaped back,
// permuted back, summed over expanded dims, or written into the viewed region of zeros of the base's
// shape. Raw view ops that return their input itself (squeeze of a dim that is not 1, expand to the same
// shape, ...) record nothing: the result is the input, with the input's history.
#include <algorithm>
#include <functional>
#include <string_view>
#include "kiln/autograd/ops/op_recording.h"
#include "kiln/tensor/capture.h"

namespace kiln {

namespace {

// Zeros of `shape` in g's dtype, on g's device: the gradient of a base outside the viewed region.
Tensor zeros_for(const Tensor& g, const Shape& shape) {
  return internal::zeros(shape, {.dtype = g.dtype(), .device = g.device()});
}

// ---------------------------------------------------------------- view, reshape, flatten, unflatten, squeeze,
// unsqueeze Same elements in the same row-major order: the gradient is g reshaped to the input's shape.
struct ReshapeBackward final : Node {
  std::string_view op_name;
  Shape input_shape;
  std::string_view name() const override { return op_name; }
  TensorList apply(TensorList&& grads) override { return {internal::reshape(grads[0], input_shape)}; }

 protected:
  std::optional<DType> other_gradient_dtype(uint32_t) const override { return dtype_all_next_accept(); }
};

// ---------------------------------------------------------------- permute, transpose
// out dim i is input dim dims[i]: the inverse permutation brings g back.
struct PermuteBackward final : Node {
  std::string_view op_name;
  Dims inverse;
  std::string_view name() const override { return op_name; }
  TensorList apply(TensorList&& grads) override { return {internal::permute(grads[0], inverse)}; }

 protected:
  std::optional<DType> other_gradient_dtype(uint32_t) const override { return dtype_all_next_accept(); }
};

// ---------------------------------------------------------------- expand
// An expanded dim reads one element many times: its gradient is the sum over those reads.
struct ExpandBackward final : Node {
  Shape input_shape;
  std::string_view name() const override { return "ExpandBackward"; }
  TensorList apply(TensorList&& grads) override { return {autograd::sum_to(grads[0], input_shape)}; }
};

// ---------------------------------------------------------------- narrow, slice, select, diagonal
// The view picks a region of the input: g goes into that region of zeros of the input's shape
// (`region` applies the same view op to the zeros; a view of distinct elements, so a copy suffices).
struct RegionBackward final : Node {
  std::string_view op_name;
  Shape input_shape;
  std::function<Tensor(const Tensor&)> region;
  std::string_view name() const override { return op_name; }
  TensorList apply(TensorList&& grads) override {
    Tensor gi = zeros_for(grads[0], input_shape);
    Tensor part = region(gi);
    internal::copy_(part, grads[0]);
    return {gi};
  }
};

// ---------------------------------------------------------------- as_strided
// Any sizes and strides, overlapping or not, over the input taken as contiguous (forward checks that it
// is): the flat input position of each output element is as_strided of arange(numel) with the same
// sizes, strides and offset, and g is summed into those positions (elements read twice get both).
struct AsStridedBackward final : Node {
  Shape input_shape;
  Shape sizes;
  Strides strides;
  int64_t offset = 0;  // relative to the input's first element
  std::string_view name() const override { return "AsStridedBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const int64_t n = numel(input_shape);
    const Tensor positions = internal::as_strided(internal::arange(n, {.dtype = DType::Int64, .device = g.device()}),
                                                  sizes, strides, offset);
    Tensor flat =
        internal::index_add(zeros_for(g, {n}), 0, internal::reshape(positions, {-1}), internal::reshape(g, {-1}));
    return {internal::reshape(flat, input_shape)};
  }
};

// ---------------------------------------------------------------- split, split_with_sizes, chunk, unbind
// One node for all the pieces: each received gradient goes into its piece of zeros of the input's
// shape; pieces that received none (undefined) stay zero.
struct SplitBackward final : Node {
  std::string_view op_name;
  Shape input_shape;
  int64_t dim = 0;
  bool select = false;          // unbind: piece i is index i of dim, which the piece does not have
  std::vector<int64_t> starts;  // split: piece i is [starts[i], starts[i] + lengths[i]) of dim
  std::vector<int64_t> lengths;
  std::string_view name() const override { return op_name; }
  // Whether the pieces' gradients already are the pieces of one contiguous tensor of the input's shape, each where
  // its piece lies (as a fused attention writes the gradients of a split QKV projection): that tensor is then the
  // gradient, without a copy.
  Tensor tiled(const TensorList& grads) const {
    const Tensor& first = grads[0];
    const Strides strides = contiguous_strides(input_shape);
    for (size_t i = 0; i < grads.size(); ++i) {
      const Tensor& g = grads[i];
      if (g.impl().storage() != first.impl().storage() || g.dtype() != first.dtype() || g.strides() != strides ||
          g.offset() != first.offset() + starts[i] * strides[static_cast<size_t>(dim)]) {
        return {};
      }
    }
    return internal::as_strided(first, input_shape, strides, first.offset());
  }
  TensorList apply(TensorList&& grads) override {
    // Every piece of a split got a gradient: they tile the input, so the gradient is their concatenation (one
    // pass, no zeros written first), or no pass at all when they lie side by side in one tensor already.
    if (!select && !grads.empty() &&
        std::all_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); })) {
      if (Tensor whole = tiled(grads); whole.defined()) return {whole};
      return {internal::cat(std::vector<Tensor>(grads.begin(), grads.end()), dim)};
    }
    Tensor gi;
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      if (!gi.defined()) gi = zeros_for(grads[i], input_shape);
      Tensor part = select ? internal::select(gi, dim, static_cast<int64_t>(i))
                           : internal::narrow(gi, dim, starts[i], lengths[i]);
      internal::copy_(part, grads[i]);
    }
    return {gi};
  }
};

// Records a single-output view whose gradient is g reshaped to the input's shape.
Tensor record_reshape(Tensor out, const Tensor& t, std::string_view name) {
  if (out.is_same(t) || !needs_grad(t)) return out;
  auto node = make_node<ReshapeBackward>(t);
  node->op_name = name;
  node->input_shape = t.shape();
  set_history(out, node);
  return out;
}

// Records a view of a region of t; `region` re-applies the view to a tensor of t's shape.
Tensor record_region(Tensor out, const Tensor& t, std::string_view name, std::function<Tensor(const Tensor&)> region) {
  if (out.is_same(t) || !needs_grad(t)) return out;
  auto node = make_node<RegionBackward>(t);
  node->op_name = name;
  node->input_shape = t.shape();
  node->region = std::move(region);
  set_history(out, node);
  return out;
}

// Records the pieces of a split of t along `dim` (unbind: `select`), all outputs of one node.
std::vector<Tensor> record_split(std::vector<Tensor> parts, const Tensor& t, int64_t dim, std::string_view name,
                                 bool select) {
  if (parts.empty() || !needs_grad(t)) return parts;
  if (parts.size() == 1 && parts[0].is_same(t)) return parts;  // split of an empty dim gives the input back
  auto node = make_node<SplitBackward>(t);
  node->op_name = name;
  node->input_shape = t.shape();
  node->dim = wrap_dim(dim, t.dim(), name);
  node->select = select;
  int64_t start = 0;
  for (const Tensor& p : parts) {
    const int64_t length = select ? 1 : p.size(node->dim);
    node->starts.push_back(start);
    node->lengths.push_back(length);
    start += length;
  }
  for (const Tensor& p : parts) set_history(p, node);
  return parts;
}

// slice's arguments; an absent start or end is left out.
std::vector<capture::Attr> slice_attrs(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end,
                                       int64_t step) {
  std::vector<capture::Attr> attrs{{"dim", dim}, {"step", step}};
  if (start) attrs.push_back({"start", *start});
  if (end) attrs.push_back({"end", *end});
  return attrs;
}

}  // namespace

Tensor view(const Tensor& t_in, const Shape& shape) {
  capture::Op cap("view");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_reshape(internal::view(t, shape), t, "ViewBackward"), [&] {
    return capture::Args{{t_in}, {{"shape", shape}}};
  });
}

Tensor reshape(const Tensor& t_in, const Shape& shape) {
  capture::Op cap("reshape");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_reshape(internal::reshape(t, shape), t, "ReshapeBackward"), [&] {
    return capture::Args{{t_in}, {{"shape", shape}}};
  });
}

Tensor flatten(const Tensor& t_in, int64_t start_dim, int64_t end_dim) {
  capture::Op cap("flatten");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_reshape(internal::flatten(t, start_dim, end_dim), t, "FlattenBackward"), [&] {
    return capture::Args{{t_in}, {{"start_dim", start_dim}, {"end_dim", end_dim}}};
  });
}

Tensor unflatten(const Tensor& t_in, int64_t dim, const Shape& sizes) {
  capture::Op cap("unflatten");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_reshape(internal::unflatten(t, dim, sizes), t, "UnflattenBackward"), [&] {
    return capture::Args{{t_in}, {{"dim", dim}, {"sizes", sizes}}};
  });
}

Tensor squeeze(const Tensor& t_in) {
  capture::Op cap("squeeze");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_reshape(internal::squeeze(t), t, "SqueezeBackward"), [&] {
    return capture::Args{{t_in}, {}};
  });
}

Tensor squeeze(const Tensor& t_in, int64_t dim) {
  capture::Op cap("squeeze");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_reshape(internal::squeeze(t, dim), t, "SqueezeBackward"), [&] {
    return capture::Args{{t_in}, {{"dim", dim}}};
  });
}

Tensor unsqueeze(const Tensor& t_in, int64_t dim) {
  capture::Op cap("unsqueeze");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_reshape(internal::unsqueeze(t, dim), t, "UnsqueezeBackward"), [&] {
    return capture::Args{{t_in}, {{"dim", dim}}};
  });
}

Tensor permute(const Tensor& t_in, const Dims& dims) {
  capture::Op cap("permute");
  const auto describe = [&] { return capture::Args{{t_in}, {{"dims", dims}}}; };
  auto [t] = autocast::inputs(Op::View, t_in);
  Tensor out = internal::permute(t, dims);
  if (out.is_same(t) || !needs_grad(t)) return cap.done(out, describe);
  auto node = make_node<PermuteBackward>(t);
  node->op_name = "PermuteBackward";
  node->inverse.resize(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    node->inverse[wrap_dim(dims[i], t.dim(), "permute")] = static_cast<int64_t>(i);
  set_history(out, node);
  return cap.done(out, describe);
}

Tensor transpose(const Tensor& t_in, int64_t dim0, int64_t dim1) {
  capture::Op cap("transpose");
  const auto describe = [&] { return capture::Args{{t_in}, {{"dim0", dim0}, {"dim1", dim1}}}; };
  auto [t] = autocast::inputs(Op::View, t_in);
  Tensor out = internal::transpose(t, dim0, dim1);
  if (out.is_same(t) || !needs_grad(t)) return cap.done(out, describe);  // 0-d: transpose is the input itself
  auto node = make_node<PermuteBackward>(t);
  node->op_name = "TransposeBackward";
  // A transposition is its own inverse.
  for (int64_t d = 0; d < t.dim(); ++d) node->inverse.push_back(d);
  std::swap(node->inverse[wrap_dim(dim0, t.dim(), "transpose")], node->inverse[wrap_dim(dim1, t.dim(), "transpose")]);
  set_history(out, node);
  return cap.done(out, describe);
}

Tensor expand(const Tensor& t_in, const Shape& shape) {
  capture::Op cap("expand");
  const auto describe = [&] { return capture::Args{{t_in}, {{"shape", shape}}}; };
  auto [t] = autocast::inputs(Op::View, t_in);
  Tensor out = internal::expand(t, shape);
  if (out.is_same(t) || !needs_grad(t)) return cap.done(out, describe);
  auto node = make_node<ExpandBackward>(t);
  node->input_shape = t.shape();
  set_history(out, node);
  return cap.done(out, describe);
}

Tensor narrow(const Tensor& t_in, int64_t dim, int64_t start, int64_t length) {
  capture::Op cap("narrow");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_region(internal::narrow(t, dim, start, length), t, "NarrowBackward",
                                [=](const Tensor& z) { return internal::narrow(z, dim, start, length); }),
                  [&] {
                    return capture::Args{{t_in}, {{"dim", dim}, {"start", start}, {"length", length}}};
                  });
}

Tensor slice(const Tensor& t_in, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) {
  capture::Op cap("slice");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_region(internal::slice(t, dim, start, end, step), t, "SliceBackward",
                                [=](const Tensor& z) { return internal::slice(z, dim, start, end, step); }),
                  [&] {
                    return capture::Args{{t_in}, slice_attrs(dim, start, end, step)};
                  });
}

Tensor select(const Tensor& t_in, int64_t dim, int64_t index) {
  capture::Op cap("select");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_region(internal::select(t, dim, index), t, "SelectBackward",
                                [=](const Tensor& z) { return internal::select(z, dim, index); }),
                  [&] {
                    return capture::Args{{t_in}, {{"dim", dim}, {"index", index}}};
                  });
}

Tensor diagonal(const Tensor& t_in, int64_t offset, int64_t dim1, int64_t dim2) {
  capture::Op cap("diagonal");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_region(internal::diagonal(t, offset, dim1, dim2), t, "DiagonalBackward",
                                [=](const Tensor& z) { return internal::diagonal(z, offset, dim1, dim2); }),
                  [&] {
                    return capture::Args{{t_in}, {{"offset", offset}, {"dim1", dim1}, {"dim2", dim2}}};
                  });
}

Tensor as_strided(const Tensor& t_in, const Shape& sizes, const Strides& strides, std::optional<int64_t> offset) {
  capture::Op cap("as_strided");
  const auto describe = [&] { return capture::Args{{t_in}, {{"sizes", sizes}, {"strides", strides}}}; };
  auto [t] = autocast::inputs(Op::View, t_in);
  Tensor out = internal::as_strided(t, sizes, strides, offset);
  if (out.is_same(t) || !needs_grad(t)) return cap.done(out, describe);
  // The backward maps storage positions to input elements, which is only exact for a contiguous input
  // whose elements cover every position the view reads.
  const int64_t relative = offset.value_or(t.offset()) - t.offset();
  int64_t last = relative;
  for (size_t i = 0; i < sizes.size(); ++i) last += sizes[i] > 0 ? (sizes[i] - 1) * strides[i] : 0;
  const bool empty_view = numel(sizes) == 0;
  KILN_CHECK(t.is_contiguous(), "as_strided: gradients through as_strided need a contiguous input, got shape ",
             t.shape(), " with strides ", t.strides(), "; call .contiguous() first");
  KILN_CHECK(empty_view || (relative >= 0 && last < t.numel()), "as_strided: the view (sizes ", sizes, ", strides ",
             strides, ", offset ", offset.value_or(t.offset()), ") reads memory outside the input (shape ", t.shape(),
             ", offset ", t.offset(), "), so no gradient can reach it; view only the input's own elements");
  auto node = make_node<AsStridedBackward>(t);
  node->input_shape = t.shape();
  node->sizes = sizes;
  node->strides = strides;
  node->offset = empty_view ? 0 : relative;
  set_history(out, node);
  return cap.done(out, describe);
}

std::vector<Tensor> split(const Tensor& t_in, int64_t split_size, int64_t dim) {
  capture::Op cap("split");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_split(internal::split(t, split_size, dim), t, dim, "SplitBackward", false), [&] {
    return capture::Args{{t_in}, {{"split_size", split_size}, {"dim", dim}}};
  });
}

std::vector<Tensor> split_with_sizes(const Tensor& t_in, const std::vector<int64_t>& sizes, int64_t dim) {
  capture::Op cap("split_with_sizes");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_split(internal::split_with_sizes(t, sizes, dim), t, dim, "SplitWithSizesBackward", false),
                  [&] {
                    return capture::Args{{t_in}, {{"sizes", sizes}, {"dim", dim}}};
                  });
}

std::vector<Tensor> chunk(const Tensor& t_in, int64_t chunks, int64_t dim) {
  capture::Op cap("chunk");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_split(internal::chunk(t, chunks, dim), t, dim, "ChunkBackward", false), [&] {
    return capture::Args{{t_in}, {{"chunks", chunks}, {"dim", dim}}};
  });
}

std::vector<Tensor> unbind(const Tensor& t_in, int64_t dim) {
  capture::Op cap("unbind");
  auto [t] = autocast::inputs(Op::View, t_in);
  return cap.done(record_split(internal::unbind(t, dim), t, dim, "UnbindBackward", true), [&] {
    return capture::Args{{t_in}, {{"dim", dim}}};
  });
}

}  // namespace kiln
