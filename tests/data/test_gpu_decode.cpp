// GPU image decoding, the parts that run on the CPU: the crop and flip each image gets (the same as the CPU
// transforms' for the same seed), the samples worker threads make, unsupported pipelines, bad files, and the
// messages when nvJPEG or a GPU is missing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <span>
#include <string>

#include "gpu_decode_reference.h"
#include "image_test_files.h"
#include "kiln/data/dataloader.h"
#include "kiln/data/gpu_decode/gpu_sample.h"
#include "kiln/data/gpu_decode/jpeg_structure.h"
#include "kiln/data/gpu_decode/nvjpeg_library.h"
#include "kiln/data/image_folder.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

namespace T = data::transforms;

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// The CPU pipeline's output on a small image (upscaled, where the antialiased and the plain bilinear filters are
// the same) against the float64 reference drawn from the GPU plan: equal up to the CPU's uint8 rounding. So the
// plan holds the same box and flip as the CPU transform drew for this seed.
void expect_plan_matches_cpu(const T::Compose& compose, int h, int w, uint64_t seed, int64_t index) {
  const auto pixels = random_image(h, w, 3, seed + 7);
  const auto png = encode_png({pixels.begin(), pixels.end()}, h, w, {});
  data::SampleRng cpu_rng(seed, 0, index);
  Tensor cpu = compose.load(png, "x.png", cpu_rng);  // (3, oh, ow) float32
  auto gpu = data::GpuTransform::from(compose);
  data::SampleRng plan_rng(seed, 0, index);
  const data::GpuImagePlan p = gpu.plan({h, w}, plan_rng);
  const auto out = gpu.output_size();
  const auto ref =
      gpu_decode_reference(pixels, h, w, p, out.height, out.width, {gpu.mean()[0], gpu.mean()[1], gpu.mean()[2]},
                           {gpu.std()[0], gpu.std()[1], gpu.std()[2]});
  const auto got = cpu.to_vector<double>();
  ASSERT_EQ(got.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - ref[i]));
  // The CPU's fixed-point resize and its uint8 rounding: within 1.5 levels (over the smallest std, 0.224). A
  // wrong box or flip on these random pixels is off by tens of levels.
  EXPECT_LT(worst, 1.5 / 255.0 / 0.224) << "seed " << seed << " index " << index << " box " << p.box.top << ","
                                        << p.box.left << "," << p.box.height << "," << p.box.width << " flip "
                                        << p.flip;
}

TEST(GpuDecode, TrainPlanDrawsTheCpuTransformsCropAndFlip) {
  const T::Compose train{T::RandomResizedCrop(64), T::RandomHorizontalFlip(0.5), T::ToTensor(),
                         T::Normalize(T::kImageNetMean, T::kImageNetStd)};
  int flips = 0;
  for (int64_t index = 0; index < 12; ++index) {
    expect_plan_matches_cpu(train, 30 + static_cast<int>(index), 41, 5, index);
    data::SampleRng rng(5, 0, index);
    flips += data::GpuTransform::from(train).plan({30 + index, 41}, rng).flip;
  }
  EXPECT_GT(flips, 0);  // both ways were drawn, so the flip was checked
  EXPECT_LT(flips, 12);
}

TEST(GpuDecode, EvalPlanIsResizeThenCenterCrop) {
  const T::Compose eval{T::Resize(data::ImageSize{90, 120}), T::CenterCrop(70), T::ToTensor(),
                        T::Normalize(T::kImageNetMean, T::kImageNetStd)};
  expect_plan_matches_cpu(eval, 37, 52, 1, 0);
  auto gpu = data::GpuTransform::from(eval);
  data::SampleRng rng(1, 0, 0);
  const auto p = gpu.plan({37, 52}, rng);
  // Crop top = round((90 - 70) / 2) = 10 of 90 rows resized from 37: 10 * 37 / 90 source rows.
  EXPECT_DOUBLE_EQ(p.box.top, 10.0 * 37 / 90);
  EXPECT_DOUBLE_EQ(p.box.height, 70.0 * 37 / 90);
  EXPECT_DOUBLE_EQ(p.box.left, 25.0 * 52 / 120);
  EXPECT_DOUBLE_EQ(p.clamp.height, 37);
  EXPECT_FALSE(p.flip);
}

