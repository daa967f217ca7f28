// GPU image decoding on a GPU (label gpu; skips without a GPU or without nvJPEG): nvJPEG's pixels against
// libjpeg-turbo's, the crop/resize/flip/normalise kernel against a float64 reference on the same pixels, and
// whole batches through the DataLoader.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include "gpu_decode_reference.h"
#include "image_test_files.h"
#include "kiln/data/dataloader.h"
#include "kiln/data/gpu_decode/gpu_sample.h"
#include "kiln/data/gpu_decode/nvjpeg_library.h"
#include "kiln/data/image_folder.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

#if KILN_TEST_NVJPEG
#include <cuda_runtime.h>  // cudaLaunchHostFunc, cudaMemsetAsync: work queued on a decoder's stream

#include <atomic>
#include <chrono>
#include <thread>

#include "kiln/data/gpu_decode/jpeg_decoder.h"  // the decoder itself (built with nvjpeg.h)
#endif

namespace kiln::testing {
namespace {

namespace T = data::transforms;

#define KILN_NEED_GPU_DECODE()                                 \
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible"; \
  if (auto r = data::nvjpeg::load(data::nvjpeg::candidate_paths()); !r.functions) GTEST_SKIP() << r.error

// Decodes `examples` on cuda:0 and returns the batch's image on the host, as float64.
std::vector<double> decode_on_gpu(const data::GpuTransform& gpu, const std::vector<data::Example>& examples,
                                  Shape* shape = nullptr) {
  cuda::DeviceGuard guard(0);
  auto collate = data::gpu_decode_collate(gpu, [](int64_t i) { return "image " + std::to_string(i); });
  data::Batch b = collate(examples, true);
  EXPECT_TRUE(b["image"].is_cuda());
  b.ready->synchronize();
  if (shape) *shape = b["image"].shape();
  return internal::contiguous(b["image"].to(Device::cpu()).to(DType::Float64)).to_vector<double>();
}

struct Diff {
  double max = 0, mean = 0;
};
Diff diff(std::span<const double> a, std::span<const double> b, double scale = 1) {
  Diff d;
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double e = std::abs(a[i] - b[i]) * scale;
    d.max = std::max(d.max, e);
    d.mean += e;
  }
  d.mean /= std::max<size_t>(a.size(), 1);
  return d;
}

// How far `got`, one image as (3, H, W) / 255, lies from libjpeg-turbo's decode of `jpeg`, in levels of 255.
Diff diff_from_libjpeg(const std::vector<uint8_t>& jpeg, std::span<const double> got) {
  Tensor ref = data::decode_image(jpeg, "x.jpg");  // (h, w, 3)
  auto ref_chw = internal::contiguous(internal::permute(ref, {2, 0, 1})).to(DType::Float64).to_vector<double>();
  for (auto& v : ref_chw) v /= 255.0;
  return diff(got, ref_chw, 255.0);
}

// Resize to the image's own size + ToTensor: the kernel copies each pixel (times 1/255), so the output is
// nvJPEG's decode; libjpeg-turbo's decode of the same file, as (3, H, W) / 255, is the reference.
void expect_decode_close(const std::vector<uint8_t>& jpeg, int h, int w, double max_levels, double mean_levels) {
  const T::Compose identity{T::Resize(data::ImageSize{h, w}), T::ToTensor()};
  auto gpu = data::GpuTransform::from(identity);
  data::SampleRng rng(0, 0, 0);
  auto got = decode_on_gpu(gpu, {data::gpu_sample(jpeg, "x.jpg", gpu, rng, 0, 0)});
  const Diff d = diff_from_libjpeg(jpeg, got);
  EXPECT_LE(d.max, max_levels);
  EXPECT_LE(d.mean, mean_levels);
}

TEST(GpuDecodeCuda, PixelsMatchLibjpegTurbo) {
  KILN_NEED_GPU_DECODE();
  const int h = 67, w = 95;  // not multiples of the 8/16-pixel blocks
  const auto img = smooth_image(h, w, 3);
  expect_decode_close(encode_jpeg(img, h, w, 3, {.quality = 95}), h, w, 4, 0.6);  // 4:4:4
  // 4:2:0: libjpeg-turbo upsamples chroma with its smoothing ("fancy") filter, nvJPEG otherwise: on the H200 the
  // mean difference was 2.16 levels (max within 12).
  expect_decode_close(encode_jpeg(img, h, w, 3, {.quality = 95, .subsample = true}), h, w, 12, 3.0);
  expect_decode_close(encode_jpeg(img, h, w, 3, {.quality = 95, .luma_h = 2, .luma_v = 1}), h, w, 12, 3.0);  // 4:2:2
  expect_decode_close(encode_jpeg(img, h, w, 3, {.quality = 95, .luma_h = 1, .luma_v = 2}), h, w, 12, 3.0);  // 4:4:0
  expect_decode_close(encode_jpeg(img, h, w, 3, {.quality = 90, .progressive = true}), h, w, 4, 0.6);
  const std::vector<uint8_t> gray = first_channel(img);
  expect_decode_close(encode_jpeg(gray, h, w, 1, {.quality = 95}), h, w, 4, 0.6);
  // CMYK: nvJPEG's RGB output does not take it; libjpeg-turbo on the CPU does, then the upload: the same pixels,
  // up to the float rounding of the kernel's x / 255 against the reference's (2e-5 levels seen).
  const auto cmyk = random_image(h, w, 4, 5);
  expect_decode_close(encode_jpeg(cmyk, h, w, 4, {.quality = 95}), h, w, 1e-3, 1e-3);
}

// The same encodings decoded together in one batch (nvJPEG's batched calls take several at once): each image of the
// batch against libjpeg-turbo's decode of its own file, with the single-image tolerances above.
TEST(GpuDecodeCuda, PixelsMatchLibjpegTurboInOneBatch) {
  KILN_NEED_GPU_DECODE();
  const int h = 67, w = 95;
  const auto img = smooth_image(h, w, 3);
  const std::vector<uint8_t> gray = first_channel(img);
  struct Case {
    std::vector<uint8_t> jpeg;
    double max_levels, mean_levels;
  };
  const std::vector<Case> cases = {
      {encode_jpeg(img, h, w, 3, {.quality = 95}), 4, 0.6},
      {encode_jpeg(img, h, w, 3, {.quality = 95, .subsample = true}), 12, 3.0},
      {encode_jpeg(img, h, w, 3, {.quality = 95, .luma_h = 2, .luma_v = 1}), 12, 3.0},
      {encode_jpeg(img, h, w, 3, {.quality = 95, .subsample = true}), 12, 3.0},  // the same file twice
      {encode_jpeg(img, h, w, 3, {.quality = 90, .progressive = true}), 4, 0.6},
      {encode_jpeg(gray, h, w, 1, {.quality = 95}), 4, 0.6},
      {encode_jpeg(img, h, w, 3, {.quality = 95, .luma_h = 1, .luma_v = 2}), 12, 3.0},
  };
  const T::Compose identity{T::Resize(data::ImageSize{h, w}), T::ToTensor()};
  auto gpu = data::GpuTransform::from(identity);
  std::vector<data::Example> examples;
  for (size_t i = 0; i < cases.size(); ++i) {
    data::SampleRng rng(0, 0, static_cast<int64_t>(i));
    examples.push_back(data::gpu_sample(cases[i].jpeg, "x.jpg", gpu, rng, 0, static_cast<int64_t>(i)));
  }
  Shape shape;
  const auto got = decode_on_gpu(gpu, examples, &shape);
  ASSERT_EQ(shape, (Shape{static_cast<int64_t>(cases.size()), 3, h, w}));
  const size_t per = static_cast<size_t>(3 * h * w);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Diff d = diff_from_libjpeg(cases[i].jpeg, std::span<const double>(got).subspan(i * per, per));
    EXPECT_LE(d.max, cases[i].max_levels) << "image " << i;
    EXPECT_LE(d.mean, cases[i].mean_levels) << "image " << i;
  }
}

