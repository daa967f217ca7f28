// kiln/data/gpu_decode/crop_resize.h — the kernel that turns decoded images into a batch: crop, bilinear resize,
// horizontal flip, scale to [0, 1], normalise, write float32 or bfloat16, NCHW or NHWC (crop_resize.cu). The
// decoded images are interleaved RGB, or JPEG's own planes (luma and subsampled chroma, converted to RGB here).
// Plain types only: the caller (gpu_collate.cpp) is a C++ file.
#pragma once

#include <cstdint>

namespace kiln::data::gpu {

// How an image's decoded pixels lie in memory.
enum class PixelLayout : int32_t {
  kRgb = 0,    // (H, W, 3) uint8, interleaved
  kYCbCr = 1,  // JPEG's planes (nvJPEG's YUV output): luma (H, W), then Cb and Cr (chroma_height, chroma_width)
  kGray = 2,   // luma (H, W) only
};

// Where the planes of a kYCbCr or kGray image are, from the start of its pixels. Luma rows are W bytes apart,
// chroma rows chroma_width. The chroma planes are subsampled by chroma_fx across and chroma_fy down (1, 2 or 4:
// 4:2:0 is 2 and 2), their samples centred on the luma samples they cover (JFIF).
struct Planes {
  PixelLayout layout = PixelLayout::kRgb;
  int32_t chroma_fx = 1, chroma_fy = 1;
  int32_t chroma_width = 0, chroma_height = 0;
  int32_t pad = 0;
  int64_t cb_offset = 0, cr_offset = 0;  // bytes
};

// One image of the batch: where its decoded pixels are and which part of them becomes the output.
struct CropJob {
  int64_t src_offset = 0;  // bytes from the batch's pixel buffer to the image's pixels
  Planes planes;           // how they lie there
  int32_t src_height = 0, src_width = 0;
  // Source y of output row oy: box_top + (oy + 0.5) * scale_y - 0.5, clamped to [clamp_top, clamp_bottom]
  // (pixel centres, as torchvision's resize with align_corners=False); x likewise.
  float box_top = 0, box_left = 0, scale_y = 1, scale_x = 1;
  float clamp_top = 0, clamp_left = 0, clamp_bottom = 0, clamp_right = 0;  // inclusive, in pixels
  int32_t flip = 0;                                                        // mirror left-right
  int32_t pad = 0;
};

struct CropResizeParams {
  const CropJob* jobs = nullptr;  // device array of `count`
  int count = 0;
  const uint8_t* pixels = nullptr;  // device
  void* out = nullptr;              // (count, 3, out_height, out_width), device
  int out_height = 0, out_width = 0;
  bool bfloat16 = false;       // else float32
  bool channels_last = false;  // NHWC memory, else NCHW
  float scale[3] = {1, 1, 1};  // per channel: out = v * scale + shift, v in 0..255
  float shift[3] = {0, 0, 0};  // (v / 255 - mean) / std = v * (1 / (255 std)) - mean / std
};

// Queues the kernel on `stream` (a cudaStream_t). No host synchronisation.
void launch_crop_resize(const CropResizeParams& p, void* stream);

}  // namespace kiln::data::gpu
