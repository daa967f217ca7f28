// kiln/distributed/functional.h — collectives as differentiable ops: gradients flow through them.
//
//   using namespace kiln;
//   Tensor local = x.sum({0});                                 // (C), x requires grad
//   Tensor global = dist::functional::all_reduce_sum(local);   // (C): the sum over every rank
//   Tensor loss = (global * w).sum();
//   loss.backward();                // backward all-reduces d loss / d global, so x.grad() is the gradient of
//                                   // the sum of every rank's loss
//
// dist::all_reduce (process_group.h) works in place and records nothing in the autograd graph; these return
// a new tensor and record a node. What SyncBatchNorm builds on (sync_batch_norm.h).
#pragma once

#include "kiln/distributed/process_group.h"  // ProcessGroup
#include "kiln/tensor/tensor.h"              // Tensor

namespace kiln::dist::functional {

// The elementwise sum of t over every rank of `group` (null: dist::group(t.device()), looked up now), as a
// new contiguous tensor of t's shape and dtype; t is unchanged. Its backward sums the incoming gradient over
// the ranks the same way: y = sum_r t_r, so d(sum_r L_r)/d t_r = sum_r' d L_r'/d y. With world size 1 it is
// a copy and its backward passes the gradient through. Every rank must call it, and run backward through it,
// in the same order as the others: each is a collective.
Tensor all_reduce_sum(const Tensor& t, ProcessGroup* group = nullptr);

}  // namespace kiln::dist::functional