TEST(GpuDecode, PipelinesTheGpuLacksAreRefusedNamingTheStep) {
  const std::string m1 = message_of([] { data::GpuTransform::from(T::Compose{T::RandomCrop(8), T::ToTensor()}); });
  EXPECT_NE(m1.find("RandomCrop"), std::string::npos) << m1;
  EXPECT_NE(m1.find("Decode::Cpu"), std::string::npos) << m1;
  const std::string m2 = message_of([] { data::GpuTransform::from(T::Compose{T::RandomResizedCrop(8)}); });
  EXPECT_NE(m2.find("ToTensor"), std::string::npos) << m2;
  const std::string m3 = message_of([] { data::GpuTransform::from(T::Compose{T::Resize(8), T::ToTensor()}); });
  EXPECT_NE(m3.find("CenterCrop"), std::string::npos) << m3;
  const std::string m4 = message_of([] { data::GpuTransform::from(T::imagenet_train(8), {.dtype = DType::Float16}); });
  EXPECT_NE(m4.find("float32 or bfloat16"), std::string::npos) << m4;
}

TEST(GpuDecode, SampleHoldsTheFileAndThePlan) {
  TempFolder dir;
  const auto jpeg = encode_jpeg(smooth_image(33, 47), 33, 47, 3);
  auto gpu = data::GpuTransform::from(T::imagenet_train(16));
  data::SampleRng rng(3, 1, 9), same(3, 1, 9);
  data::Example ex = data::gpu_sample(jpeg, "a.jpg", gpu, rng, 4, 9);
  EXPECT_EQ(ex["encoded"].to_vector<uint8_t>(), jpeg);
  EXPECT_EQ(ex["label"].item<int64_t>(), 4);
  EXPECT_EQ(ex["index"].item<int64_t>(), 9);
  const data::GpuSamplePlan s = data::read_gpu_plan(ex);
  EXPECT_TRUE(s.is_jpeg);
  EXPECT_EQ(s.size, (data::ImageSize{33, 47}));  // from the header
  const data::GpuImagePlan expect = gpu.plan({33, 47}, same);
  EXPECT_EQ(s.plan.box.top, expect.box.top);
  EXPECT_EQ(s.plan.box.width, expect.box.width);
  EXPECT_EQ(s.plan.flip, expect.flip);

  // A PNG is decoded here; its pixels travel instead of its bytes.
  const auto pixels = random_image(5, 7, 3, 2);
  data::SampleRng rng2(0, 0, 0);
  data::Example png = data::gpu_sample(encode_png({pixels.begin(), pixels.end()}, 5, 7, {}), "b.png", gpu, rng2, 0, 0);
  EXPECT_FALSE(data::read_gpu_plan(png).is_jpeg);
  EXPECT_EQ(png["encoded"].to_vector<uint8_t>(), pixels);
}

TEST(GpuDecode, BadFilesAreNamed) {
  auto gpu = data::GpuTransform::from(T::imagenet_train(16));
  data::SampleRng rng(0, 0, 0);
  std::vector<uint8_t> garbage = {0xFF, 0xD8, 0xFF, 0x00, 0x13, 0x37, 0x42};  // SOI, then no frame
  const std::string m = message_of([&] { data::gpu_sample(garbage, "/data/broken.jpg", gpu, rng, 0, 0); });
  EXPECT_NE(m.find("/data/broken.jpg"), std::string::npos) << m;
  const std::string m2 = message_of([&] { data::gpu_sample({'h', 'i'}, "/data/notes.jpg", gpu, rng, 0, 0); });
  EXPECT_NE(m2.find("/data/notes.jpg"), std::string::npos) << m2;
}

