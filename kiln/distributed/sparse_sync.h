// kiln/distributed/sparse_sync.h — averaging row-sparse gradients over the ranks, for embedding tables that every
// rank holds whole (replicated) while dist::DataParallel averages the dense parameters.
//
//   dist::DataParallel bottom_ddp(model->bottom), top_ddp(model->top);   // the dense parts
//   loss.backward();
//   dist::all_gather_sparse_grads(model->tables->parameters());        // every rank: all ranks' rows, / world size
//   opt.step();                                                          // the same update on every rank
//
// DataParallel's gradient hooks do not see sparse gradients (kiln/autograd/sparse_grad.h); this is their counterpart.
// Each rank's rows are gathered (indices and values, of different counts per rank), concatenated in rank order and
// divided by the world size, so that the gradient is the mean over ranks as DataParallel's is, and each rank's
// optimizer then applies the same update to its replica. Costs one small all-gather of every table's row counts per
// group (read on the host: one wait for the GPU) and two all-gathers per table. With one rank it does nothing. Each
// parameter goes through the world group of its gradient's device, so an nn::HybridEmbedding's two tiers both work: the
// hot rows' gradient through NCCL (or MPI on the CPU), the cold rows' through MPI when they are in host memory (which
// needs a job started by mpirun: dist::group says so when it was not), or NCCL when they stayed on the GPU
// (ColdReads::Mapped, a device-held gradient: kiln/autograd/sparse_grad.h). Its placement must be the same on every
// rank: dist::share_placement (hybrid_placement.h).
#pragma once

#include <vector>

#include "kiln/distributed/process_group.h"
#include "kiln/tensor/tensor.h"

namespace kiln::dist {

// Replaces each sparse gradient of `params` by the mean over the ranks of `group` (null: each parameter's through
// dist::group of its gradient's device; a given group must work on every gradient's device, kiln::Error otherwise).
// Parameters without a sparse gradient must have none on every rank (kiln::Error otherwise, naming the parameter's
// position). Every rank calls it with the same parameters in the same order.
void all_gather_sparse_grads(const std::vector<Tensor>& params, ProcessGroup* group = nullptr);

}  // namespace kiln::dist
