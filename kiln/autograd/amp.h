// kiln/autograd/amp.h — amp::Autocast: a mixed-precision region (per thread, nestable) with the weight-cast cache.
//
//   Tensor loss;
//   {
//     amp::Autocast cast(DType::BFloat16);            // CUDA ops: matmuls/convs in bf16, softmax/losses in fp32
//     loss = nn::cross_entropy(model(x), y);           // each parameter is cast to bf16 once in this region
//   }                                                  // outermost exit: cast cache emptied, previous state back
//   loss.backward();                                   // float32 gradients in the float32 parameters
//
// Which op runs in which dtype is kiln::autocast's policy table (autocast.h, beside this file). On top of
// autocast::Guard this adds autocast::CacheRegion: within the outermost Autocast, casting the same float32
// parameter (a leaf that requires grad) to the same low dtype returns the same cast tensor (recomputed after an
// in-place update of the parameter), as torch.autocast does; after a fused optimizer step that cast is the
// 16-bit copy the step wrote (autocast::shadow), so the region launches no cast. `enabled = false` turns
// autocast off for the device type inside the region (as torch.autocast(enabled=False)); the previous state
// returns at exit.
#pragma once

#include "kiln/autograd/autocast.h"
#include "kiln/tensor/tensor.h"

namespace kiln::amp {

class Autocast {
 public:
  // dtype: DType::Float16 or DType::BFloat16 (anything else throws kiln::Error).
  explicit Autocast(DType dtype, bool enabled = true, DeviceType device_type = DeviceType::CUDA);
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  autocast::Guard guard_;         // constructed first, destroyed last: the state outlives the cache
  autocast::CacheRegion region_;  // the outermost region's exit clears the weight-cast cache
};

}  // namespace kiln::amp
