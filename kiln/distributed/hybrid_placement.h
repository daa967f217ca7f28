// kiln/distributed/hybrid_placement.h — one placement of nn::HybridEmbedding's rows on every rank, for tables that
// every rank holds whole (replicated) under data parallelism.
//
//   auto env = dist::init();                         // mpirun -np N
//   auto model = nn::make<Dlrm>(...);                // holds nn::HybridEmbedding tables (count_batches = 20, say)
//   dist::share_placement(*model);                   // on every rank, before the first training step
//   for (...) {                                      // every rank runs the same steps
//     opt.zero_grad();
//     loss = ...model->forward(...)...;              // the 21st call rebalances, on every rank, from all ranks' counts
//     loss.backward();
//     dist::all_gather_sparse_grads(model->tables->parameters());   // both tiers' sparse gradients averaged
//     opt.step();
//   }
//
// Each rank counts the lookups of its own batches; with a count reduction installed, each rebalance (automatic or
// manual) first sums the lookups counted since the last agreement over the ranks and adds them to every rank's
// counts, so every rank places the same rows hot, and the replicas' tiers, their gradients (gathered by slot) and
// their optimizer state keep matching. The sum moves one (V) Int64 array per table and rebalance, through MPI.
// nn::HybridEmbedding::agree_counts() agrees without rebalancing (before saving a checkpoint, say).
#pragma once

#include <cstdint>
#include <functional>

#include "kiln/distributed/process_group.h"  // ProcessGroup
#include "kiln/layers/module.h"              // nn::Module

namespace kiln::dist {

// Sets count_reduction of every nn::HybridEmbedding of `model` (the model itself and every descendant) to
// dist::sum_counts(group), and returns how many tables it set. Call it on every rank before the first training-mode
// forward call (the counts present then count as agreed: zero, or loaded from a checkpoint). Calling it again
// replaces the reductions; setting a table's count_reduction to nullptr undoes it for that table. At world size 1
// the sum is a no-op, so a program may call it unconditionally.
int64_t share_placement(nn::Module& model, ProcessGroup* group = nullptr);

// The reduction share_placement installs: sums an Int64 tensor on the CPU over the ranks of `group`, in place (null:
// the CPU group, dist::group(Device::cpu()), looked up at each call; MPI under mpirun). The tensor travels in pieces
// of at most 2^30 elements (what one MPI call moves). kiln::Error for a group that is not on the CPU (the counts
// live in host memory).
std::function<void(Tensor& counts)> sum_counts(ProcessGroup* group = nullptr);

}  // namespace kiln::dist
