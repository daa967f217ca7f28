// Image transforms against hand-computed values, an independent float64 resize, invariants of
// RandomResizedCrop's sampling, and (golden) torchvision's resize.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "image_test_files.h"
#include "kiln/data/image_resize.h"
#include "kiln/data/transforms.h"
#include "kiln/tensor/internal_ops.h"
#include "support/golden.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

namespace T = data::transforms;
using data::SampleRng;

Tensor u8(const std::vector<uint8_t>& v, Shape shape) { return internal::from_vector(v, shape); }
std::vector<uint8_t> pixels(const Tensor& t) { return t.contiguous().to_vector<uint8_t>(); }

// value = 10 * y + x, one channel: positions readable from the values.
Tensor grid(int64_t h, int64_t w) {
  std::vector<uint8_t> v;
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) v.push_back(uint8_t(10 * y + x));
  return u8(v, {h, w, 1});
}

// Bilinear resize with the triangle filter widened by the downscale factor, from the definition, in float64,
// with no intermediate rounding: out = round(sum_y wy * sum_x wx * in), weights normalized per output pixel.
std::vector<uint8_t> reference_resize(const std::vector<uint8_t>& in, int64_t h, int64_t w, int64_t c, data::Box box,
                                      int64_t oh, int64_t ow) {
  auto weights = [](double start, double size, int64_t out) {
    std::vector<std::vector<std::pair<int64_t, double>>> r(out);
    const double scale = size / double(out), support = std::max(scale, 1.0);
    for (int64_t o = 0; o < out; ++o) {
      const double center = start + (double(o) + 0.5) * scale;
      double total = 0;
      for (int64_t i = int64_t(std::floor(start)); i < int64_t(std::ceil(start + size)); ++i) {
        const double wt = std::max(0.0, 1.0 - std::abs((double(i) + 0.5 - center) / support));
        if (wt > 0) r[o].push_back({i, wt}), total += wt;
      }
      for (auto& [i, wt] : r[o]) wt /= total;
    }
    return r;
  };
  auto wy = weights(box.top, box.height, oh), wx = weights(box.left, box.width, ow);
  std::vector<uint8_t> out;
  for (int64_t y = 0; y < oh; ++y)
    for (int64_t x = 0; x < ow; ++x)
      for (int64_t ch = 0; ch < c; ++ch) {
        double v = 0;
        for (auto [iy, a] : wy[y])
          for (auto [ix, b] : wx[x]) v += a * b * in[(iy * w + ix) * c + ch];
        out.push_back(uint8_t(std::clamp(std::lround(v), 0L, 255L)));
      }
  return out;
}

void expect_within(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, int tolerance) {
  ASSERT_EQ(a.size(), b.size());
  int worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(int(a[i]) - int(b[i])));
  EXPECT_LE(worst, tolerance);
}

TEST(TransformsResize, MatchesFloat64Definition) {
  struct Case {
    int64_t h, w, c, oh, ow;
    data::Box box;
  };
  for (Case k : {Case{37, 53, 3, 16, 20, {0, 0, 37, 53}}, Case{7, 9, 3, 20, 15, {0, 0, 7, 9}},
                 Case{40, 12, 1, 13, 30, {0, 0, 40, 12}}, Case{30, 40, 3, 11, 17, {5, 7, 20, 25}},
                 Case{30, 40, 2, 9, 9, {2.5, 3.25, 20.5, 30.0}}, Case{64, 64, 3, 7, 7, {0, 0, 64, 64}}}) {
    auto img = random_image(int(k.h), int(k.w), int(k.c), uint64_t(k.h * 100 + k.oh));
    Tensor out = data::resize_image(u8(img, {k.h, k.w, k.c}), k.oh, k.ow, k.box);
    ASSERT_EQ(out.shape(), (Shape{k.oh, k.ow, k.c}));
    SCOPED_TRACE(std::to_string(k.h) + "x" + std::to_string(k.w) + " -> " + std::to_string(k.oh) + "x" +
                 std::to_string(k.ow));
    expect_within(pixels(out), reference_resize(img, k.h, k.w, k.c, k.box, k.oh, k.ow), 1);
  }
  // Same size: the identity, exactly.
  auto img = random_image(5, 6, 3);
  EXPECT_EQ(pixels(data::resize_image(u8(img, {5, 6, 3}), 5, 6)), img);
}

