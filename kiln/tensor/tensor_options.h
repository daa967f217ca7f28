// kiln/tensor/tensor_options.h — what a factory makes: dtype, device, memory format, pinned host memory.
//
//   auto x = kiln::zeros({8, 3, 32, 32}, {.dtype = DType::Float16, .device = Device::cuda(0),
//                                         .memory_format = MemoryFormat::ChannelsLast});
#pragma once

#include <optional>

#include "kiln/tensor/device.h"
#include "kiln/tensor/dtype.h"

namespace kiln {

// How the elements of a tensor are laid out in memory. The logical shape is always NCHW (row-major
// indexing); ChannelsLast only changes strides: a 4-D (N, C, H, W) tensor gets strides (H*W*C, 1, W*C, C).
enum class MemoryFormat : uint8_t {
  Contiguous,    // row-major
  ChannelsLast,  // NHWC in memory, 4-D tensors only
  Preserve,      // keep the input's format (for *_like factories, clone, contiguous)
};
std::ostream& operator<<(std::ostream& os, MemoryFormat f);  // "contiguous", "channels_last", ...

// The dtype, device, memory format and pinning a factory makes a tensor with.
struct TensorOptions {
  // Unset means the factory's default: kDefaultFloat, except where the values decide (arange and full
  // of integers give Int64, of bools Bool).
  std::optional<DType> dtype{};
  Device device = Device::cpu();                          // where the tensor is made
  MemoryFormat memory_format = MemoryFormat::Contiguous;  // the stride order (ChannelsLast: 4-D only)
  bool pinned_memory = false;                             // page-locked host memory, for asynchronous copies to a GPU
};

}  // namespace kiln