#if KILN_TEST_NVJPEG
// A decode writes its pixels after the work queued before it on its stream, with the JPEG engines as without
// them. nvJPEG's hardware backend writes when nvjpegDecodeBatched is called, whatever is queued; the caching
// allocator can hand a batch a block the previous batch's crop kernel, still queued on the same stream, reads. Here
// the earlier work is held back by a host function until a timer opens it, then zeroes the buffer: pixels written
// before it would be zeroed.
TEST(GpuDecodeCuda, DecodeWritesAfterTheStreamsEarlierWork) {
  KILN_NEED_GPU_DECODE();
  cuda::DeviceGuard guard(0);
  const int h = 64, w = 96, n = 4;
  std::vector<std::vector<uint8_t>> files;
  for (int i = 0; i < n; ++i) {
    files.push_back(encode_jpeg(smooth_image(h, w, 20 + i), h, w, 3, {.quality = 95, .subsample = true}));
  }
  const auto bytes = static_cast<int64_t>(h * w * 3 + data::gpu::kPlanesSlack);
  Tensor pixels = internal::empty({n * bytes}, {.dtype = DType::UInt8, .device = Device::cuda(0)});
  std::vector<data::gpu::JpegInput> inputs;
  for (int i = 0; i < n; ++i) {
    inputs.push_back({.data = files[i].data(),
                      .size = files[i].size(),
                      .dst = pixels.data_ptr<uint8_t>() + i * bytes,
                      .capacity = static_cast<size_t>(bytes),
                      .height = h,
                      .width = w});
  }
  data::gpu::JpegDecoder::Lease decoder = data::gpu::JpegDecoder::acquire(0);
  auto stream = static_cast<cudaStream_t>(decoder->stream().handle());
  std::atomic<bool> open{false};
  auto gate = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  ASSERT_EQ(cudaLaunchHostFunc(stream, gate, &open), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(pixels.data_ptr(), 0, static_cast<size_t>(n * bytes), stream), cudaSuccess);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    open = true;
  });
  std::vector<std::string> errors;
  const size_t on_engines = decoder->decode(inputs, decoder->stream(), errors);
  opener.join();
  decoder->stream().synchronize();
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  // Each image's pixels through the crop kernel at its own size, against libjpeg-turbo (4:2:0 tolerances).
  const T::Compose identity{T::Resize(data::ImageSize{h, w}), T::ToTensor()};
  auto gpu = data::GpuTransform::from(identity);
  std::vector<data::DecodedImage> decoded;
  for (int i = 0; i < n; ++i) {
    data::SampleRng rng(0, 0, i);
    const data::GpuSamplePlan plan = data::read_gpu_plan(data::gpu_sample(files[i], "x.jpg", gpu, rng, 0, i));
    decoded.push_back({.offset = i * bytes, .planes = inputs[i].planes, .size = plan.size, .plan = plan.plan});
  }
  Tensor out;
  {
    cuda::StreamGuard on(decoder->stream());
    out = data::gpu_crop_resize(gpu, pixels, decoded);
    decoder->stream().synchronize();
  }
  const auto got = internal::contiguous(out.to(Device::cpu()).to(DType::Float64)).to_vector<double>();
  const size_t per = static_cast<size_t>(3 * h * w);
  for (int i = 0; i < n; ++i) {
    const Diff d = diff_from_libjpeg(files[i], std::span<const double>(got).subspan(i * per, per));
    EXPECT_LE(d.max, 12) << "image " << i << " (" << on_engines << " of " << n << " on the JPEG engines)";
    EXPECT_LE(d.mean, 3.0) << "image " << i << " (" << on_engines << " of " << n << " on the JPEG engines)";
  }
}
#endif