TEST(TransformsResize, ShorterSideAsTorchvision) {
  SampleRng rng(0, 0, 0);
  EXPECT_EQ(T::Resize(32)(u8(random_image(100, 50, 3), {100, 50, 3}), rng).shape(), (Shape{64, 32, 3}));
  EXPECT_EQ(T::Resize(10)(u8(random_image(30, 47, 3), {30, 47, 3}), rng).shape(), (Shape{10, 15, 3}));  // 15.67
  EXPECT_EQ(T::Resize(data::ImageSize{7, 9})(u8(random_image(30, 47, 3), {30, 47, 3}), rng).shape(), (Shape{7, 9, 3}));
  expect_error([&] { T::Resize(8)(internal::zeros({3, 10, 10}), rng); }, {"Resize", "uint8"});
}

TEST(TransformsBasic, ToTensorAndNormalize) {
  SampleRng rng(0, 0, 0);
  Tensor x = T::ToTensor()(u8({0, 51, 255, 1, 2, 3}, {1, 2, 3}), rng);  // (H=1, W=2, C=3)
  expect_values(x, {3, 1, 2}, {0, 1 / 255.0, 51 / 255.0, 2 / 255.0, 1, 3 / 255.0}, 1e-7, 0);
  Tensor n = T::Normalize({0.5, 0.0, 1.0}, {0.5, 2.0, 0.25})(x, rng);
  expect_values(n, {3, 1, 2}, {-1, (1 / 255.0 - 0.5) / 0.5, 51 / 255.0 / 2, 1 / 255.0, 0, (3 / 255.0 - 1) / 0.25}, 1e-6,
                1e-7);
  // ToTensor + Normalize in one pass (as Compose runs them): the same float32 values.
  T::Normalize norm({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225});
  Tensor img = u8(random_image(9, 7, 3, 4), {9, 7, 3});
  EXPECT_EQ(norm.from_uint8(img).to_vector<float>(), norm(T::ToTensor()(img, rng), rng).to_vector<float>());
  EXPECT_EQ(T::Compose(T::ToTensor(), norm)(img, rng).to_vector<float>(),
            norm(T::ToTensor()(img, rng), rng).to_vector<float>());
  expect_error([&] { T::Normalize({0.5}, {0.5})(u8({1, 2, 3}, {1, 1, 3}), rng); }, {"Normalize", "ToTensor"});
  expect_error([&] { T::Normalize({0.5, 0.5}, {0.5, 0.5})(x, rng); }, {"Normalize", "3 channels"});
  expect_error([&] { T::Normalize({0.5}, {0.0}); }, {"std", "positive"});
}

TEST(TransformsBasic, HorizontalFlip) {
  SampleRng rng(0, 0, 0);
  Tensor img = u8({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 2, 3});
  EXPECT_EQ(pixels(T::RandomHorizontalFlip(1.0)(img, rng)),
            (std::vector<uint8_t>{4, 5, 6, 1, 2, 3, 10, 11, 12, 7, 8, 9}));
  EXPECT_EQ(pixels(T::RandomHorizontalFlip(0.0)(img, rng)), pixels(img));
  Tensor chw = make({1, 2, 3, 4, 5, 6}, {1, 2, 3});
  expect_values(T::RandomHorizontalFlip(1.0)(chw, rng), {1, 2, 3}, {3, 2, 1, 6, 5, 4});
  // p = 0.5: a pure function of (seed, epoch, index), about half flipped.
  int flipped = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    SampleRng a(7, 1, i), b(7, 1, i);
    Tensor fa = T::RandomHorizontalFlip(0.5)(img, a), fb = T::RandomHorizontalFlip(0.5)(img, b);
    EXPECT_EQ(pixels(fa), pixels(fb));
    flipped += pixels(fa)[0] == 4;
  }
  EXPECT_GT(flipped, 430);
  EXPECT_LT(flipped, 570);
}

