// softmax and log_softmax, forward and backward side by side. Both save their result only.

#include "kiln/autograd/ops/op_recording.h"
#include "kiln/tensor/capture.h"

namespace kiln {

namespace {

// Sums t over `dim` keeping it as size 1; a 0-d tensor is its own (one-element) sum.
Tensor sum_keep(const Tensor& t, int64_t dim) { return t.dim() == 0 ? t : internal::sum(t, {dim}, /*keepdim=*/true); }

// y = softmax(a) along dim:      da = y * (g - sum(g * y, dim))
// y = log_softmax(a) along dim:  da = g - exp(y) * sum(g, dim)
struct SoftmaxBackward final : Node {
  SavedTensor result;
  int64_t dim = 0;
  bool log = false;
  std::string_view name() const override { return log ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    const Tensor y = result.unpack(*this);
    if (log) return {internal::sub(g, internal::mul(internal::exp(y), sum_keep(g, dim)))};
    return {internal::mul(y, internal::sub(g, sum_keep(internal::mul(g, y), dim)))};
  }
  void release_saved() override { result.reset(); }
};

Tensor softmax_impl(const Tensor& a_in, int64_t dim, bool log) {
  auto [a] = autocast::inputs(log ? Op::LogSoftmax : Op::Softmax, a_in);
  Tensor out = log ? internal::log_softmax(a, dim) : internal::softmax(a, dim);
  if (needs_grad(a)) {
    auto node = make_node<SoftmaxBackward>(a);
    node->dim = a.dim() == 0 ? 0 : wrap_dim(dim, a.dim(), log ? "log_softmax" : "softmax");
    node->log = log;
    set_history(out, node);
    node->result = SavedTensor(out, /*is_output=*/true);
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) {
  capture::Op cap("softmax");
  return cap.done(softmax_impl(a, dim, false), [&] { return capture::Args{{a}, {{"dim", dim}}}; });
}
Tensor log_softmax(const Tensor& a, int64_t dim) {
  capture::Op cap("log_softmax");
  return cap.done(softmax_impl(a, dim, true), [&] { return capture::Args{{a}, {{"dim", dim}}}; });
}

}  // namespace kiln