TEST(GpuDecodeCuda, KernelMatchesFloat64Reference) {
  KILN_NEED_GPU_DECODE();
  // PNGs: their pixels are exact on both sides, so only the kernel is measured.
  const T::Compose train{T::RandomResizedCrop(48), T::RandomHorizontalFlip(0.5), T::ToTensor(),
                         T::Normalize(T::kImageNetMean, T::kImageNetStd)};
  const T::Compose eval{T::Resize(data::ImageSize{60, 80}), T::CenterCrop(48), T::ToTensor(),
                        T::Normalize(T::kImageNetMean, T::kImageNetStd)};
  for (const T::Compose* compose : {&train, &eval}) {
    for (bool bf16 : {false, true}) {
      auto gpu =
          data::GpuTransform::from(*compose, {.dtype = bf16 ? DType::BFloat16 : DType::Float32, .channels_last = bf16});
      std::vector<data::Example> examples;
      std::vector<std::vector<uint8_t>> pixels;
      const int sizes[4][2] = {{120, 90}, {33, 250}, {48, 48}, {301, 199}};
      for (int i = 0; i < 4; ++i) {
        const int h = sizes[i][0], w = sizes[i][1];
        pixels.push_back(random_image(h, w, 3, 10 + i));
        data::SampleRng rng(2, 0, i);
        examples.push_back(
            data::gpu_sample(encode_png({pixels[i].begin(), pixels[i].end()}, h, w, {}), "p.png", gpu, rng, i, i));
      }
      Shape shape;
      const auto got = decode_on_gpu(gpu, examples, &shape);
      ASSERT_EQ(shape, (Shape{4, 3, 48, 48}));
      std::vector<double> ref;
      for (int i = 0; i < 4; ++i) {
        const auto p = data::read_gpu_plan(examples[i]);
        auto r = gpu_decode_reference(pixels[i], p.size.height, p.size.width, p.plan, 48, 48,
                                      {T::kImageNetMean[0], T::kImageNetMean[1], T::kImageNetMean[2]},
                                      {T::kImageNetStd[0], T::kImageNetStd[1], T::kImageNetStd[2]});
        ref.insert(ref.end(), r.begin(), r.end());
      }
      const Diff d = diff(got, ref);
      // float32: rounding of float arithmetic; bfloat16: 8 bits of mantissa on values up to ~2.7.
      EXPECT_LE(d.max, bf16 ? 2.7 / 128 : 1e-4) << compose->describe() << (bf16 ? " bf16" : " f32");
    }
  }
}