// The marker walk that sends broken files to libjpeg-turbo instead of nvJPEG (jpeg_structure.h).
TEST(GpuDecode, JpegStructureWalkFindsBrokenFiles) {
  const int h = 64, w = 80;
  const auto img = smooth_image(h, w, 2);
  const std::vector<uint8_t> gray = first_channel(img);
  const std::vector<std::vector<uint8_t>> sound = {
      encode_jpeg(img, h, w, 3, {.quality = 90}),
      encode_jpeg(img, h, w, 3, {.quality = 90, .subsample = true}),
      encode_jpeg(img, h, w, 3, {.quality = 90, .progressive = true}),  // several scans, tables between them
      encode_jpeg(img, h, w, 3, {.quality = 90, .restart_rows = 1}),    // FF D0..D7 inside the scan data
      encode_jpeg(img, h, w, 3, {.quality = 100, .extra_app_bytes = 70000}),
      encode_jpeg(gray, h, w, 1, {.quality = 95}),
      encode_jpeg(random_image(h, w, 4, 3), h, w, 4, {.quality = 95}),
      encode_jpeg(random_image(h, w, 3, 4), h, w, 3, {.quality = 100}),  // noise: many FF 00 in the data
  };
  for (size_t k = 0; k < sound.size(); ++k) EXPECT_EQ(data::gpu::inspect_jpeg(sound[k]).problem, "") << "file " << k;
  int restarts = 0;  // the restart file has its markers
  for (size_t i = 0; i + 1 < sound[3].size(); ++i) restarts += sound[3][i] == 0xFF && (sound[3][i + 1] & 0xF8) == 0xD0;
  EXPECT_GE(restarts, 7);
  const std::vector<uint8_t> good = sound[1];
  auto problem = [](const std::vector<uint8_t>& f) { return data::gpu::inspect_jpeg(f).problem; };
  auto expect_found = [&](const std::vector<uint8_t>& f, const std::string& part) {
    const std::string p = problem(f);
    EXPECT_NE(p.find(part), std::string::npos) << "'" << p << "' should say '" << part << "'";
  };
  // Bytes after EOI are allowed, as libjpeg-turbo allows them.
  auto trailing = good;
  trailing.insert(trailing.end(), {0x00, 0x12, 0xFF, 0xC0});
  EXPECT_EQ(problem(trailing), "");
  // The second half overwritten with SOF markers (GpuDecodeCuda.CorruptJpegIsNamed's file).
  auto overwritten = good;
  for (size_t i = overwritten.size() / 2; i + 2 < overwritten.size(); i += 2)
    overwritten[i] = 0xFF, overwritten[i + 1] = 0xC0;
  expect_found(overwritten, "FF C0 after the first scan");
  // Truncated: in the scan data, in a segment, or right after SOI.
  expect_found({good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() * 3 / 4)}, "no EOI");
  expect_found({good.begin(), good.begin() + 30}, "runs past the file");
  expect_found({good.begin(), good.begin() + 4}, "cut off by the end of the file");
  expect_found({good.begin(), good.end() - 2}, "no EOI");
  expect_found({0x00, 0xD8, 0xFF, 0xD9}, "no SOI");
  expect_found({}, "no SOI");
  expect_found({0xFF, 0xD8, 0xFF, 0xD9}, "EOI before any scan");
  expect_found({0xFF, 0xD8, 0x12, 0x34, 0xFF, 0xD9}, "not a marker");
  // A second frame header before the scan: SOF0 copied next to itself.
  size_t sof = 2;
  while (!(good[sof] == 0xFF && good[sof + 1] == 0xC0))
    sof += 2 + (static_cast<size_t>(good[sof + 2]) << 8 | good[sof + 3]);
  const size_t sof_length = 2 + (static_cast<size_t>(good[sof + 2]) << 8 | good[sof + 3]);
  auto two_frames = good;
  two_frames.insert(two_frames.begin() + static_cast<std::ptrdiff_t>(sof),
                    good.begin() + static_cast<std::ptrdiff_t>(sof),
                    good.begin() + static_cast<std::ptrdiff_t>(sof + sof_length));
  expect_found(two_frames, "second frame header");
  // A segment length past the end of the file (the first segment after SOI).
  auto long_segment = good;
  long_segment[4] = 0xFF, long_segment[5] = 0xF0;
  expect_found(long_segment, "runs past the file");
  // SOI inside the scan data.
  auto soi_inside = good;
  soi_inside[soi_inside.size() - 10] = 0xFF, soi_inside[soi_inside.size() - 9] = 0xD8;
  expect_found(soi_inside, "misplaced marker FF D8");
}

