// cat and stack, forward and backward side by side: each input's gradient is its piece of g.

#include "kiln/autograd/ops/op_recording.h"
#include "kiln/tensor/capture.h"

namespace kiln {

namespace {

// ---------------------------------------------------------------- cat: out = [t0 | t1 | ...] along dim
// Input i's gradient is g narrowed to [start_i, start_i + size_i) along dim. 1-D empty inputs, which
// cat skips beside tensors of other ranks, get an empty gradient.
struct CatBackward final : Node {
  int64_t dim = 0;
  std::vector<int64_t> starts, lengths;
  std::vector<bool> skipped;
  std::string_view name() const override { return "CatBackward"; }
  TensorList apply(TensorList&& grads) override {
    TensorList out(starts.size());
    for (size_t i = 0; i < out.size(); ++i) {
      if (!needs_input_grad(i)) continue;
      // A skipped input gets an empty gradient of its shape [0] (not undefined: its own node may not
      // expect an undefined gradient).
      out[i] = skipped[i] ? internal::zeros({0}, {.dtype = grads[0].dtype(), .device = grads[0].device()})
                          : internal::narrow(grads[0], dim, starts[i], lengths[i]);
    }
    return out;
  }

 protected:
  // Each input's gradient is a slice of the gradient received: it may come in the dtype all of them take.
  std::optional<DType> other_gradient_dtype(uint32_t) const override { return dtype_all_next_accept(); }
};

// ---------------------------------------------------------------- stack: out[..., i, ...] = t_i
struct StackBackward final : Node {
  int64_t dim = 0;
  size_t count = 0;
  std::string_view name() const override { return "StackBackward"; }
  TensorList apply(TensorList&& grads) override {
    TensorList out(count);
    for (size_t i = 0; i < count; ++i) {
      if (needs_input_grad(i)) out[i] = internal::select(grads[0], dim, static_cast<int64_t>(i));
    }
    return out;
  }
};

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors_in, int64_t dim) {
  capture::Op cap("cat");
  const std::vector<Tensor> tensors = autocast::inputs_list(Op::Cat, tensors_in);
  Tensor out = internal::cat(tensors, dim);
  return cap.done(record<CatBackward>(out, tensors,
                                      [&](CatBackward& node) {
                                        node.dim = wrap_dim(dim, out.dim(), "cat");
                                        int64_t start = 0;
                                        for (const Tensor& t : tensors) {
                                          // The same rule as the raw cat: a 1-D empty tensor is skipped when the result
                                          // has another rank.
                                          const bool skip =
                                              t.dim() == 1 && t.size(0) == 0 && (out.dim() != 1 || node.dim != 0);
                                          const int64_t length = skip ? 0 : t.size(node.dim);
                                          node.skipped.push_back(skip);
                                          node.starts.push_back(start);
                                          node.lengths.push_back(length);
                                          start += length;
                                        }
                                      }),
                  [&] {
                    return capture::Args{tensors_in, {{"dim", dim}}};
                  });
}

Tensor stack(const std::vector<Tensor>& tensors_in, int64_t dim) {
  capture::Op cap("stack");
  const std::vector<Tensor> tensors = autocast::inputs_list(Op::Stack, tensors_in);
  Tensor out = internal::stack(tensors, dim);
  return cap.done(record<StackBackward>(out, tensors,
                                        [&](StackBackward& node) {
                                          node.dim = wrap_dim(dim, out.dim(), "stack");
                                          node.count = tensors.size();
                                        }),
                  [&] {
                    return capture::Args{tensors_in, {{"dim", dim}}};
                  });
}

}  // namespace kiln