// JPEG's planes, as nvJPEG's YUV output leaves them, through the kernel: random luma and chroma (saturated colours
// among them) at odd sizes, every subsampling nvJPEG names and a grayscale image, against a float64 reference
// written from JFIF: chroma sampled bilinearly at each pixel's centre (clamped to its plane), YCbCr to RGB clamped
// to 0..255, then the plan's bilinear sample. The whole image at its own size, and a flipped box resized.
TEST(GpuDecodeCuda, KernelConvertsJpegPlanes) {
  KILN_NEED_GPU_DECODE();
  const int h = 37, w = 53;
  struct Case {
    data::gpu::PixelLayout layout;
    int fx, fy;
  };
  using L = data::gpu::PixelLayout;
  const Case cases[] = {{L::kYCbCr, 1, 1}, {L::kYCbCr, 2, 1}, {L::kYCbCr, 2, 2}, {L::kYCbCr, 1, 2},
                        {L::kYCbCr, 4, 1}, {L::kYCbCr, 4, 2}, {L::kGray, 1, 1}};
  for (const Case& c : cases) {
    const int cw = (w + c.fx - 1) / c.fx, ch = (h + c.fy - 1) / c.fy;
    const uint64_t seed = static_cast<uint64_t>(10 * c.fx + c.fy);
    const auto luma = random_image(h, w, 1, seed), cb = random_image(ch, cw, 1, seed + 100),
               cr = random_image(ch, cw, 1, seed + 200);
    const data::gpu::Planes planes{.layout = c.layout,
                                   .chroma_fx = c.fx,
                                   .chroma_fy = c.fy,
                                   .chroma_width = cw,
                                   .chroma_height = ch,
                                   .cb_offset = 2304,
                                   .cr_offset = 4352};
    std::vector<uint8_t> buffer(8192, 0);
    std::copy(luma.begin(), luma.end(), buffer.begin() + 256);  // the image starts 256 bytes in
    std::copy(cb.begin(), cb.end(), buffer.begin() + 256 + planes.cb_offset);
    std::copy(cr.begin(), cr.end(), buffer.begin() + 256 + planes.cr_offset);

    // The reference's RGB pixels (unrounded).
    std::vector<double> rgb(static_cast<size_t>(h * w * 3));
    auto chroma_at = [&](const std::vector<uint8_t>& plane, int y, int x) {
      const double cy = std::clamp((y + 0.5) / c.fy - 0.5, 0.0, ch - 1.0);
      const double cx = std::clamp((x + 0.5) / c.fx - 0.5, 0.0, cw - 1.0);
      const int y0 = static_cast<int>(std::floor(cy)), x0 = static_cast<int>(std::floor(cx));
      const int y1 = std::min(y0 + 1, ch - 1), x1 = std::min(x0 + 1, cw - 1);
      auto at = [&](int yy, int xx) { return static_cast<double>(plane[static_cast<size_t>(yy * cw + xx)]); };
      const double fy = cy - y0, fx = cx - x0;
      return (1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x1)) + fy * ((1 - fx) * at(y1, x0) + fx * at(y1, x1));
    };
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const double Y = luma[static_cast<size_t>(y * w + x)];
        double* px = &rgb[static_cast<size_t>((y * w + x) * 3)];
        if (c.layout == L::kGray) {
          px[0] = px[1] = px[2] = Y;
          continue;
        }
        const double u = chroma_at(cb, y, x) - 128, v = chroma_at(cr, y, x) - 128;
        px[0] = std::clamp(Y + 1.402 * v, 0.0, 255.0);
        px[1] = std::clamp(Y - 0.344136286 * u - 0.714136286 * v, 0.0, 255.0);
        px[2] = std::clamp(Y + 1.772 * u, 0.0, 255.0);
      }
    }

    cuda::DeviceGuard guard(0);
    Tensor pixels = internal::from_vector(buffer, {static_cast<int64_t>(buffer.size())}, Device::cuda(0));
    const data::Box whole{0, 0, static_cast<double>(h), static_cast<double>(w)};
    struct Resize {
      int oh, ow;
      data::GpuImagePlan plan;
    };
    const Resize resizes[] = {{h, w, {.box = whole, .clamp = whole, .flip = false}},
                              {23, 31, {.box = {3.5, 5.25, 30, 40}, .clamp = whole, .flip = true}}};
    for (const Resize& r : resizes) {
      auto gpu = data::GpuTransform::from(T::Compose{T::Resize(data::ImageSize{r.oh, r.ow}), T::ToTensor()});
      const data::DecodedImage image{.offset = 256, .planes = planes, .size = {h, w}, .plan = r.plan};
      Tensor out = data::gpu_crop_resize(gpu, pixels, std::span<const data::DecodedImage>(&image, 1));
      ASSERT_EQ(out.shape(), (Shape{1, 3, r.oh, r.ow}));
      const auto got = internal::contiguous(out.to(Device::cpu()).to(DType::Float64)).to_vector<double>();
      const auto ref = gpu_decode_reference(rgb, h, w, r.plan, r.oh, r.ow, {0, 0, 0}, {1, 1, 1});
      const Diff d = diff(got, ref, 255.0);
      EXPECT_LE(d.max, 2e-3) << "levels; subsampling " << c.fx << "x" << c.fy << (c.layout == L::kGray ? " gray" : "")
                             << ", output " << r.oh << "x" << r.ow;
    }
  }
}

