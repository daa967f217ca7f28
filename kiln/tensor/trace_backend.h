// kiln/tensor/trace_backend.h — the backend wrapper that marks a trace range around each op (internal to
// kiln_tensor; backend() uses it while a trace listener is installed).
#pragma once

#include "kiln/tensor/backend.h"

namespace kiln::detail {

// The real backend of a device type, never the tracing wrapper.
Backend& backend_untraced(DeviceType type);
// The tracing wrapper of a real backend.
Backend& tracing_backend(Backend& inner);

}  // namespace kiln::detail