// Which JPEGs store RGB, by libjpeg-turbo's rule: files libjpeg writes, and the same headers edited.
TEST(GpuDecode, RgbCodedJpegsAreFound) {
  auto stores_rgb = [](std::span<const uint8_t> f) { return data::gpu::inspect_jpeg(f).stores_rgb; };
  const int h = 24, w = 40;
  const auto img = smooth_image(h, w, 3);
  const std::vector<uint8_t> gray = first_channel(img);
  const auto ycc = encode_jpeg(img, h, w, 3, {.quality = 90});                     // JFIF marker, ids 1, 2, 3
  const auto rgb = encode_jpeg(img, h, w, 3, {.quality = 90, .rgb_coded = true});  // Adobe transform 0, ids R G B
  EXPECT_FALSE(stores_rgb(ycc));
  EXPECT_TRUE(stores_rgb(rgb));
  EXPECT_FALSE(stores_rgb(encode_jpeg(img, h, w, 3, {.quality = 90, .subsample = true})));
  EXPECT_FALSE(stores_rgb(encode_jpeg(gray, h, w, 1, {.quality = 90})));
  EXPECT_FALSE(stores_rgb(encode_jpeg(random_image(h, w, 4, 2), h, w, 4, {.quality = 90})));
  EXPECT_FALSE(stores_rgb({}));
  EXPECT_FALSE(stores_rgb({rgb.begin(), rgb.begin() + 6}));  // cut off in the headers
  // Where a segment starts (its FF), by marker code; the headers before the first scan.
  auto segment = [](const std::vector<uint8_t>& f, uint8_t marker) {
    size_t i = 2;
    while (i + 4 <= f.size() && f[i + 1] != marker && f[i + 1] != 0xDA) i += 2 + (size_t{f[i + 2]} << 8 | f[i + 3]);
    return f[i + 1] == marker ? i : std::string::npos;
  };
  const size_t adobe = segment(rgb, 0xEE);
  ASSERT_NE(adobe, std::string::npos) << "libjpeg wrote no Adobe marker for an RGB file";
  // The Adobe marker's transform (the 12th byte of its data) decides: 1 means YCbCr, whatever the ids say.
  auto transform1 = rgb;
  transform1[adobe + 4 + 11] = 1;
  EXPECT_FALSE(stores_rgb(transform1));
  // Without the Adobe marker, the ids 'R', 'G', 'B' decide.
  const size_t adobe_length = 2 + (size_t{rgb[adobe + 2]} << 8 | rgb[adobe + 3]);
  std::vector<uint8_t> ids_only = rgb;
  ids_only.erase(ids_only.begin() + static_cast<std::ptrdiff_t>(adobe),
                 ids_only.begin() + static_cast<std::ptrdiff_t>(adobe + adobe_length));
  EXPECT_TRUE(stores_rgb(ids_only));
  // A JFIF marker means YCbCr even beside the ids 'R', 'G', 'B' (libjpeg-turbo's order).
  const size_t jfif = segment(ycc, 0xE0);
  ASSERT_NE(jfif, std::string::npos);
  const size_t jfif_length = 2 + (size_t{ycc[jfif + 2]} << 8 | ycc[jfif + 3]);
  std::vector<uint8_t> jfif_and_ids = ids_only;
  jfif_and_ids.insert(jfif_and_ids.begin() + 2, ycc.begin() + static_cast<std::ptrdiff_t>(jfif),
                      ycc.begin() + static_cast<std::ptrdiff_t>(jfif + jfif_length));
  EXPECT_FALSE(stores_rgb(jfif_and_ids));
  // libjpeg-turbo agrees on each: the RGB ones decode to the image's colours, as the YCbCr one does.
  const std::vector<uint8_t>* rgb_files[] = {&rgb, &ids_only};
  for (const std::vector<uint8_t>* f : rgb_files) {
    Tensor px = data::decode_image(*f, "rgb.jpg");
    const auto got = px.to_vector<uint8_t>();
    int worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(int{got[i]} - int{img[i]}));
    EXPECT_LE(worst, 16) << "libjpeg-turbo reads this file's colours otherwise";
  }
}