TEST(TransformsCrop, CenterCropRoundsHalfToEvenAndPads) {
  SampleRng rng(0, 0, 0);
  // (H - h) / 2: 1.5 -> 2, 2.5 -> 2, 0.5 -> 0 (Python's round, as torchvision).
  EXPECT_EQ(pixels(T::CenterCrop(2)(grid(5, 5), rng))[0], 22);
  EXPECT_EQ(pixels(T::CenterCrop(2)(grid(7, 7), rng))[0], 22);
  EXPECT_EQ(pixels(T::CenterCrop(3)(grid(4, 4), rng))[0], 0);
  EXPECT_EQ(pixels(T::CenterCrop(data::ImageSize{2, 3})(grid(6, 8), rng))[0], 22);  // 2 and 2.5 -> 2
  // Larger than the image: zero padding, floor half before.
  EXPECT_EQ(pixels(T::CenterCrop(data::ImageSize{5, 4})(grid(2, 3), rng)),
            (std::vector<uint8_t>{0, 0, 0, 0, 0, 1, 2, 0, 10, 11, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  // float (C, H, W).
  Tensor chw = make({0, 1, 2, 3, 4, 5, 6, 7, 8}, {1, 3, 3});
  expect_values(T::CenterCrop(1)(chw, rng), {1, 1, 1}, {4});
}

TEST(TransformsCrop, RandomCropWithPaddingCoversEveryOffset) {
  Tensor img = grid(3, 3);
  // The padded image (fill 9) and the 9 possible 3x3 windows of it.
  std::vector<uint8_t> padded(25, 9);
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 3; ++x) padded[(y + 1) * 5 + x + 1] = uint8_t(10 * y + x);
  std::set<int> seen;
  for (int64_t i = 0; i < 300; ++i) {
    SampleRng rng(3, 0, i), again(3, 0, i);
    auto out = pixels(T::RandomCrop(3, {.padding = {1}, .fill = 9})(img, rng));
    EXPECT_EQ(out, pixels(T::RandomCrop(3, {.padding = {1}, .fill = 9})(img, again)));
    int found = -1;
    for (int oy = 0; oy < 3; ++oy)
      for (int ox = 0; ox < 3; ++ox) {
        std::vector<uint8_t> window;
        for (int y = 0; y < 3; ++y)
          for (int x = 0; x < 3; ++x) window.push_back(padded[(oy + y) * 5 + ox + x]);
        if (window == out) found = oy * 3 + ox;
      }
    ASSERT_GE(found, 0) << "not a window of the padded image";
    seen.insert(found);
  }
  EXPECT_EQ(seen.size(), 9u);
}

TEST(TransformsCrop, RandomCropPadIfNeededAndErrors) {
  Tensor img = grid(2, 3);
  std::set<std::pair<int, int>> offsets;
  for (int64_t i = 0; i < 200; ++i) {
    SampleRng rng(1, 0, i);
    auto out = pixels(T::RandomCrop(4, {.pad_if_needed = true})(img, rng));
    ASSERT_EQ(out.size(), 16u);
    // Image pixel (0, 0) is 0 too, so locate it by pixel (0, 1) = 1: padded by 1 left/right, 2 top/bottom.
    int pos = int(std::find(out.begin(), out.end(), 1) - out.begin());
    ASSERT_LT(pos, 16);
    offsets.insert({pos / 4, pos % 4 - 1});
  }
  // Window top i in 0..2 puts the image's row 0 at 2 - i; left j in 0..1 puts column 0 at 1 - j.
  EXPECT_EQ(offsets, (std::set<std::pair<int, int>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}}));
  SampleRng rng(0, 0, 0);
  expect_error([&] { T::RandomCrop(4)(img, rng); }, {"RandomCrop", "smaller than the crop", "pad_if_needed"});
  expect_error([&] { T::RandomCrop(4, {.padding = {1, 2, 3}}); }, {"padding", "1", "2", "4"});
}