// An image whose pixels or planes would lie outside the buffer is refused before the kernel reads past it.
TEST(GpuDecodeCuda, CropResizeRefusesPixelsOutsideTheBuffer) {
  KILN_NEED_GPU_DECODE();
  cuda::DeviceGuard guard(0);
  Tensor pixels = internal::zeros({4096}, {.dtype = DType::UInt8, .device = Device::cuda(0)});
  auto gpu = data::GpuTransform::from(T::Compose{T::Resize(data::ImageSize{8, 8}), T::ToTensor()});
  const data::Box whole{0, 0, 32, 40};
  data::DecodedImage image{.offset = 0, .size = {32, 40}, .plan = {.box = whole, .clamp = whole}};
  auto run = [&] { (void)data::gpu_crop_resize(gpu, pixels, std::span<const data::DecodedImage>(&image, 1)); };
  EXPECT_NO_THROW(run());  // 32 x 40 x 3 = 3840 bytes of RGB
  image.offset = 512;      // RGB to byte 4352
  expect_error(run, {"image 0", "4352", "4096"});
  image.offset = 0;
  image.planes = {.layout = data::gpu::PixelLayout::kYCbCr,
                  .chroma_fx = 2,
                  .chroma_fy = 2,
                  .chroma_width = 20,
                  .chroma_height = 16,
                  .cb_offset = 1280,
                  .cr_offset = 3840};  // Cr to byte 4160
  expect_error(run, {"image 0", "4160", "4096"});
  image.planes.cr_offset = 1600;
  EXPECT_NO_THROW(run());
  expect_error([&] { (void)data::gpu_crop_resize(gpu, pixels.to(Device::cpu()), {}); }, {"on the GPU"});
}

