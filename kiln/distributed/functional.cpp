// Collectives as differentiable ops (functional.h).
#include "kiln/distributed/functional.h"

#include "kiln/autograd/function.h"   // autograd::Function: forward and backward side by side
#include "kiln/autograd/functions.h"  // kiln::clone
#include "kiln/tensor/error.h"        // KILN_CHECK

namespace kiln::dist::functional {
namespace {

// y = sum over ranks of t. The collective works in place, so both directions reduce a private contiguous
// copy: the caller's tensor (forward) and the engine's gradient buffer (backward), which other nodes may
// still read, are never written.
struct AllReduceSum : autograd::Function<AllReduceSum> {
  static Tensor forward(autograd::Context& ctx, const Tensor& t, ProcessGroup* group) {
    Tensor out = clone(t, MemoryFormat::Contiguous);
    group->all_reduce(out, ReduceOp::Sum);
    // The group found now is the one backward uses, even if the caller passed null.
    ctx.set("group", group);
    return out;
  }
  // L = sum_r L_r and y = sum_r t_r, so d L / d t_r = d L / d y = sum_r d L_r / d y: the same reduction.
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    Tensor g = clone(grads[0], MemoryFormat::Contiguous);
    ctx.get<ProcessGroup*>("group")->all_reduce(g, ReduceOp::Sum);
    return {g};
  }
};

}  // namespace

Tensor all_reduce_sum(const Tensor& t, ProcessGroup* group) {
  KILN_CHECK(t.defined(), "dist::functional::all_reduce_sum: the tensor is undefined; pass a defined tensor");
  KILN_CHECK(t.is_floating_point(), "dist::functional::all_reduce_sum: expected a floating-point tensor (it is ",
             "differentiable), got ", t.dtype(), " of shape ", t.shape(), "; use dist::all_reduce for other dtypes");
  ProcessGroup* pg = group != nullptr ? group : &dist::group(t.device());
  return AllReduceSum::apply(t, pg);
}

}  // namespace kiln::dist::functional
