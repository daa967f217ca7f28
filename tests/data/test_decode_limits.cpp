// Limits of the decoders (DESIGN.md rule 11): headers that claim sizes the file cannot hold. A JPEG or PNG
// whose header claims more than data::max_image_pixels() pixels is refused from the header, naming the file,
// the claimed size and how to raise the limit; ImageFolder's skip_bad_files skips it without decoding it. An
// IDX (MNIST) header whose dims multiply past 2^63-1 is refused, naming the file.
//
// Before these checks: the 60000 x 60000 JPEG was decoded into a 10.8 GB tensor, the 100000 x 100000 PNG died
// in the allocator with a message that named no file, and the IDX file was accepted (its dims' product wrapped
// to 0) and segfaulted on the first sample.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/format_files.h"
#include "data/image_test_files.h"
#include "kiln/data/datasets/mnist.h"
#include "kiln/data/gpu_decode/gpu_sample.h"
#include "kiln/data/image.h"
#include "kiln/data/image_folder.h"
#include "kiln/data/transforms.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

// Restores the process-wide limit when a test ends, whatever it set.
struct PixelLimitGuard {
  std::optional<int64_t> saved = data::max_image_pixels();
  ~PixelLimitGuard() { data::set_max_image_pixels(saved); }
};

// A real 16 x 16 JPEG whose frame header (SOF0) is rewritten to claim height x width.
std::vector<uint8_t> jpeg_claiming(int height, int width) {
  std::vector<uint8_t> jpeg = encode_jpeg(smooth_image(16, 16), 16, 16, 3);
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {  // SOF0: FF C0, length (2), precision (1), height (2), width (2)
      jpeg[i + 5] = static_cast<uint8_t>(height >> 8), jpeg[i + 6] = static_cast<uint8_t>(height);
      jpeg[i + 7] = static_cast<uint8_t>(width >> 8), jpeg[i + 8] = static_cast<uint8_t>(width);
      return jpeg;
    }
  }
  ADD_FAILURE() << "no SOF0 marker in the encoded JPEG";
  return jpeg;
}

// A real 1 x 1 RGB PNG whose IHDR is rewritten (with its CRC) to claim height x width.
std::vector<uint8_t> png_claiming(uint32_t height, uint32_t width) {
  std::vector<uint8_t> png = encode_png({10, 20, 30}, 1, 1, {});
  // Signature (8), IHDR length (4), "IHDR" (4) at 12, width at 16, height at 20, ..., CRC at 29 over [12, 29).
  auto put = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) png[at + k] = static_cast<uint8_t>(v >> (24 - 8 * k));
  };
  put(16, width);
  put(20, height);
  put(29, static_cast<uint32_t>(crc32(0, png.data() + 12, 17)));
  return png;
}

TEST(DecodeLimits, DefaultIsWherePILRefuses) {
  EXPECT_EQ(data::kDefaultMaxImagePixels, 178956970);  // 2 x PIL's Image.MAX_IMAGE_PIXELS (89,478,485)
  EXPECT_EQ(data::max_image_pixels(), std::optional<int64_t>(data::kDefaultMaxImagePixels));
}

TEST(DecodeLimits, JpegBombIsRefusedFromItsHeader) {
  TempFolder dir;
  const std::vector<uint8_t> bomb = jpeg_claiming(60000, 60000);
  ASSERT_LT(bomb.size(), 4096u);
  const std::string path = dir.write("bomb.jpg", bomb).string();
  const std::vector<std::string> fragments = {"'" + path + "'", "60000 x 60000 = 3600000000 pixels",
                                              "limit of 178956970", "set_max_image_pixels"};
  expect_error([&] { (void)data::read_image(path); }, fragments);
  expect_error([&] { (void)data::image_size(path); }, fragments);
  expect_error(
      [&] {
        (void)data::decode_image_region(bomb, path,
                                        {.box = {0, 0, 8, 8}, .out_height = 8, .out_width = 8, .dct_scaling = true});
      },
      fragments);
}

TEST(DecodeLimits, PngBombIsRefusedNamingTheFile) {
  TempFolder dir;
  const std::string path = dir.write("bomb.png", png_claiming(100000, 100000)).string();
  expect_error([&] { (void)data::read_image(path); },
               {"decode_png", "'" + path + "'", "100000 x 100000 = 10000000000 pixels", "set_max_image_pixels"});
  expect_error([&] { (void)data::image_size(path); }, {"image_size", path, "100000 x 100000"});
}

TEST(DecodeLimits, ImageTheHostHasNoMemoryForNamesTheFile) {
  if (kSanitizerBuild) GTEST_SKIP() << "an address-space limit cannot stand for out-of-memory under a sanitizer";
  // 10000 x 10000 is within the pixel limit; its 300 MB of pixels are not within a 64 MiB allowance.
  const std::vector<uint8_t> png = png_claiming(10000, 10000);
  const ThrownUnderMemoryLimit got =
      run_under_memory_limit([&] { (void)data::decode_image(png, "/data/large.png"); }, 64 << 20);
  EXPECT_EQ(got.kind, "OutOfMemoryError") << got.message;
  EXPECT_NE(got.message.find("'/data/large.png' (10000 x 10000 pixels)"), std::string::npos) << got.message;
}

