// Frontend of the copy ops: argument checks, promotion, output allocation, then the backend.
#include "kiln/tensor/ops.h"

#include "kiln/tensor/backend.h"

namespace kiln::ops {

Tensor& copy_(Tensor& dst, const Tensor& src, bool non_blocking) {
  throw NotImplementedError("ops::copy_: not implemented yet");
}

Tensor to(const Tensor& t, Device device, std::optional<DType> dtype, bool non_blocking) {
  throw NotImplementedError("ops::to: not implemented yet");
}

Tensor cast(const Tensor& t, DType dtype) {
  throw NotImplementedError("ops::cast: not implemented yet");
}

Tensor contiguous(const Tensor& t, MemoryFormat format) {
  throw NotImplementedError("ops::contiguous: not implemented yet");
}

Tensor clone(const Tensor& t, MemoryFormat format) {
  throw NotImplementedError("ops::clone: not implemented yet");
}

Tensor& fill_(Tensor& t, Scalar value) {
  throw NotImplementedError("ops::fill_: not implemented yet");
}

}  // namespace kiln::ops
