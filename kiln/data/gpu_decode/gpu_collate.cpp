// kiln/data/gpu_decode/gpu_collate.cpp — a batch decoded on the GPU: one pixel buffer from the caching allocator,
// nvJPEG into it (JPEG's planes where it can), CPU fallbacks uploaded (RGB), the crop/resize kernel (which converts
// planes to RGB), an event. All on this thread's decoder stream.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>

#include "kiln/data/gpu_decode/gpu_sample.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

#if KILN_WITH_NVJPEG
#include "kiln/data/gpu_decode/crop_resize.h"  // launch_crop_resize
#include "kiln/data/gpu_decode/jpeg_decoder.h"
#endif
#include "kiln/data/gpu_decode/nvjpeg_library.h"
#include "kiln/tensor/checked_size.h"  // checked_mul/add: the batch's pixel buffer

namespace kiln::data {

namespace {

constexpr int64_t kAlign = 256;  // each image's pixels start at a multiple (row loads stay aligned)

// gpu_decode_counts()'s counters.
std::atomic<int64_t> g_engines{0}, g_one_at_a_time{0}, g_cpu{0};

#if KILN_WITH_NVJPEG

// Copies host pixels into device memory at `dst` on the current stream, from a pinned copy (the pinned
// allocator reuses it after the copy).
void upload(const Tensor& pixels, const Tensor& buffer, int64_t offset) {
  Tensor host = internal::pin_memory(internal::contiguous(pixels));
  Tensor slot = internal::reshape(internal::narrow(buffer, 0, offset, host.numel()), host.shape());
  internal::copy_(slot, host, /*non_blocking=*/true);
}

}  // namespace

Tensor gpu_crop_resize(const GpuTransform& transform, const Tensor& pixels, std::span<const DecodedImage> images) {
  KILN_CHECK(pixels.is_cuda() && pixels.dtype() == DType::UInt8 && pixels.is_contiguous(),
             "gpu_crop_resize: the pixels must be a contiguous uint8 tensor on the GPU, got ", pixels.dtype(), " on ",
             pixels.device());
  const Device dev = pixels.device();
  const auto n = static_cast<int64_t>(images.size());
  for (int64_t i = 0; i < n; ++i) {  // the bytes the kernel reads for each image lie in the buffer
    const DecodedImage& d = images[static_cast<size_t>(i)];
    const gpu::Planes& p = d.planes;
    const int64_t luma = d.size.height * d.size.width;
    int64_t end = p.layout == gpu::PixelLayout::kRgb ? 3 * luma : luma;
    if (p.layout == gpu::PixelLayout::kYCbCr) {
      const int64_t chroma = int64_t{p.chroma_width} * p.chroma_height;
      end = std::max({end, p.cb_offset + chroma, p.cr_offset + chroma});
      KILN_CHECK(p.chroma_width > 0 && p.chroma_height > 0 && p.cb_offset >= 0 && p.cr_offset >= 0,
                 "gpu_crop_resize: image ", i, " has chroma planes of ", p.chroma_height, " x ", p.chroma_width,
                 " at offsets ", p.cb_offset, " and ", p.cr_offset);
    }
    KILN_CHECK(d.size.height > 0 && d.size.width > 0 && d.offset >= 0 && d.offset + end <= pixels.numel(),
               "gpu_crop_resize: image ", i, " (", d.size.height, " x ", d.size.width, ") needs bytes ", d.offset,
               " to ", d.offset + end, " of the pixel buffer, which holds ", pixels.numel());
  }
  // The kernel's per-image parameters, through pinned memory on this stream.
  const ImageSize out_size = transform.output_size();
  Tensor jobs_host =
      internal::empty({n * static_cast<int64_t>(sizeof(gpu::CropJob))}, {.dtype = DType::UInt8, .pinned_memory = true});
  auto* jobs = reinterpret_cast<gpu::CropJob*>(jobs_host.data_ptr<uint8_t>());
  for (int64_t i = 0; i < n; ++i) {
    const DecodedImage& d = images[static_cast<size_t>(i)];
    const GpuImagePlan& p = d.plan;
    gpu::CropJob j;
    j.src_offset = d.offset;
    j.planes = d.planes;
    j.src_height = static_cast<int32_t>(d.size.height);
    j.src_width = static_cast<int32_t>(d.size.width);
    j.box_top = static_cast<float>(p.box.top);
    j.box_left = static_cast<float>(p.box.left);
    j.scale_y = static_cast<float>(p.box.height / static_cast<double>(out_size.height));
    j.scale_x = static_cast<float>(p.box.width / static_cast<double>(out_size.width));
    j.clamp_top = static_cast<float>(p.clamp.top);
    j.clamp_left = static_cast<float>(p.clamp.left);
    j.clamp_bottom = static_cast<float>(p.clamp.top + p.clamp.height - 1);
    j.clamp_right = static_cast<float>(p.clamp.left + p.clamp.width - 1);
    j.flip = p.flip ? 1 : 0;
    jobs[i] = j;
  }
  Tensor jobs_dev = internal::to(jobs_host, dev, {}, /*non_blocking=*/true);

  const GpuTransformOptions& o = transform.options();
  Tensor out =
      internal::empty({n, 3, out_size.height, out_size.width},
                      {.dtype = o.dtype,
                       .device = dev,
                       .memory_format = o.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous});
  gpu::CropResizeParams params;
  params.jobs = reinterpret_cast<const gpu::CropJob*>(jobs_dev.data_ptr<uint8_t>());
  params.count = static_cast<int>(n);
  params.pixels = pixels.data_ptr<uint8_t>();
  params.out = out.data_ptr();
  params.out_height = static_cast<int>(out_size.height);
  params.out_width = static_cast<int>(out_size.width);
  params.bfloat16 = o.dtype == DType::BFloat16;
  params.channels_last = o.channels_last;
  for (int c = 0; c < 3; ++c) {
    const double mean = transform.mean()[c], std = transform.std()[c];
    params.scale[c] = static_cast<float>(1.0 / (255.0 * std));
    params.shift[c] = static_cast<float>(-mean / std);
  }
  gpu::launch_crop_resize(params, cuda::current_stream(dev.index()).handle());
  return out;
}

namespace {

Batch decode_batch(const GpuTransform& transform, const std::function<std::string(int64_t)>& name_of,
                   const std::vector<Example>& examples, bool pinned) {
  KILN_CHECK(!examples.empty(), "GPU image decoding: no examples to collate");
  KILN_CHECK(cuda::is_available(), "GPU image decoding needs a GPU, and CUDA sees none here; decode on the CPU ",
             "(ImageFolderOptions::decode = Decode::Cpu)");
  const int device = cuda::current_device();
  const Device dev = Device::cuda(device);
  const gpu::JpegDecoder::Lease lease = gpu::JpegDecoder::acquire(device);
  gpu::JpegDecoder& decoder = *lease;
  cuda::StreamGuard stream_guard(decoder.stream());
  const auto n = static_cast<int64_t>(examples.size());

  // Where each image's pixels go in one buffer: room for (H, W, 3) RGB or for its planes.
  std::vector<GpuSamplePlan> plans;
  std::vector<int64_t> offsets, capacities;
  int64_t total = 0;
  for (const Example& ex : examples) {
    plans.push_back(read_gpu_plan(ex));
    offsets.push_back(total);
    const ImageSize s = plans.back().size;
    // Sizes come from the files' headers, each within data::max_image_pixels() unless that limit was removed.
    const int64_t bytes =
        checked_add(checked_mul(checked_mul(s.height, s.width, "GPU image decoding"), 3, "GPU image decoding"),
                    static_cast<int64_t>(gpu::kPlanesSlack), "GPU image decoding");
    capacities.push_back(bytes);
    total = checked_add(total, (checked_add(bytes, kAlign - 1, "GPU image decoding")) / kAlign * kAlign,
                        "GPU image decoding: the batch's pixel buffer");
  }
  Tensor pixels = internal::empty({total}, {.dtype = DType::UInt8, .device = dev});
  uint8_t* base = pixels.data_ptr<uint8_t>();

  std::vector<gpu::JpegInput> jpegs;
  std::vector<int64_t> jpeg_of;  // jpegs[k] is examples[jpeg_of[k]]
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& enc = examples[i]["encoded"];
    if (plans[i].is_jpeg) {
      jpegs.push_back({.data = enc.data_ptr<uint8_t>(),
                       .size = static_cast<size_t>(enc.numel()),
                       .dst = base + offsets[i],
                       .capacity = static_cast<size_t>(capacities[i]),
                       .height = static_cast<int>(plans[i].size.height),
                       .width = static_cast<int>(plans[i].size.width)});
      jpeg_of.push_back(i);
    } else {
      upload(enc, pixels, offsets[i]);
      g_cpu.fetch_add(1, std::memory_order_relaxed);
    }
  }
  std::vector<std::string> errors;
  const auto on_engines = static_cast<int64_t>(decoder.decode(jpegs, decoder.stream(), errors));
  int64_t refused = 0;
  for (const std::string& e : errors) refused += e.empty() ? 0 : 1;
  g_engines.fetch_add(on_engines, std::memory_order_relaxed);
  g_one_at_a_time.fetch_add(static_cast<int64_t>(jpegs.size()) - on_engines - refused, std::memory_order_relaxed);
  g_cpu.fetch_add(refused, std::memory_order_relaxed);
  for (size_t k = 0; k < jpegs.size(); ++k) {
    if (errors[k].empty()) continue;
    // nvJPEG could not (a CMYK or lossless JPEG, a damaged file): libjpeg-turbo on this thread, or the error.
    const int64_t i = jpeg_of[k];
    const std::string name = name_of(examples[i]["index"].item<int64_t>());
    const Tensor& enc = examples[i]["encoded"];
    Tensor image;
    try {
      image = decode_image({enc.data_ptr<uint8_t>(), static_cast<size_t>(enc.numel())}, name);
    } catch (const std::exception& e) {
      KILN_FAIL("GPU image decoding: '", name, "' could not be decoded: ", errors[k], "; libjpeg-turbo: ", e.what());
    }
    KILN_CHECK(image.shape()[0] == plans[i].size.height && image.shape()[1] == plans[i].size.width,
               "GPU image decoding: '", name, "' decodes to ", image.shape(), " but its header says ",
               plans[i].size.height, " x ", plans[i].size.width);
    upload(image, pixels, offsets[i]);
  }

