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
//
// FP8 (delayed scaling, as NVIDIA Transformer Engine's): give the region a recipe, and the nn::Linear layers it
// selects compute their matrix products in FP8 on the GPU's FP8 tensor cores (sm_89+: Ada, Hopper):
//
//   amp::Fp8Recipe recipe{.format = amp::Fp8Format::Hybrid, .amax_history_len = 16, .margin = 0};
//   amp::prepare_fp8(*model, recipe, dev);            // kiln/layers/fp8_linear.h: FP8 state of the chosen Linears
//   {
//     amp::Autocast cast(DType::BFloat16, {.fp8 = recipe});
//     loss = nn::cross_entropy(model(x), y);           // Linears in FP8 (E4M3), everything else bf16 / float32
//   }
//   loss.backward();                                   // gradients in E5M2; float32 weight gradients
//
// The recipe (validated here) names the formats, the amax history length, the margin and which modules take part
// (by default every nn::Linear whose in and out features are multiples of 16); each chosen Linear keeps its scales
// and amax history as buffers ("fp8_amax_history", "fp8_scale", "fp8_scale_inv"), so checkpoints carry them. The
// innermost region decides: a nested Autocast without a recipe, or with enabled = false, turns FP8 off inside it.
// Asking for FP8 on a GPU older than sm_89 throws kiln::Error here (there is no silent bf16 fallback).
#pragma once

#include <memory>
#include <optional>

#include "kiln/autograd/autocast.h"
#include "kiln/autograd/fp8.h"  // Fp8Recipe
#include "kiln/tensor/tensor.h"

namespace kiln::amp {

// Options of an amp::Autocast region beyond its dtype (the FP8 recipe among them).
struct AutocastOptions {
  bool enabled = true;                        // false: autocast off for device_type inside the region
  DeviceType device_type = DeviceType::CUDA;  // the device type the region casts for
  std::optional<Fp8Recipe> fp8{};             // FP8 matrix products for the modules the recipe selects (nn::Linear)
};

// A scope in which the ops autocast lists run in a lower precision (bf16 or fp16; FP8 products with a recipe), as
// torch.autocast.
class Autocast {
 public:
  // dtype: DType::Float16 or DType::BFloat16 (anything else throws kiln::Error).
  explicit Autocast(DType dtype, bool enabled = true, DeviceType device_type = DeviceType::CUDA);
  // The same with options, and optionally an FP8 recipe: kiln::Error for an invalid recipe, and (device type CUDA)
  // when the current GPU cannot compute in FP8 (compute capability below 8.9).
  Autocast(DType dtype, AutocastOptions options);
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

  // The region's FP8 recipe, or nullptr.
  const Fp8Recipe* fp8_recipe() const { return fp8_.get(); }

 private:
  std::shared_ptr<const Fp8Recipe> fp8_;  // shared with the thread's autocast state (and copies of it)
  autocast::Guard guard_;                 // constructed before, destroyed after the cache: the state outlives the cache
  autocast::CacheRegion region_;          // the outermost region's exit clears the weight-cast cache
};

}  // namespace kiln::amp