TEST(GpuDecode, MissingNvjpegSaysHowToGetIt) {
  const auto r = data::nvjpeg::load({"/nonexistent/libnvjpeg.so.13"});
  EXPECT_EQ(r.functions, nullptr);
  if (data::nvjpeg::built_with_header()) {
    EXPECT_NE(r.error.find("/nonexistent/libnvjpeg.so.13"), std::string::npos) << r.error;
  } else {
    EXPECT_NE(r.error.find("built without"), std::string::npos) << r.error;
  }
  EXPECT_NE(r.error.find("scripts/setup.sh"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("Decode::Cpu"), std::string::npos) << r.error;

  // KILN_NVJPEG_LIBRARY is the only place looked at when set.
  ::setenv("KILN_NVJPEG_LIBRARY", "/opt/x/libnvjpeg.so.13", 1);
  const auto paths = data::nvjpeg::candidate_paths();
  ::unsetenv("KILN_NVJPEG_LIBRARY");
  EXPECT_EQ(paths, std::vector<std::string>{"/opt/x/libnvjpeg.so.13"});
  const auto defaults = data::nvjpeg::candidate_paths();
  ASSERT_FALSE(defaults.empty());
  EXPECT_EQ(defaults[0], "libnvjpeg.so.13");
}

TEST(GpuDecode, ImageFolderOption) {
  TempFolder dir;
  write_bytes(dir.file("cat/a.jpg"), encode_jpeg(smooth_image(20, 30), 20, 30, 3));
  write_bytes(dir.file("dog/b.jpg"), encode_jpeg(smooth_image(25, 18), 25, 18, 3));
  data::ImageFolder cpu(dir.path().string(), T::imagenet_train(16));
  EXPECT_FALSE(static_cast<bool>(cpu.collate_fn()));
  auto gpu = std::make_shared<data::ImageFolder>(dir.path().string(), T::imagenet_train(16),
                                                 data::ImageFolderOptions{.decode = data::Decode::Gpu});
  EXPECT_TRUE(static_cast<bool>(gpu->collate_fn()));
  EXPECT_TRUE(static_cast<bool>(data::subset(gpu, 0, 1)->collate_fn()));  // a subset batches as its base
  data::Example ex = gpu->sample(1);
  EXPECT_EQ(data::read_gpu_plan(ex).size, (data::ImageSize{25, 18}));
  EXPECT_EQ(ex["label"].item<int64_t>(), 1);

  const std::string m = message_of([&] {
    data::ImageFolder bad(dir.path().string(), [](Tensor t, data::SampleRng&) { return t; },
                          {.decode = data::Decode::Gpu});
  });
  EXPECT_NE(m.find("Compose"), std::string::npos) << m;

  if (!cuda::is_available()) {  // here, a loader says what is missing instead of decoding
    data::DataLoader loader(gpu, {.batch_size = 2});
    const std::string m2 = message_of([&] {
      for (auto& b : loader.epoch(0)) (void)b;
    });
    EXPECT_NE(m2.find("Decode::Cpu"), std::string::npos) << m2;
  }
}

TEST(GpuDecode, LoaderNamesABadFile) {
  TempFolder dir;
  write_bytes(dir.file("cat/a.jpg"), encode_jpeg(smooth_image(20, 30), 20, 30, 3));
  write_bytes(dir.file("cat/b.jpg"), {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x02, 0x00});
  auto gpu = std::make_shared<data::ImageFolder>(dir.path().string(), T::imagenet_train(16),
                                                 data::ImageFolderOptions{.decode = data::Decode::Gpu});
  data::DataLoader loader(gpu, {.batch_size = 2, .workers = 1});
  const std::string m = message_of([&] {
    for (auto& b : loader.epoch(0)) (void)b;
  });
  EXPECT_NE(m.find("b.jpg"), std::string::npos) << m;
}

}  // namespace
}  // namespace kiln::testing
