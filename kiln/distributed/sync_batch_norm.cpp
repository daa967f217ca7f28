// SyncBatchNorm (sync_batch_norm.h): a BatchNorm statistics reducer over a process group.
#include "kiln/distributed/sync_batch_norm.h"

#include <memory>

#include "kiln/distributed/environment.h"  // dist::world_size when no group is given
#include "kiln/distributed/functional.h"   // functional::all_reduce_sum: the differentiable collective
#include "kiln/layers/layers.h"            // nn::BatchNorm, nn::BatchNormStatsReducer

namespace kiln::dist {
namespace {

// Sums over `group_`, or over the world group of the statistics' device when null (looked up per call:
// the statistics live where the layer's input is).
class GroupStatsReducer final : public nn::BatchNormStatsReducer {
 public:
  explicit GroupStatsReducer(ProcessGroup* group) : group_(group) {}
  Tensor all_reduce_sum(const Tensor& t) override { return functional::all_reduce_sum(t, group_); }
  int world_size() const override { return group_ != nullptr ? group_->size() : dist::world_size(); }

 private:
  ProcessGroup* group_;
};

}  // namespace

int64_t convert_sync_batchnorm(nn::Module& model, ProcessGroup* group) {
  // One reducer shared by every layer: it holds no per-layer state.
  auto reducer = std::make_shared<GroupStatsReducer>(group);
  int64_t converted = 0;
  // modules() lists a layer registered under several names once, so each is counted once.
  for (const nn::ModulePtr& m : model.modules()) {
    if (auto* bn = dynamic_cast<nn::BatchNorm*>(m.get())) {
      bn->set_stats_reducer(reducer);
      ++converted;
    }
  }
  return converted;
}

}  // namespace kiln::dist
