// amp::Autocast: an autocast::Guard plus a weight-cast cache region, whose outermost instance casts up front the
// parameters that earlier regions cast.
#include "kiln/optim/amp.h"

#include <map>
#include <vector>

#include "kiln/tensor/ops.h"

#if KILN_WITH_CUDA
#include "kiln/optim/cuda/fused.h"
#include "kiln/optim/grad_groups.h"  // flat_dense
#endif

namespace kiln::amp {
namespace {

// The parameters earlier regions cast to `dtype` on `device_type`, cast now and put in the cache. CUDA parameters
// whose elements fill a dense run (contiguous or channels-last) go through one multi-tensor launch per device; the
// others are cast one by one by cast_to().
void cast_up_front(DType dtype, DeviceType device_type) {
  const std::vector<Tensor> params = autocast::cast_candidates(dtype, device_type);
  if (params.empty()) return;
  std::map<int, std::vector<Tensor>> sources, results;  // by CUDA device index
  for (const Tensor& p : params) {
#if KILN_WITH_CUDA
    if (p.is_cuda() && optim::detail::flat_dense(p)) {
      Tensor values = ops::empty_strided(p.shape(), p.strides(), {.dtype = dtype, .device = p.device()});
      sources[p.device().index()].push_back(p);
      results[p.device().index()].push_back(std::move(values));
      continue;
    }
#endif
    autocast::cast_to(p, dtype);  // cached there
  }
#if KILN_WITH_CUDA
  for (auto& [device, srcs] : sources) {
    std::vector<Tensor>& dsts = results[device];
    optim::cuda_impl::fused_cast(srcs, dsts);
    for (size_t i = 0; i < srcs.size(); ++i) autocast::cache_cast(srcs[i], std::move(dsts[i]));
  }
#endif
}

}  // namespace

Autocast::Autocast(DType dtype, bool enabled, DeviceType device_type, std::source_location site)
    : guard_(device_type, dtype, enabled), region_({site.file_name(), site.line(), site.column()}) {
  if (enabled) cast_up_front(dtype, device_type);
}

}  // namespace kiln::amp
