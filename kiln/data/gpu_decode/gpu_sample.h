// kiln/data/gpu_decode/gpu_sample.h — one image as a worker thread prepares it for GPU decoding, and the collate
// function that decodes a batch of them on the GPU.
//
//   // In Dataset::get (a worker thread): read the file, parse its header, draw the crop and flip.
//   data::Example ex = data::gpu_sample(read_file_bytes(path), path, gpu_transform, rng, label, index);
//   // In the collate function (the same thread, a batch at a time): decode on the GPU, crop, resize, normalise.
//   data::CollateFn fn = data::gpu_decode_collate(gpu_transform, [&](int64_t i) { return path_of(i); });
//   data::Batch b = fn(examples, /*pinned=*/true);   // "image" on the GPU (b.ready), "label" on the host
//
// A sample's fields: "encoded" uint8 (n): the JPEG file's bytes, or for other formats (PNG, decoded on the CPU
// here) the (H, W, 3) RGB pixels; "plan" float64 (12): kind (0 JPEG, 1 pixels), height, width, box (top,
// left, height, width), clamp (top, left, height, width), flip; "label" int64; "index" int64 (the dataset's
// index, which names the file in errors).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/data/gpu_decode/crop_resize.h"  // Planes
#include "kiln/data/gpu_transform.h"

namespace kiln::data {

inline constexpr int64_t kGpuPlanFields = 12;

// The sample for GPU decoding of a file's bytes (a bad header throws kiln::Error naming the file).
Example gpu_sample(std::vector<uint8_t> bytes, const std::string& name, const GpuTransform& transform, SampleRng& rng,
                   int64_t label, int64_t index);

// The plan field's values, read back (for the collate function and tests).
struct GpuSamplePlan {
  bool is_jpeg = true;
  ImageSize size;
  GpuImagePlan plan;
};
GpuSamplePlan read_gpu_plan(const Example& sample);

// One decoded image in a batch's pixel buffer.
struct DecodedImage {
  int64_t offset = 0;  // bytes from the buffer's start to its pixels
  gpu::Planes planes;  // how they lie there (RGB, or JPEG's planes)
  ImageSize size;      // its height and width
  GpuImagePlan plan;   // the crop and flip drawn for it
};

// Queues the crop/resize/flip/normalise kernel on the current stream over `images`, decoded into `pixels` (a
// contiguous uint8 buffer on the GPU). Returns (N, 3, H, W) in the transform's output size, dtype and memory
// format (the collate function's last step).
Tensor gpu_crop_resize(const GpuTransform& transform, const Tensor& pixels, std::span<const DecodedImage> images);

// Decodes batches of gpu_sample()s on the current CUDA device (the loader's): JPEGs through nvJPEG, files
// nvJPEG cannot decode through libjpeg-turbo on the CPU (then uploaded), and the crop/resize/flip/normalise
// kernel, all queued on the calling thread's decoder stream; the batch's `ready` event marks the end. Output:
// "image" (N, 3, H, W) in the transform's dtype and memory format on the GPU, "label" int64 (N) on the host
// (pinned when asked). name_of(index) names a file in errors. Throws where there is no GPU or no nvJPEG,
// saying what to install or to decode on the CPU.
CollateFn gpu_decode_collate(GpuTransform transform, std::function<std::string(int64_t)> name_of);

}  // namespace kiln::data
