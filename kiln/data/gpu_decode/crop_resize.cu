// kiln/data/gpu_decode/crop_resize.cu — one thread per output pixel of a batch: bilinear sample of 2x2 source
// pixels (3 channels; from JPEG's planes, each of the four converted to RGB first), flip, normalise, store.
// Grid: (pixels / 256, images).
#include <cuda_bf16.h>     // __nv_bfloat16, __float2bfloat16_rn
#include <cuda_runtime.h>  // cudaStream_t

#include "kiln/data/gpu_decode/crop_resize.h"
#include "kiln/tensor/cuda/cuda_check.h"  // KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/error.h"

namespace kiln::data::gpu {

namespace {

template <class T>
__device__ __forceinline__ T convert(float v);
template <>
__device__ __forceinline__ float convert<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 convert<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

struct Norm {
  float scale[3], shift[3];
};

// JFIF's YCbCr to RGB (full range, BT.601 weights), clamped to 0..255 as an 8-bit decoder's output is.
__device__ __forceinline__ void ycbcr_to_rgb(float y, float cb, float cr, float* rgb) {
  cb -= 128.0f;
  cr -= 128.0f;
  rgb[0] = fminf(fmaxf(y + 1.402f * cr, 0.0f), 255.0f);
  rgb[1] = fminf(fmaxf(y - 0.344136286f * cb - 0.714136286f * cr, 0.0f), 255.0f);
  rgb[2] = fminf(fmaxf(y + 1.772f * cb, 0.0f), 255.0f);
}

// Pixel (y, x) of an image in planes, as RGB. Chroma is sampled bilinearly at the pixel's centre, clamped to the
// plane (for 2x subsampling this is libjpeg's "fancy" upsampling, without its rounding to integers).
__device__ __forceinline__ void planar_pixel(const uint8_t* img, const CropJob& job, int y, int x, float* rgb) {
  const float luma = img[static_cast<int64_t>(y) * job.src_width + x];
  const Planes& p = job.planes;
  if (p.layout == PixelLayout::kGray) {
    rgb[0] = rgb[1] = rgb[2] = luma;
    return;
  }
  const float cy = fminf(fmaxf((static_cast<float>(y) + 0.5f) / static_cast<float>(p.chroma_fy) - 0.5f, 0.0f),
                         static_cast<float>(p.chroma_height - 1));
  const float cx = fminf(fmaxf((static_cast<float>(x) + 0.5f) / static_cast<float>(p.chroma_fx) - 0.5f, 0.0f),
                         static_cast<float>(p.chroma_width - 1));
  const int y0 = static_cast<int>(cy), x0 = static_cast<int>(cx);
  const int y1 = min(y0 + 1, p.chroma_height - 1), x1 = min(x0 + 1, p.chroma_width - 1);
  const float wy = cy - static_cast<float>(y0), wx = cx - static_cast<float>(x0);
  const int64_t r0 = static_cast<int64_t>(y0) * p.chroma_width, r1 = static_cast<int64_t>(y1) * p.chroma_width;
  auto sample = [&](const uint8_t* plane) {
    const float top = plane[r0 + x0] + wx * (static_cast<float>(plane[r0 + x1]) - plane[r0 + x0]);
    const float bottom = plane[r1 + x0] + wx * (static_cast<float>(plane[r1 + x1]) - plane[r1 + x0]);
    return top + wy * (bottom - top);
  };
  ycbcr_to_rgb(luma, sample(img + p.cb_offset), sample(img + p.cr_offset), rgb);
}

template <class T, bool kChannelsLast>
__global__ void crop_resize_kernel(const CropJob* __restrict__ jobs, const uint8_t* __restrict__ pixels,
                                   T* __restrict__ out, int out_h, int out_w, Norm norm) {
  const int n = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // output pixel (row-major)
  if (i >= out_h * out_w) return;
  const CropJob job = jobs[n];
  const int oy = i / out_w, ox = i % out_w;
  const int sx_out = job.flip ? out_w - 1 - ox : ox;  // the unflipped output column this pixel shows
  float sy = job.box_top + (static_cast<float>(oy) + 0.5f) * job.scale_y - 0.5f;
  float sx = job.box_left + (static_cast<float>(sx_out) + 0.5f) * job.scale_x - 0.5f;
  sy = fminf(fmaxf(sy, job.clamp_top), job.clamp_bottom);
  sx = fminf(fmaxf(sx, job.clamp_left), job.clamp_right);
  const int y0 = static_cast<int>(sy), x0 = static_cast<int>(sx);  // sy, sx >= 0: truncation is floor
  const int y1 = min(y0 + 1, static_cast<int>(job.clamp_bottom)), x1 = min(x0 + 1, static_cast<int>(job.clamp_right));
  const float wy = sy - static_cast<float>(y0), wx = sx - static_cast<float>(x0);
  const uint8_t* img = pixels + job.src_offset;
  // The 2x2 source pixels as RGB: (y0, x0), (y0, x1), (y1, x0), (y1, x1).
  float p00[3], p01[3], p10[3], p11[3];
  if (job.planes.layout == PixelLayout::kRgb) {
    const int64_t pitch = static_cast<int64_t>(job.src_width) * 3;
    const uint8_t* r0 = img + y0 * pitch;
    const uint8_t* r1 = img + y1 * pitch;
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      p00[c] = r0[x0 * 3 + c], p01[c] = r0[x1 * 3 + c], p10[c] = r1[x0 * 3 + c], p11[c] = r1[x1 * 3 + c];
    }
  } else {
    planar_pixel(img, job, y0, x0, p00);
    planar_pixel(img, job, y0, x1, p01);
    planar_pixel(img, job, y1, x0, p10);
    planar_pixel(img, job, y1, x1, p11);
  }
  const int64_t plane = static_cast<int64_t>(out_h) * out_w;
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    const float top = p00[c] + wx * (p01[c] - p00[c]);
    const float bottom = p10[c] + wx * (p11[c] - p10[c]);
    const float v = top + wy * (bottom - top);
    const float y = v * norm.scale[c] + norm.shift[c];
    if constexpr (kChannelsLast) {
      out[(static_cast<int64_t>(n) * plane + i) * 3 + c] = convert<T>(y);
    } else {
      out[(static_cast<int64_t>(n) * 3 + c) * plane + i] = convert<T>(y);
    }
  }
}