TEST(GpuDecodeCuda, LoaderBatchesOnTheGpu) {
  KILN_NEED_GPU_DECODE();
  TempFolder dir;
  std::vector<std::string> files = {"a/1.jpg", "a/2.jpg", "b/3.jpg", "b/4.png", "c/5.jpg", "c/6.jpg"};
  for (size_t i = 0; i < files.size(); ++i) {
    const int h = 40 + 7 * static_cast<int>(i), w = 90 - 5 * static_cast<int>(i);
    const auto img = smooth_image(h, w, static_cast<int>(i));
    write_bytes(dir.file(files[i]), files[i].ends_with(".png") ? encode_png({img.begin(), img.end()}, h, w, {})
                                                               : encode_jpeg(img, h, w, 3, {.quality = 100}));
  }
  auto ds = std::make_shared<data::ImageFolder>(dir.path().string(), T::imagenet_train(32),
                                                data::ImageFolderOptions{.decode = data::Decode::Gpu});
  data::DataLoader loader(ds, {.batch_size = 4, .workers = 2, .shuffle = true, .seed = 3, .device = Device::cuda(0)});
  int64_t seen = 0;
  for (auto& b : loader.epoch(1)) {
    Tensor x = b["image"], y = b["label"];
    ASSERT_TRUE(x.is_cuda());
    ASSERT_TRUE(y.is_cuda());
    const int64_t n = x.shape()[0];
    ASSERT_EQ(x.shape(), (Shape{n, 3, 32, 32}));
    const auto got = internal::contiguous(x.to(Device::cpu()).to(DType::Float64)).to_vector<double>();
    const auto labels = y.to(Device::cpu()).to_vector<int64_t>();
    for (int64_t k = 0; k < n; ++k) {
      const int64_t idx = b.indices[static_cast<size_t>(k)];
      EXPECT_EQ(labels[static_cast<size_t>(k)], ds->targets()[static_cast<size_t>(idx)]);
      // The reference: libjpeg-turbo's pixels, the plan the worker drew (the same seed, epoch and index).
      Tensor px = data::read_image(ds->samples()[static_cast<size_t>(idx)].path);
      data::SampleRng rng(3, 1, idx);
      const auto p = data::GpuTransform::from(T::imagenet_train(32)).plan({px.shape()[0], px.shape()[1]}, rng);
      const auto ref = gpu_decode_reference(px.to_vector<uint8_t>(), px.shape()[0], px.shape()[1], p, 32, 32,
                                            {T::kImageNetMean[0], T::kImageNetMean[1], T::kImageNetMean[2]},
                                            {T::kImageNetStd[0], T::kImageNetStd[1], T::kImageNetStd[2]});
      const std::vector<double> one(got.begin() + k * 3 * 32 * 32, got.begin() + (k + 1) * 3 * 32 * 32);
      const Diff d = diff(one, ref, 255.0 * 0.225);  // back to levels, roughly
      EXPECT_LE(d.max, 6) << ds->samples()[static_cast<size_t>(idx)].path;
    }
    seen += n;
  }
  EXPECT_EQ(seen, 6);
}