TEST(TransformsRandomResizedCrop, BoxInvariantsAndDeterminism) {
  T::RandomResizedCrop t(16);
  const data::ImageSize size{50, 80};
  int small = 0, large = 0;
  std::set<std::pair<double, double>> corners;
  for (int64_t i = 0; i < 2000; ++i) {
    SampleRng a(11, 2, i), b(11, 2, i);
    data::Box box = t.sample_box(size, a);
    data::Box again = t.sample_box(size, b);
    EXPECT_EQ(box.top, again.top);
    EXPECT_EQ(box.width, again.width);
    ASSERT_GE(box.top, 0);
    ASSERT_GE(box.left, 0);
    ASSERT_LE(box.top + box.height, 50);
    ASSERT_LE(box.left + box.width, 80);
    ASSERT_EQ(box.top, std::floor(box.top));
    const double frac = box.height * box.width / 4000.0;
    const double ratio = box.width / box.height;
    // Rounding w and h to whole pixels moves area and ratio a little past the sampled ranges.
    EXPECT_GE(frac, 0.08 * 0.85);
    EXPECT_LE(frac, 1.0);
    EXPECT_GE(ratio, 0.75 * 0.9);
    EXPECT_LE(ratio, 4.0 / 3 * 1.1);
    small += frac<0.2, large += frac> 0.6;
    corners.insert({box.top, box.left});
  }
  EXPECT_GT(small, 200);  // the scales spread over the range
  EXPECT_GT(large, 100);
  EXPECT_GT(corners.size(), 500u);
  // A different epoch gives a different box for most samples.
  int same = 0;
  for (int64_t i = 0; i < 100; ++i) {
    SampleRng a(11, 2, i), b(11, 3, i);
    data::Box x = t.sample_box(size, a), y = t.sample_box(size, b);
    same += x.top == y.top && x.left == y.left && x.height == y.height;
  }
  EXPECT_LT(same, 10);
  // 10 x 200: no box of ratio <= 4/3 and area >= 8% fits, so the fallback: full height, width round(10 * 4/3).
  SampleRng rng(0, 0, 0);
  data::Box fb = t.sample_box({10, 200}, rng);
  EXPECT_EQ(fb.top, 0);
  EXPECT_EQ(fb.height, 10);
  EXPECT_EQ(fb.width, 13);
  EXPECT_EQ(fb.left, 93);  // (200 - 13) // 2
}

TEST(TransformsRandomResizedCrop, OutputIsResizeOfTheChosenCrop) {
  auto img = random_image(45, 60, 3, 9);
  Tensor t_img = u8(img, {45, 60, 3});
  T::RandomResizedCrop t(data::ImageSize{16, 12});
  for (int64_t i = 0; i < 20; ++i) {
    SampleRng a(5, 0, i), b(5, 0, i);
    data::Box box = t.sample_box({45, 60}, a);
    Tensor crop =
        t_img.narrow(0, int64_t(box.top), int64_t(box.height)).narrow(1, int64_t(box.left), int64_t(box.width));
    Tensor out = t(t_img, b);
    EXPECT_EQ(out.shape(), (Shape{16, 12, 3}));
    EXPECT_EQ(pixels(out), pixels(data::resize_image(crop.contiguous(), 16, 12)));
  }
}

