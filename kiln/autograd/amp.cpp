// amp::Autocast: an autocast::Guard plus a weight-cast cache region, and the region's FP8 recipe.
#include "kiln/autograd/amp.h"

#include <utility>

#include "kiln/tensor/cuda.h"   // the compute capability of the current GPU, for FP8
#include "kiln/tensor/error.h"  // KILN_CHECK

namespace kiln::amp {
namespace {

std::shared_ptr<const Fp8Recipe> checked_recipe(std::optional<Fp8Recipe> recipe, DeviceType device_type, bool enabled) {
  if (!recipe) return nullptr;
  recipe->validate();
  // FP8 tensor cores arrived with sm_89 (Ada) and sm_90 (Hopper). Checked for the current GPU where one is visible
  // (without one, CUDA tensors cannot exist and the FP8 path is never reached).
  if (enabled && device_type == DeviceType::CUDA && cuda::is_available()) {
    const int device = cuda::current_device();
    const int cc = cuda::compute_capability(device);
    KILN_CHECK_AS(NotImplementedError, cc >= 89, "amp::Autocast: FP8 (AutocastOptions::fp8) needs a GPU of compute ",
                  "capability 8.9 or newer (sm_89+: Ada or Hopper) for its FP8 tensor cores, but cuda:", device,
                  " is sm_", cc, "; use bf16 autocast (leave AutocastOptions::fp8 unset) on this GPU");
  }
  return std::make_shared<const Fp8Recipe>(std::move(*recipe));
}

}  // namespace

Autocast::Autocast(DType dtype, bool enabled, DeviceType device_type) : guard_(device_type, dtype, enabled) {}

Autocast::Autocast(DType dtype, AutocastOptions options)
    : fp8_(checked_recipe(std::move(options.fp8), options.device_type, options.enabled)),
      guard_(options.device_type, dtype, options.enabled) {
  if (options.enabled && fp8_) autocast::set_fp8_recipe(options.device_type, fp8_);
}

}  // namespace kiln::amp