// gpu_decode_counts(): every image counted once, by where it was decoded. With KILN_NVJPEG_HARDWARE=1, baseline
// JPEGs go to the JPEG engines on GPUs that have them (A100 and A30: compute capability 8.0; H100 and H200: 9.0);
// progressive JPEGs, which the engines do not take, one at a time to nvJPEG's default backend;
// PNGs and CMYK JPEGs are decoded on the CPU.
TEST(GpuDecodeCuda, CountsSayWhereEachImageWasDecoded) {
  KILN_NEED_GPU_DECODE();
  const T::Compose train{T::RandomResizedCrop(64), T::ToTensor()};
  auto gpu = data::GpuTransform::from(train);
  const int h = 240, w = 320;
  const auto img = smooth_image(h, w, 4);
  const auto baseline = encode_jpeg(img, h, w, 3, {.quality = 90, .subsample = true});
  const auto progressive = encode_jpeg(img, h, w, 3, {.quality = 90, .subsample = true, .progressive = true});
  const auto png = encode_png({img.begin(), img.end()}, h, w, {});
  const auto cmyk = encode_jpeg(random_image(h, w, 4, 6), h, w, 4, {.quality = 90});
  auto decode = [&](const std::vector<std::vector<uint8_t>>& files) {
    std::vector<data::Example> examples;
    for (size_t i = 0; i < files.size(); ++i) {
      data::SampleRng rng(0, 0, static_cast<int64_t>(i));
      examples.push_back(data::gpu_sample(files[i], "f", gpu, rng, 0, static_cast<int64_t>(i)));
    }
    const data::GpuDecodeCounts before = data::gpu_decode_counts();
    (void)decode_on_gpu(gpu, examples);
    const data::GpuDecodeCounts after = data::gpu_decode_counts();
    return data::GpuDecodeCounts{after.engines - before.engines, after.one_at_a_time - before.one_at_a_time,
                                 after.cpu - before.cpu};
  };
  const data::GpuDecodeCounts four = decode({baseline, baseline, baseline, baseline});
  EXPECT_EQ(four.engines + four.one_at_a_time, 4);
  EXPECT_EQ(four.cpu, 0);
  const int cc = cuda::compute_capability(0);
  const bool engines_expected = (cc == 80 || cc == 90) && data::nvjpeg::hardware_engines_wanted();
  if (engines_expected) {
    EXPECT_EQ(four.engines, 4) << "compute capability " << cc << ": no JPEG engine took them";
  } else if (!data::nvjpeg::hardware_engines_wanted()) {
    EXPECT_EQ(four.engines, 0) << "the JPEG engines are off (KILN_NVJPEG_HARDWARE), yet they decoded";
  }
  const data::GpuDecodeCounts mixed = decode({baseline, progressive, png, cmyk});
  EXPECT_EQ(mixed.engines + mixed.one_at_a_time, 2);
  EXPECT_EQ(mixed.cpu, 2);
  if (engines_expected) {
    EXPECT_EQ(mixed.engines, 1);
  }
}

// Damaged JPEGs get what kiln's CPU decoding gives them: a file whose marker structure is broken (jpeg_structure.h)
// goes to libjpeg-turbo instead of nvJPEG. Where libjpeg-turbo recovers (scan data overwritten with markers: the
// rest of the image is filled in), the batch holds its pixels; where it does not (a truncated file), the loader's
// error names the file.
TEST(GpuDecodeCuda, DamagedJpegsDecodeAsOnTheCpuOrAreNamed) {
  KILN_NEED_GPU_DECODE();
  const auto good = encode_jpeg(smooth_image(40, 40), 40, 40, 3);
  auto overwritten = good;
  for (size_t i = overwritten.size() / 2; i + 2 < overwritten.size(); i += 2) {
    overwritten[i] = 0xFF, overwritten[i + 1] = 0xC0;
  }
  const data::GpuDecodeCounts before = data::gpu_decode_counts();
  expect_decode_close(overwritten, 40, 40, 1e-3, 1e-3);  // libjpeg-turbo's pixels, uploaded
  EXPECT_EQ(data::gpu_decode_counts().cpu - before.cpu, 1);

  TempFolder dir;
  write_bytes(dir.file("a/good.jpg"), good);
  write_bytes(dir.file("a/truncated.jpg"),
              {good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() * 3 / 5)});
  auto ds = std::make_shared<data::ImageFolder>(dir.path().string(), T::imagenet_train(16),
                                                data::ImageFolderOptions{.decode = data::Decode::Gpu});
  data::DataLoader loader(ds, {.batch_size = 2, .device = Device::cuda(0)});
  try {
    for (auto& b : loader.epoch(0)) (void)b;
    FAIL() << "no error for a truncated JPEG";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("truncated.jpg"), std::string::npos) << e.what();
  }
}

// A JPEG that stores RGB (Adobe marker, transform 0) is decoded by libjpeg-turbo on the CPU: nvJPEG's output would
// read its channels as YCbCr.
TEST(GpuDecodeCuda, RgbCodedJpegsDecodeOnTheCpu) {
  KILN_NEED_GPU_DECODE();
  const int h = 40, w = 56;
  const auto img = smooth_image(h, w, 5);
  const data::GpuDecodeCounts before = data::gpu_decode_counts();
  expect_decode_close(encode_jpeg(img, h, w, 3, {.quality = 95, .rgb_coded = true}), h, w, 1e-3, 1e-3);
  EXPECT_EQ(data::gpu_decode_counts().cpu - before.cpu, 1);
}

}  // namespace
}  // namespace kiln::testing
