// kiln/distributed/hybrid_placement.cpp — share_placement: the sum over the ranks behind nn::HybridEmbedding's
// count_reduction, installed on every hybrid table of a model.
#include "kiln/distributed/hybrid_placement.h"

#include <algorithm>  // std::min
#include <string>

#include "kiln/layers/hybrid_embedding.h"  // nn::HybridEmbedding::count_reduction
#include "kiln/tensor/error.h"             // KILN_CHECK
#include "kiln/tensor/internal_ops.h"      // internal::narrow, reshape

namespace kiln::dist {

namespace {

constexpr int64_t kPiece = int64_t{1} << 30;  // elements per all_reduce: below MPI's count limit of 2^31 - 1

}  // namespace

std::function<void(Tensor& counts)> sum_counts(ProcessGroup* group) {
  KILN_CHECK(group == nullptr || group->device().is_cpu(), "dist::sum_counts: the given ", group->backend(),
             " group works on ", group->device(),
             "; the counts live in host memory: give a CPU group (MPI), or none for dist::group(Device::cpu())");
  return [group](Tensor& counts) {
    KILN_CHECK(counts.defined() && counts.dtype() == DType::Int64 && counts.is_cpu() && counts.is_contiguous(),
               "dist::sum_counts: expected a contiguous Int64 tensor on the CPU, got ",
               counts.defined() ? ::kiln::detail::str_cat(counts.dtype(), " of shape ", counts.shape(), " on ",
                                                          counts.device(), counts.is_contiguous() ? "" : ", strided")
                                : std::string("an undefined tensor"));
    ProcessGroup& g = group != nullptr ? *group : dist::group(Device::cpu());
    const int64_t n = counts.numel();
    const Tensor flat = internal::reshape(counts, {n});  // (n), a view: the pieces write into counts
    for (int64_t first = 0; first < n; first += kPiece)
      g.all_reduce(internal::narrow(flat, 0, first, std::min(kPiece, n - first)));
  };
}

int64_t share_placement(nn::Module& model, ProcessGroup* group) {
  const std::function<void(Tensor&)> sum = sum_counts(group);
  int64_t tables = 0;
  for (const nn::ModulePtr& m : model.modules()) {
    if (auto* table = dynamic_cast<nn::HybridEmbedding*>(m.get())) {
      table->count_reduction = sum;
      ++tables;
    }
  }
  return tables;
}

}  // namespace kiln::dist
