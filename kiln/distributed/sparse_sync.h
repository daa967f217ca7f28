// kiln/distributed/sparse_sync.h — averaging row-sparse gradients over the ranks, for embedding tables that every
// rank holds whole (replicated) while dist::DataParallel averages the dense parameters.
//
//   dist::DataParallel bottom_ddp(model->bottom), top_ddp(model->top);   // the dense parts
//   loss.backward();
//   dist::all_gather_sparse_grads(model->tables->parameters());        // every rank: all ranks' rows, / world size
//   opt.step();                                                          // the same update on every rank
//
// DataParallel's gradient hooks do not see sparse gradients (kiln/autograd/sparse_grad.h); this is their
// counterpart. Each rank's rows are gathered (indices and values, of different counts per rank), concatenated in
// rank order and divided by the world size, so that the gradient is the mean over ranks as DataParallel's is, and
// each rank's optimizer then applies the same update to its replica. Costs one small all-gather of the row counts and
// two all-gathers per table; on a GPU the counts are read on the host.
#pragma once

#include <vector>

#include "kiln/distributed/process_group.h"
#include "kiln/tensor/tensor.h"

namespace kiln::dist {

// Replaces each sparse gradient of `params` by the mean over the ranks of `group` (null: dist::group of the first
// parameter's device). Parameters without a sparse gradient must have none on every rank (kiln::Error otherwise,
// naming the parameter's position). Every rank calls it with the same parameters in the same order.
void all_gather_sparse_grads(const std::vector<Tensor>& params, ProcessGroup* group = nullptr);

}  // namespace kiln::dist