// Compose::load (decode plan) gives what decoding then transforming gives: exactly without DCT scaling.
TEST(TransformsCompose, LoadWithPlanMatchesDecodeThenTransform) {
  auto img = smooth_image(120, 160, 2);
  auto jpeg = encode_jpeg(img, 120, 160, 3, {.quality = 92});
  std::vector<uint16_t> wide(img.begin(), img.end());
  auto png = encode_png(wide, 120, 160, {});
  T::Compose exact{T::RandomResizedCrop(24, {.dct_scaling = false}), T::RandomHorizontalFlip(), T::ToTensor()};
  T::Compose fast{T::RandomResizedCrop(24), T::RandomHorizontalFlip(), T::ToTensor()};
  T::Compose eval = T::imagenet_eval(32);
  for (int64_t i = 0; i < 20; ++i) {
    for (const auto* bytes : {&jpeg, &png}) {
      SampleRng a(1, 0, i), b(1, 0, i), c(1, 0, i), d(1, 0, i);
      Tensor whole = data::decode_image(*bytes, "x");
      expect_values(exact.load(*bytes, "x", a), {3, 24, 24}, values(exact(whole, b)), 0, 0);
      expect_values(eval.load(*bytes, "x", c), {3, 32, 32}, values(eval(whole, d)), 0, 0);
      SampleRng e(1, 0, i), f(1, 0, i);
      expect_values(fast.load(*bytes, "x", e), {3, 24, 24}, values(fast(whole, f)), 0, 40 / 255.0);
    }
  }
}

TEST(TransformsCompose, PresetsAndAsImageTransform) {
  Tensor img = u8(random_image(300, 400, 3), {300, 400, 3});
  SampleRng rng(0, 0, 0);
  data::ImageTransform train = T::imagenet_train(224);
  EXPECT_EQ(train(img, rng).shape(), (Shape{3, 224, 224}));
  EXPECT_EQ(T::imagenet_eval(224)(img, rng).shape(), (Shape{3, 224, 224}));
  Tensor cifar = u8(random_image(32, 32, 3), {32, 32, 3});
  EXPECT_EQ(T::cifar_train()(cifar, rng).shape(), (Shape{3, 32, 32}));
  Tensor ev = T::cifar_eval()(cifar, rng);
  EXPECT_NEAR(ev.to_vector<float>()[0], (pixels(cifar)[0] / 255.0 - 0.4914) / 0.2470, 1e-5);
  EXPECT_EQ(T::imagenet_eval(224).describe(),
            "Compose(Resize(256), CenterCrop(224x224), ToTensor(), Normalize(mean=[0.485000, 0.456000, 0.406000], "
            "std=[0.229000, 0.224000, 0.225000]))");
}

// torchvision's resize(antialias=True), resized_crop, center_crop and to_dtype + normalize on a fixed image
// (tests/golden/make_golden_images.py; a missing file fails the test).
TEST(TransformsGolden, MatchesTorchvision) {
  const Golden g = load_golden("image_transforms", "python3 tests/golden/make_golden_images.py tests/golden/data");
  Tensor input = g.get("input", DType::UInt8);  // (37, 53, 3)
  SampleRng rng(0, 0, 0);
  auto check = [&](const Tensor& out, const std::string& key, int tolerance) {
    SCOPED_TRACE(key);
    Tensor expect = g.get(key, DType::UInt8);
    ASSERT_EQ(out.shape(), expect.shape());
    expect_within(pixels(out), pixels(expect), tolerance);
  };
  // torch's uint8 kernel rounds its weights to 16 bits, kiln (as PIL) to 22: a level or two apart at most.
  check(data::resize_image(input, 16, 20), "resize_16x20", 2);
  check(data::resize_image(input, 64, 90), "resize_64x90", 2);
  check(data::resize_image(input, 50, 30), "resize_50x30", 2);
  check(data::resize_image(input, 37, 26), "resize_37x26", 2);
  check(data::resize_image(input, 5, 7), "resize_5x7", 2);
  check(T::Resize(24)(input, rng), "resize_short_24", 2);
  check(data::resize_image(input, 12, 18, data::Box{5, 7, 25, 30}), "resized_crop_5_7_25_30_12x18", 2);
  check(T::CenterCrop(data::ImageSize{20, 30})(input, rng), "center_crop_20x30", 0);
  check(T::CenterCrop(data::ImageSize{40, 56})(input, rng), "center_crop_40x56", 0);
  Tensor n = T::Normalize(T::kImageNetMean, T::kImageNetStd)(T::ToTensor()(input, rng), rng);
  expect_golden(n, g, "normalize_imagenet", 1e-6, 1e-6);
}

}  // namespace
}  // namespace kiln::testing
