// kiln/data/gpu_decode/gpu_sample.cpp — a worker thread's part of GPU decoding: header, random choices, fields.
#include "kiln/data/gpu_decode/gpu_sample.h"

#include <cstring>

#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::data {

Example gpu_sample(std::vector<uint8_t> bytes, const std::string& name, const GpuTransform& transform, SampleRng& rng,
                   int64_t label, int64_t index) {
  const bool jpeg = image_format(bytes) == ImageFormat::Jpeg;
  Tensor encoded;
  ImageSize size;
  if (jpeg) {
    size = image_size(bytes, name);  // the header only (libjpeg-turbo); a bad one throws naming the file
    encoded = internal::empty({static_cast<int64_t>(bytes.size())}, {.dtype = DType::UInt8});
    std::memcpy(encoded.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  } else {
    Tensor pixels = decode_image(bytes, name);  // PNG (or an error naming the file)
    size = {pixels.shape()[0], pixels.shape()[1]};
    encoded = internal::reshape(internal::contiguous(pixels), {pixels.numel()});
  }
  const GpuImagePlan p = transform.plan(size, rng);
  Tensor plan = internal::empty({kGpuPlanFields}, {.dtype = DType::Float64});
  double* v = plan.data_ptr<double>();
  const double values[kGpuPlanFields] = {jpeg ? 0.0 : 1.0,
                                         static_cast<double>(size.height),
                                         static_cast<double>(size.width),
                                         p.box.top,
                                         p.box.left,
                                         p.box.height,
                                         p.box.width,
                                         p.clamp.top,
                                         p.clamp.left,
                                         p.clamp.height,
                                         p.clamp.width,
                                         p.flip ? 1.0 : 0.0};
  std::memcpy(v, values, sizeof(values));
  return {{"encoded", std::move(encoded)},
          {"plan", std::move(plan)},
          {"label", internal::scalar_tensor(label, {.dtype = DType::Int64})},
          {"index", internal::scalar_tensor(index, {.dtype = DType::Int64})}};
}

GpuSamplePlan read_gpu_plan(const Example& sample) {
  const Tensor& t = sample["plan"];
  KILN_CHECK(t.dtype() == DType::Float64 && t.numel() == kGpuPlanFields && t.is_cpu(),
             "GPU image decoding: a sample's plan must be float64 (", kGpuPlanFields, ") on the CPU, got ", t.dtype(),
             " ", t.shape());
  const Tensor c = internal::contiguous(t);
  const double* v = c.data_ptr<double>();
  GpuSamplePlan s;
  s.is_jpeg = v[0] == 0.0;
  s.size = {static_cast<int64_t>(v[1]), static_cast<int64_t>(v[2])};
  s.plan.box = {v[3], v[4], v[5], v[6]};
  s.plan.clamp = {v[7], v[8], v[9], v[10]};
  s.plan.flip = v[11] != 0.0;
  return s;
}

}  // namespace kiln::data
