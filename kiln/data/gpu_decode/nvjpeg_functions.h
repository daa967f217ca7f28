// kiln/data/gpu_decode/nvjpeg_functions.h — the nvJPEG entry points kiln uses, typed from nvjpeg.h (only in
// builds with the header: KILN_WITH_NVJPEG).
#pragma once

#include <nvjpeg.h>  // nvJPEG's types and declarations (third_party/nvjpeg/include)

#include <string>

namespace kiln::data::nvjpeg {

// decltype of the declarations keeps the calls honest: a signature that changes fails to compile.
struct Functions {
  decltype(&nvjpegGetProperty) get_property = nullptr;
  decltype(&nvjpegCreateEx) create_ex = nullptr;
  decltype(&nvjpegDestroy) destroy = nullptr;
  decltype(&nvjpegJpegStateCreate) state_create = nullptr;
  decltype(&nvjpegJpegStateDestroy) state_destroy = nullptr;
  decltype(&nvjpegGetImageInfo) get_image_info = nullptr;
  decltype(&nvjpegDecode) decode = nullptr;
  decltype(&nvjpegDecodeBatchedInitialize) batched_initialize = nullptr;
  decltype(&nvjpegDecodeBatched) decode_batched = nullptr;
  decltype(&nvjpegJpegStreamCreate) stream_create = nullptr;
  decltype(&nvjpegJpegStreamDestroy) stream_destroy = nullptr;
  decltype(&nvjpegJpegStreamParse) stream_parse = nullptr;
  decltype(&nvjpegDecodeBatchedSupported) batched_supported = nullptr;
  decltype(&nvjpegJpegStreamGetComponentsNum) stream_components = nullptr;
  decltype(&nvjpegJpegStreamGetComponentDimensions) stream_component_size = nullptr;
  decltype(&nvjpegJpegStreamGetChromaSubsampling) stream_subsampling = nullptr;
  decltype(&nvjpegSetDeviceMemoryPadding) set_device_padding = nullptr;
  decltype(&nvjpegSetPinnedMemoryPadding) set_pinned_padding = nullptr;
};

// "NVJPEG_STATUS_BAD_JPEG (the file is not a valid JPEG)".
std::string status_text(nvjpegStatus_t status);

}  // namespace kiln::data::nvjpeg
