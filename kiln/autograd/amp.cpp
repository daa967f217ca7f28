// amp::Autocast: an autocast::Guard plus a weight-cast cache region.
#include "kiln/autograd/amp.h"

namespace kiln::amp {

Autocast::Autocast(DType dtype, bool enabled, DeviceType device_type) : guard_(device_type, dtype, enabled) {}

}  // namespace kiln::amp
