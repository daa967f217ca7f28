// Finding the backend of a device type.
#include "kiln/tensor/backend.h"

#include "kiln/tensor/cpu/cpu_backend.h"

namespace kiln {

Backend& backend(DeviceType type) {
  if (type == DeviceType::CPU) return cpu::cpu_backend();
  KILN_FAIL("kiln has no CUDA backend in this build; keep tensors on Device::cpu()");
}

}  // namespace kiln