TEST(DecodeLimits, TheLimitIsConfigurableAndInclusive) {
  PixelLimitGuard guard;
  const std::vector<uint8_t> jpeg = encode_jpeg(smooth_image(16, 16), 16, 16, 3);  // 256 pixels
  const std::vector<uint16_t> samples(3 * 16 * 16, 7);
  const std::vector<uint8_t> png = encode_png(samples, 16, 16, {});
  data::set_max_image_pixels(256);
  EXPECT_EQ(data::decode_image(jpeg, "a.jpg").shape(), (Shape{16, 16, 3}));
  EXPECT_EQ(data::decode_image(png, "a.png").shape(), (Shape{16, 16, 3}));
  data::set_max_image_pixels(255);
  expect_error([&] { (void)data::decode_image(jpeg, "a.jpg"); },
               {"decode_jpeg: 'a.jpg' claims 16 x 16 = 256 pixels", "limit of 255"});
  expect_error([&] { (void)data::decode_image(png, "a.png"); }, {"decode_png: 'a.png' claims 16 x 16", "255"});
  data::set_max_image_pixels(std::nullopt);  // no limit, as PIL's MAX_IMAGE_PIXELS = None
  EXPECT_EQ(data::decode_image(jpeg, "a.jpg").shape(), (Shape{16, 16, 3}));
  expect_error([] { data::set_max_image_pixels(0); }, {"set_max_image_pixels", "positive"});
}

TEST(DecodeLimits, ImageFolderSkipsABombAsABadFile) {
  TempFolder dir;
  dir.write("cat/good.jpg", encode_jpeg(smooth_image(16, 16), 16, 16, 3));
  const std::string bomb = dir.write("cat/bomb.jpg", jpeg_claiming(60000, 60000)).string();
  const std::string png_bomb = dir.write("dog/bomb.png", png_claiming(100000, 100000)).string();
  dir.write("dog/good.png", encode_png(std::vector<uint16_t>(3 * 4 * 4, 9), 4, 4, {}));
  ::testing::internal::CaptureStderr();
  data::ImageFolder lenient(dir.path().string(), {}, {.skip_bad_files = true});
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(lenient.size(), 2);
  EXPECT_EQ(lenient.samples()[0].path, dir.file("cat/good.jpg"));
  EXPECT_EQ(lenient.samples()[1].path, dir.file("dog/good.png"));
  ASSERT_EQ(lenient.skipped_files().size(), 2u);
  EXPECT_EQ(lenient.skipped_files()[0].first, bomb);
  EXPECT_NE(lenient.skipped_files()[0].second.find("60000 x 60000"), std::string::npos);
  EXPECT_EQ(lenient.skipped_files()[1].first, png_bomb);
  EXPECT_NE(warnings.find(bomb), std::string::npos);
  // Without skipping, the bomb is a sample whose get() throws naming it (before allocating its pixels).
  data::ImageFolder strict(dir.path().string());
  ASSERT_EQ(strict.size(), 4);
  EXPECT_EQ(strict.samples()[0].path, bomb);
  expect_error([&] { (void)strict.sample(0); }, {bomb, "pixels"});
  EXPECT_TRUE(strict.skipped_files().empty());
}

TEST(DecodeLimits, GpuDecodingReadsTheLimitFromTheHeaderOnTheWorker) {
  // Decode::Gpu: the worker parses the header (image_size) before anything goes to the GPU, so nvJPEG never
  // sees a bomb and no device buffer is sized from it. PNGs are decoded on the worker, under the same limit.
  auto gpu = data::GpuTransform::from(data::transforms::imagenet_train(16));
  data::SampleRng rng(0, 0, 0);
  expect_error([&] { (void)data::gpu_sample(jpeg_claiming(60000, 60000), "/data/bomb.jpg", gpu, rng, 0, 0); },
               {"'/data/bomb.jpg' claims 60000 x 60000", "set_max_image_pixels"});
  expect_error([&] { (void)data::gpu_sample(png_claiming(100000, 100000), "/data/bomb.png", gpu, rng, 0, 0); },
               {"decode_png: '/data/bomb.png' claims 100000 x 100000"});
}

TEST(DecodeLimits, MnistHeaderWhoseDimsOverflowIsRefused) {
  TempFolder dir;
  // 65536 x 2^24 x 2^24 = 2^64 elements: the product wraps to 0, which matched the 16-byte file.
  std::vector<uint8_t> images;
  for (uint32_t v : {2051u, 65536u, 1u << 24, 1u << 24}) append_big_endian(images, v);
  std::vector<uint8_t> labels;
  append_big_endian(labels, 2049);
  append_big_endian(labels, 65536);
  labels.resize(labels.size() + 65536, 3);
  write_bytes(dir / "train-images-idx3-ubyte", images);
  write_bytes(dir / "train-labels-idx1-ubyte", labels);
  expect_error([&] { data::MNIST m(dir.path()); },
               {(dir / "train-images-idx3-ubyte").string(), "dims [65536, 16777216, 16777216]", "2^63-1"});
}

}  // namespace
}  // namespace kiln::testing
