// Decoding JPEG and PNG files that the tests write with libjpeg/libpng: pixels, sizes, decode plans, errors.
#include <gtest/gtest.h>

#include <cmath>

#include "image_test_files.h"
#include "kiln/data/image.h"
#include "kiln/data/image_resize.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using data::Box;
using data::DecodePlan;

std::vector<uint8_t> pixels(const Tensor& t) { return t.contiguous().to_vector<uint8_t>(); }

// The largest absolute difference and the mean absolute difference of two equally long pixel arrays.
std::pair<int, double> diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  int worst = 0;
  double total = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const int d = std::abs(int(a[i]) - int(b[i]));
    worst = std::max(worst, d), total += d;
  }
  return {worst, a.empty() ? 0.0 : total / double(a.size())};
}

std::vector<uint16_t> widen(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

TEST(ImagePng, RgbIsExact) {
  TempFolder dir;
  auto img = random_image(7, 5, 3);
  write_bytes(dir.file("a.png"), encode_png(widen(img), 7, 5, {}));
  Tensor t = data::read_image(dir.file("a.png"));
  EXPECT_EQ(t.dtype(), DType::UInt8);
  EXPECT_EQ(t.shape(), (Shape{7, 5, 3}));
  EXPECT_EQ(pixels(t), img);
  EXPECT_EQ(data::image_size(dir.file("a.png")), (data::ImageSize{7, 5}));
}

TEST(ImagePng, GrayAlphaPaletteAndInterlacedBecomeRgb) {
  TempFolder dir;
  const int h = 9, w = 11;
  auto gray = random_image(h, w, 1, 2);
  auto expect_gray = std::vector<uint8_t>();
  for (uint8_t g : gray) expect_gray.insert(expect_gray.end(), {g, g, g});
  // 8-bit gray.
  write_bytes(dir.file("g.png"), encode_png(widen(gray), h, w, {.color_type = 0}));
  EXPECT_EQ(pixels(data::read_image(dir.file("g.png"))), expect_gray);
  // Gray + alpha: the alpha is dropped.
  std::vector<uint16_t> ga;
  for (uint8_t g : gray) ga.insert(ga.end(), {g, uint16_t(255 - g)});
  write_bytes(dir.file("ga.png"), encode_png(ga, h, w, {.color_type = 4}));
  EXPECT_EQ(pixels(data::read_image(dir.file("ga.png"))), expect_gray);
  // RGBA, interlaced (Adam7).
  auto rgb = random_image(h, w, 3, 3);
  std::vector<uint16_t> rgba;
  for (size_t i = 0; i < rgb.size(); i += 3) rgba.insert(rgba.end(), {rgb[i], rgb[i + 1], rgb[i + 2], 17});
  write_bytes(dir.file("rgba.png"), encode_png(rgba, h, w, {.color_type = 6, .interlace = true}));
  EXPECT_EQ(pixels(data::read_image(dir.file("rgba.png"))), rgb);
  // 16-bit RGB: v * 257 scales back to v exactly.
  std::vector<uint16_t> rgb16;
  for (uint8_t v : rgb) rgb16.push_back(uint16_t(v * 257));
  write_bytes(dir.file("rgb16.png"), encode_png(rgb16, h, w, {.color_type = 2, .bit_depth = 16}));
  EXPECT_EQ(pixels(data::read_image(dir.file("rgb16.png"))), rgb);
  // 4-bit palette of 16 colors.
  std::vector<uint8_t> palette = random_image(1, 16, 3, 4);
  std::vector<uint16_t> index;
  std::vector<uint8_t> expect_pal;
  for (int i = 0; i < h * w; ++i) {
    const int k = (i * 7) % 16;
    index.push_back(uint16_t(k));
    expect_pal.insert(expect_pal.end(), {palette[k * 3], palette[k * 3 + 1], palette[k * 3 + 2]});
  }
  write_bytes(dir.file("pal.png"), encode_png(index, h, w, {.color_type = 3, .bit_depth = 4, .palette = palette}));
  EXPECT_EQ(pixels(data::read_image(dir.file("pal.png"))), expect_pal);
  // 1-bit gray: 0 -> 0, 1 -> 255.
  std::vector<uint16_t> bits;
  std::vector<uint8_t> expect_bits;
  for (int i = 0; i < h * w; ++i) {
    bits.push_back(uint16_t(i % 3 == 0));
    const uint8_t v = i % 3 == 0 ? 255 : 0;
    expect_bits.insert(expect_bits.end(), {v, v, v});
  }
  write_bytes(dir.file("bits.png"), encode_png(bits, h, w, {.color_type = 0, .bit_depth = 1, .interlace = true}));
  EXPECT_EQ(pixels(data::read_image(dir.file("bits.png"))), expect_bits);
}

TEST(ImageJpeg, PlainGrayIsExactAndColorsAreClose) {
  TempFolder dir;
  const int h = 24, w = 40;
  std::vector<uint8_t> plain(h * w * 3, 77);
  write_bytes(dir.file("plain.jpg"), encode_jpeg(plain, h, w, 3));
  EXPECT_EQ(pixels(data::read_image(dir.file("plain.jpg"))), plain);
  // A grayscale JPEG comes out as RGB with equal channels.
  std::vector<uint8_t> gray(h * w, 200);
  write_bytes(dir.file("gray.jpg"), encode_jpeg(gray, h, w, 1));
  Tensor g = data::read_image(dir.file("gray.jpg"));
  EXPECT_EQ(g.shape(), (Shape{h, w, 3}));
  EXPECT_EQ(pixels(g), std::vector<uint8_t>(h * w * 3, 200));
  // CMYK (Adobe, inverted): r = c * k / 255.
  std::vector<uint8_t> cmyk;
  for (int i = 0; i < h * w; ++i) cmyk.insert(cmyk.end(), {200, 100, 50, 150});
  write_bytes(dir.file("cmyk.jpg"), encode_jpeg(cmyk, h, w, 4));
  Tensor c = data::read_image(dir.file("cmyk.jpg"));
  std::vector<uint8_t> expect_c;
  for (int i = 0; i < h * w; ++i) expect_c.insert(expect_c.end(), {118, 59, 29});  // 200*150/255 = 117.6, ...
  EXPECT_EQ(pixels(c), expect_c);
  // A smooth color photo-like image at quality 100, 4:4:4: within a few levels.
  auto img = smooth_image(h, w);
  write_bytes(dir.file("smooth.jpg"), encode_jpeg(img, h, w, 3));
  auto [worst, mean] = diff(pixels(data::read_image(dir.file("smooth.jpg"))), img);
  EXPECT_LE(worst, 4);
  EXPECT_LT(mean, 1.0);
  EXPECT_EQ(data::image_size(dir.file("smooth.jpg")), (data::ImageSize{h, w}));
}

TEST(ImageJpeg, SizeBehindLargeHeaderSegments) {
  TempFolder dir;
  auto img = smooth_image(10, 13);
  write_bytes(dir.file("big_header.jpg"), encode_jpeg(img, 10, 13, 3, {.extra_app_bytes = 150000}));
  EXPECT_EQ(data::image_size(dir.file("big_header.jpg")), (data::ImageSize{10, 13}));
}

// Decoding only the box's rows and columns gives the full decode's pixels there (libjpeg-turbo's crop + skip).
TEST(ImageJpeg, RegionDecodeMatchesFullDecode) {
  const int h = 120, w = 136;
  auto img = smooth_image(h, w, 3);
  for (bool subsample : {false, true}) {
    for (bool progressive : {false, true}) {
      auto bytes = encode_jpeg(img, h, w, 3, {.quality = 90, .subsample = subsample, .progressive = progressive});
      Tensor full = data::decode_image(bytes, "mem.jpg");
      for (Box box : {Box{0, 0, 120, 136}, Box{37, 21, 50, 70}, Box{70, 100, 50, 36}, Box{1, 17, 1, 1}}) {
        DecodePlan plan{.box = box, .out_height = 10, .out_width = 10, .dct_scaling = false};
        data::DecodedRegion r = data::decode_image_region(bytes, "mem.jpg", plan);
        SCOPED_TRACE("subsample " + std::to_string(subsample) + " progressive " + std::to_string(progressive) +
                     " box top " + std::to_string(box.top) + " left " + std::to_string(box.left));
        EXPECT_EQ(r.scale, 1.0);
        ASSERT_EQ(r.image.shape(), (Shape{int64_t(box.height), int64_t(box.width), 3}));
        EXPECT_EQ(r.box.top, 0);
        EXPECT_EQ(r.box.left, 0);
        Tensor expect =
            full.narrow(0, int64_t(box.top), int64_t(box.height)).narrow(1, int64_t(box.left), int64_t(box.width));
        auto [worst, mean] = diff(pixels(r.image), pixels(expect));
        // Exact, except that skipping part of a 4:2:0 iMCU row may move a pixel of the first rows by one level.
        EXPECT_LE(worst, subsample ? 1 : 0) << "mean " << mean;
      }
    }
  }
}

// With DCT scaling, the smallest k/8 that keeps the output resolution; values near full decode + resize.
TEST(ImageJpeg, DctScaledRegionIsCloseToFullDecodeAndResize) {
  const int h = 256, w = 320;
  auto img = smooth_image(h, w, 5);
  auto bytes = encode_jpeg(img, h, w, 3, {.quality = 95, .subsample = true});
  Tensor full = data::decode_image(bytes, "mem.jpg");
  struct Case {
    Box box;
    int64_t out;
    double scale;
  };
  for (Case c : {Case{{16, 40, 200, 200}, 50, 0.25}, Case{{0, 0, 256, 320}, 32, 0.125},
                 Case{{10, 10, 100, 100}, 90, 1.0}, Case{{33, 51, 160, 240}, 60, 3.0 / 8}}) {
    DecodePlan plan{.box = c.box, .out_height = c.out, .out_width = c.out, .dct_scaling = true};
    data::DecodedRegion r = data::decode_image_region(bytes, "mem.jpg", plan);
    EXPECT_EQ(r.scale, c.scale);
    EXPECT_GE(r.box.height, double(c.out) - 1e-9);
    EXPECT_GE(r.box.top, 0);
    EXPECT_LE(r.box.top + r.box.height, double(r.image.shape()[0]) + 1e-9);
    EXPECT_LE(r.box.left + r.box.width, double(r.image.shape()[1]) + 1e-9);
    Tensor fast = data::resize_image(r.image, c.out, c.out, r.box);
    Tensor exact = data::resize_image(full, c.out, c.out, c.box);
    auto [worst, mean] = diff(pixels(fast), pixels(exact));
    EXPECT_LT(mean, 2.5) << "scale " << c.scale;
    EXPECT_LT(worst, 40) << "scale " << c.scale;
  }
}

TEST(ImageErrors, BadFilesNameTheFile) {
  TempFolder dir;
  auto jpeg = encode_jpeg(smooth_image(64, 64), 64, 64, 3, {.quality = 90});
  auto png = encode_png(widen(random_image(16, 16, 3)), 16, 16, {});
  write_bytes(dir.file("empty.jpg"), {});
  write_bytes(dir.file("garbage.jpg"), {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'});
  write_bytes(dir.file("half.jpg"), std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + jpeg.size() / 2));
  write_bytes(dir.file("header_only.jpg"), std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + 20));
  write_bytes(dir.file("half.png"), std::vector<uint8_t>(png.begin(), png.begin() + png.size() / 2));
  auto corrupt = png;
  corrupt[png.size() / 2] ^= 0xFF;  // a CRC or zlib error
  write_bytes(dir.file("corrupt.png"), corrupt);
  write_bytes(dir.file("short.png"), std::vector<uint8_t>(png.begin(), png.begin() + 12));
  expect_error([&] { data::read_image(dir.file("empty.jpg")); }, {"empty.jpg", "empty"});
  expect_error([&] { data::image_size(dir.file("empty.jpg")); }, {"empty.jpg", "empty"});
  expect_error([&] { data::read_image(dir.file("garbage.jpg")); }, {"garbage.jpg", "neither JPEG nor PNG"});
  expect_error([&] { data::read_image(dir.file("half.jpg")); }, {"half.jpg", "decode"});
  expect_error([&] { data::read_image(dir.file("header_only.jpg")); }, {"header_only.jpg"});
  expect_error([&] { data::image_size(dir.file("header_only.jpg")); }, {"header_only.jpg"});
  expect_error([&] { data::read_image(dir.file("half.png")); }, {"half.png", "truncated"});
  expect_error([&] { data::read_image(dir.file("corrupt.png")); }, {"corrupt.png"});
  expect_error([&] { data::image_size(dir.file("short.png")); }, {"short.png", "IHDR"});
  expect_error([&] { data::read_image(dir.file("missing.png")); }, {"missing.png", "cannot open"});
  expect_error([&] { data::decode_image(std::vector<uint8_t>{0xFF, 0xD8, 0xFF}, "three.jpg"); }, {"three.jpg"});
}

// libjpeg-turbo recovers from scan data overwritten with markers (the rows after the damage are filled in), but a
// truncated file is an error, named with libjpeg's own message. Each libjpeg ABI (6.2 on Debian, 8 on Ubuntu)
// numbers these warnings differently: read with the wrong numbering, the first file fails and the second passes.
TEST(ImageJpeg, DamagedScanDataIsRecoveredAndATruncatedFileIsNot) {
  const int h = 96, w = 96;
  const auto good = encode_jpeg(smooth_image(h, w), h, w, 3, {.quality = 90});
  const std::vector<uint8_t> whole = pixels(data::decode_image(good, "good.jpg"));
  auto overwritten = good;
  for (size_t i = overwritten.size() * 3 / 4; i + 2 < overwritten.size(); i += 2) {
    overwritten[i] = 0xFF, overwritten[i + 1] = 0xC0;
  }
  Tensor recovered = data::decode_image(overwritten, "overwritten.jpg");
  ASSERT_EQ(recovered.shape(), (Shape{h, w, 3}));
  const std::vector<uint8_t> got = pixels(recovered);
  const size_t first_rows = 16 * w * 3;  // the first row of MCUs lies well before the damage
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + first_rows, whole.begin()));
  const std::vector<uint8_t> truncated(good.begin(), good.begin() + good.size() * 3 / 5);
  expect_error([&] { data::decode_image(truncated, "truncated.jpg"); },
               {"truncated.jpg", "Premature end of JPEG file"});
}

}  // namespace
}  // namespace kiln::testing