  // How each image's pixels lie: as decode() left them, RGB for the ones uploaded from the CPU.
  std::vector<DecodedImage> decoded(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    decoded[static_cast<size_t>(i)] = {.offset = offsets[i], .size = plans[i].size, .plan = plans[i].plan};
  }
  for (size_t k = 0; k < jpegs.size(); ++k) {
    if (errors[k].empty()) decoded[static_cast<size_t>(jpeg_of[k])].planes = jpegs[k].planes;
  }
  Tensor out = gpu_crop_resize(transform, pixels, decoded);

  Batch batch;
  Tensor labels = internal::empty({n}, {.dtype = DType::Int64, .pinned_memory = pinned && cuda::is_available()});
  auto* l = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) l[i] = examples[i]["label"].item<int64_t>();
  batch.add("image", std::move(out));
  batch.add("label", std::move(labels));
  batch.ready = std::make_shared<cuda::Event>();
  batch.ready->record(decoder.stream());
  std::vector<Tensor> encoded;  // the bytes the queued decode reads from host memory
  for (int64_t k : jpeg_of) encoded.push_back(examples[k]["encoded"]);
  decoder.keep_until(std::move(encoded), batch.ready);
  return batch;
}

#endif

}  // namespace

#if !KILN_WITH_NVJPEG
Tensor gpu_crop_resize(const GpuTransform&, const Tensor&, std::span<const DecodedImage>) {
  nvjpeg::functions();  // throws: this build has no GPU decoding, and says how to get it
  KILN_FAIL("GPU image decoding is not in this build");
}
#endif

GpuDecodeCounts gpu_decode_counts() {
  return {g_engines.load(std::memory_order_relaxed), g_one_at_a_time.load(std::memory_order_relaxed),
          g_cpu.load(std::memory_order_relaxed)};
}

CollateFn gpu_decode_collate(GpuTransform transform, std::function<std::string(int64_t)> name_of) {
  KILN_CHECK(static_cast<bool>(name_of), "gpu_decode_collate: name_of is empty");
#if KILN_WITH_NVJPEG
  return [transform = std::move(transform), name_of = std::move(name_of)](const std::vector<Example>& examples,
                                                                          bool pinned) {
    return decode_batch(transform, name_of, examples, pinned);
  };
#else
  (void)transform;
  return [](const std::vector<Example>&, bool) -> Batch {
    nvjpeg::functions();  // throws: this build has no GPU decoding, and says how to get it
    KILN_FAIL("GPU image decoding is not in this build");
  };
#endif
}

}  // namespace kiln::data