template <class T, bool kChannelsLast>
void launch_as(const CropResizeParams& p, cudaStream_t stream) {
  const int threads = 256;
  const dim3 grid((p.out_height * p.out_width + threads - 1) / threads, p.count);
  Norm norm{};
  for (int c = 0; c < 3; ++c) norm.scale[c] = p.scale[c], norm.shift[c] = p.shift[c];
  crop_resize_kernel<T, kChannelsLast>
      <<<grid, threads, 0, stream>>>(p.jobs, p.pixels, static_cast<T*>(p.out), p.out_height, p.out_width, norm);
}

}  // namespace

void launch_crop_resize(const CropResizeParams& p, void* stream) {
  if (p.count == 0 || p.out_height == 0 || p.out_width == 0) return;
  KILN_CHECK(p.count <= 65535, "GPU image decoding: at most 65535 images per batch, got ", p.count);
  auto s = static_cast<cudaStream_t>(stream);
  if (p.bfloat16) {
    p.channels_last ? launch_as<__nv_bfloat16, true>(p, s) : launch_as<__nv_bfloat16, false>(p, s);
  } else {
    p.channels_last ? launch_as<float, true>(p, s) : launch_as<float, false>(p, s);
  }
  KILN_CUDA_CHECK_LAUNCH("GPU image decoding (crop, resize, normalise)");
}

}  // namespace kiln::data::gpu
