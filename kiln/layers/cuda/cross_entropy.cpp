// nn::cross_entropy's fused CUDA path (cross_entropy.h): autocast, the (R, C) row view of the logits, and
// the autograd node around the kernels of cross_entropy.cu.
#include "kiln/layers/autocast_ops.h"
#include "kiln/layers/cuda/cross_entropy.h"
#include "kiln/tensor/trace.h"  // a range per kernel entry

#include <vector>

#include "kiln/autograd/autocast.h"    // autocast::target_dtype, cast_to
#include "kiln/autograd/function.h"    // autograd::Function
#include "kiln/autograd/grad_mode.h"   // GradMode
#include "kiln/tensor/internal_ops.h"  // internal::sum, internal::div, internal::reshape

namespace kiln::nn::cuda_impl {
namespace {

// What backward needs beside the logits and lse (targets and weights are never differentiated here).
struct Params {
  Tensor target;      // (R) Int64, contiguous
  Tensor weight;      // (C) in the compute dtype, or undefined
  Tensor weight_sum;  // 0-d, only with a weight and label smoothing
  int64_t ignore_index = -100;
  double smoothing = 0;
  Reduction reduction = Reduction::Mean;
  DType out_dtype = DType::Float32;
};

struct CrossEntropyFunction : autograd::Function<CrossEntropyFunction> {
  // rows (R, C) -> (R) for Reduction::None, else 0-d; in p.out_dtype.
  static Tensor forward(autograd::Context& ctx, const Tensor& rows, const Params& p) {
    CrossEntropyRows r = cross_entropy_rows(rows, p.target, p.weight, p.ignore_index, p.smoothing);
    Tensor out, denominator;
    switch (p.reduction) {
      case Reduction::None: out = r.loss; break;
      case Reduction::Sum: out = internal::sum(r.loss); break;
      case Reduction::Mean:
        // The sum of w[t] over the kept rows stays on the device: 0 when every row is ignored (loss NaN).
        denominator = internal::sum(r.weights);
        out = internal::div(internal::sum(r.loss), denominator);
        break;
    }
    ctx.save_for_backward({rows, r.lse});
    ctx.set("params", p);
    ctx.set("denominator", denominator);
    return out.to(p.out_dtype);
  }

  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grad_outputs) {
    if (!ctx.needs_input_grad(0)) return {Tensor()};
    const autograd::TensorList saved = ctx.saved();
    const Tensor &rows = saved[0], &lse = saved[1];
    const auto p = ctx.get<Params>("params");
    const Tensor g = grad_outputs[0].to(lse.dtype()).contiguous();  // (R) or 0-d
    return {cross_entropy_rows_backward(rows, p.target, p.weight, p.weight_sum, lse, g, ctx.get<Tensor>("denominator"),
                                        p.ignore_index, p.smoothing)};
  }
};

}  // namespace

bool cross_entropy_fits(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  if (!logits.defined() || !logits.is_cuda() || logits.dim() < 2 || logits.size(1) == 0) return false;
  if (!target.defined() || !is_integral(target.dtype()) || target.device() != logits.device()) return false;
  const Tensor& w = options.weight;
  if (!w.defined()) return true;
  return w.is_floating_point() && w.device() == logits.device() && !(w.requires_grad() && GradMode::is_enabled());
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  trace::Scope range(trace::Kind::Op, "cross_entropy", logits.device(), {&logits, &target});
  // Autocast: with autocast_ops::cross_entropy() in float32 (the default policy), 16-bit logits are read as they are
  // and computed in float32, rather than cast to a float32 copy first; the loss is float32 as the policy says.
  Tensor x = logits;
  DType out_dtype = x.dtype();
  if (const auto cast = autocast::target_dtype(autocast_ops::cross_entropy(), x.device(), x.dtype());
      cast && *cast != x.dtype()) {
    const bool narrow = x.dtype() == DType::Float16 || x.dtype() == DType::BFloat16;
    if (!(narrow && *cast == DType::Float32)) x = autocast::cast_to(x, *cast);
    out_dtype = *cast;
  }
  const int64_t c = x.size(1);
  const DType acc = x.dtype() == DType::Float64 ? DType::Float64 : DType::Float32;

  // (N, C, d1, ...) -> (N, d1, ..., C) -> (R, C): the classes of a row become adjacent (one copy).
  Tensor rows = x;
  if (x.dim() > 2) {
    Dims order{0};
    for (int64_t d = 2; d < x.dim(); ++d) order.push_back(d);
    order.push_back(1);
    rows = reshape(permute(x, order), {-1, c});
  }

  Params p;
  p.target = internal::reshape(target, {-1}).to(DType::Int64).contiguous();
  if (options.weight.defined()) {
    p.weight = options.weight.detach().to(acc).contiguous();
    if (options.label_smoothing > 0) p.weight_sum = internal::sum(p.weight);
  }
  p.ignore_index = options.ignore_index;
  p.smoothing = options.label_smoothing;
  p.reduction = options.reduction;
  p.out_dtype = out_dtype;
  Tensor loss = CrossEntropyFunction::apply(rows, p);
  return options.reduction == Reduction::None ? reshape(loss, target.shape()) : loss;
}

}  // namespace kiln::nn::cuda_impl
