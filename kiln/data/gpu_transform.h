// kiln/data/gpu_transform.h — what the GPU does to each decoded image, taken from a Compose, and the
// random choices for one image made on the CPU (the same draws as the Compose on the CPU).
//
//   auto gpu = data::GpuTransform::from(data::transforms::imagenet_train(224));
//   data::GpuImagePlan p = gpu.plan(data::image_size(bytes, "cat.jpg"), rng);   // p.box, p.flip
//
// The GPU runs one kernel per batch: crop the plan's box, resize it to the output size with bilinear
// filtering, mirror it when p.flip, scale to [0, 1] and normalise by (mean, std). Pipelines it takes:
//   RandomResizedCrop [RandomHorizontalFlip] ToTensor [Normalize]                (imagenet_train)
//   Resize [CenterCrop] [RandomHorizontalFlip] ToTensor [Normalize]              (imagenet_eval)
// Anything else (Lambda, RandomCrop with padding, ...) throws, naming the step: decode those on the CPU.
//
// Difference from the CPU transforms: the CPU resizes with an antialiased (area-weighted) filter, as
// torchvision's antialias=True, and rounds the resized image to uint8 before ToTensor; the GPU samples 2x2
// source pixels per output pixel (bilinear, half-pixel centres, as torchvision's antialias=False) and keeps the
// float value. Upscaling and mild downscaling agree to a level or two; boxes much larger than the output
// (a 0.9 area crop of a 4000-pixel photo to 224) alias where the CPU path smooths.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/data/image.h"
#include "kiln/data/sample_rng.h"
#include "kiln/data/transforms.h"

namespace kiln::data {

// Where an image folder's images are decoded: libjpeg-turbo/libpng in the loader's worker threads, or nvJPEG
// on the GPU in batches (kiln/data/gpu_decode/gpu_collate.h).
enum class Decode { Cpu, Gpu };

// One image's choices. `box` is the source region that becomes the output (fractional for Resize +
// CenterCrop), `clamp` the pixels bilinear sampling may read (the box's pixels for a crop that is resized,
// as torchvision crops first; the whole image for Resize + CenterCrop), both in source pixels.
struct GpuImagePlan {
  Box box{};          // the source region that becomes the output
  Box clamp{};        // the source pixels bilinear sampling may read
  bool flip = false;  // mirror the output left-right
};

// How many images this process's GPU decoding (gpu_decode_collate, ImageFolder with Decode::Gpu) has decoded
// since it started, by path: in one batched call to the GPU's JPEG engines (nvJPEG's hardware backend: A100, H100,
// H200), one at a time by nvJPEG's default backend (JPEGs the engines do not take, such as progressive ones; every
// JPEG unless KILN_NVJPEG_HARDWARE=1 turns the engines on, on GPUs that have them), or on the CPU and uploaded (PNGs,
// and JPEGs nvJPEG cannot decode or whose marker structure is broken: CMYK, damaged). All zero in a build without GPU
// decoding.
struct GpuDecodeCounts {
  int64_t engines = 0;        // JPEGs decoded in batches by the JPEG engines
  int64_t one_at_a_time = 0;  // JPEGs decoded one at a time by nvJPEG's default backend
  int64_t cpu = 0;            // images decoded by libjpeg-turbo or libpng, then uploaded
};
// The counts so far (GpuDecodeCounts); subtract two readings to count what happened between them.
GpuDecodeCounts gpu_decode_counts();

// The batch a GPU-decoding ImageFolder makes (ImageFolderOptions::gpu).
struct GpuTransformOptions {
  DType dtype = DType::Float32;  // of the batch: Float32 or BFloat16
  bool channels_last = false;    // (N, 3, H, W) with NHWC strides (what cuDNN convolutions want)
};

// A transforms::Compose read as what the GPU decoder runs in one kernel: RandomResizedCrop, or Resize (+ CenterCrop);
// then an optional RandomHorizontalFlip, ToTensor, and an optional Normalize.
class GpuTransform {
 public:
  // Reads the steps of `compose` (throws for a pipeline the GPU path lacks, naming the step).
  static GpuTransform from(const transforms::Compose& compose, GpuTransformOptions options = {});

  // The choices for an image of `size`, drawing from rng as Compose::load would (step i from rng.fork(i)).
  GpuImagePlan plan(ImageSize size, SampleRng& rng) const;

  // The size of every output image (the same for the whole batch).
  ImageSize output_size() const { return out_; }
  // Normalize's per-channel (RGB) means; zeros without Normalize.
  const std::array<float, 3>& mean() const { return mean_; }
  // Normalize's per-channel (RGB) standard deviations; ones without Normalize.
  const std::array<float, 3>& std() const { return std_; }
  // The options given to from().
  const GpuTransformOptions& options() const { return options_; }
  // "GPU(" + the Compose's describe() + ")".
  std::string describe() const { return describe_; }

 private:
  const transforms::RandomResizedCrop* random_crop_ = nullptr;  // owned by steps_
  const transforms::Resize* resize_ = nullptr;
  const transforms::CenterCrop* center_crop_ = nullptr;
  const transforms::RandomHorizontalFlip* flip_ = nullptr;
  size_t flip_step_ = 0;
  std::vector<std::shared_ptr<const transforms::Transform>> steps_;  // keeps the steps alive
  ImageSize out_;
  std::array<float, 3> mean_ = {0, 0, 0};
  std::array<float, 3> std_ = {1, 1, 1};
  GpuTransformOptions options_;
  std::string describe_;
};

}  // namespace kiln::data
