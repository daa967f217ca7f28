// MNIST and Fashion-MNIST: IDX files written here in the real layout (big-endian headers), plain and gzip.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/format_files.h"
#include "kiln/data/datasets/mnist.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

constexpr int kSide = 28;

uint8_t pixel(int64_t i, int64_t r, int64_t c) { return static_cast<uint8_t>((i * 37 + r * 5 + c * 3) % 256); }
uint8_t label_of(int64_t i) { return static_cast<uint8_t>((i * 3 + 1) % 10); }

std::vector<uint8_t> idx_images(int64_t n, int64_t count_in_header = -1) {
  std::vector<uint8_t> out;
  append_big_endian(out, 2051);
  append_big_endian(out, static_cast<uint32_t>(count_in_header < 0 ? n : count_in_header));
  append_big_endian(out, kSide);
  append_big_endian(out, kSide);
  for (int64_t i = 0; i < n; ++i)
    for (int r = 0; r < kSide; ++r)
      for (int c = 0; c < kSide; ++c) out.push_back(pixel(i, r, c));
  return out;
}

std::vector<uint8_t> idx_labels(int64_t n) {
  std::vector<uint8_t> out;
  append_big_endian(out, 2049);
  append_big_endian(out, static_cast<uint32_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(label_of(i));
  return out;
}

void expect_sample(const data::Dataset& ds, int64_t i) {
  data::Example ex = ds.sample(i);
  ASSERT_EQ(ex.names(), (std::vector<std::string>{"image", "label"}));
  const Tensor& image = ex["image"];
  ASSERT_EQ(image.dtype(), DType::UInt8);
  ASSERT_EQ(image.shape(), (Shape{kSide, kSide, 1}));
  const uint8_t* p = image.data_ptr<uint8_t>();
  for (int r = 0; r < kSide; ++r)
    for (int c = 0; c < kSide; ++c)
      ASSERT_EQ(p[r * kSide + c], pixel(i, r, c)) << "sample " << i << " at " << r << "," << c;
  EXPECT_EQ(ex["label"].dtype(), DType::Int64);
  EXPECT_EQ(ex["label"].dim(), 0);
  EXPECT_EQ(ex["label"].item<int64_t>(), label_of(i));
}

TEST(DataMNIST, ReadsPlainIdxFilesInTorchvisionsFolder) {
  TempFolder dir;
  write_bytes(dir / "MNIST/raw/train-images-idx3-ubyte", idx_images(7));
  write_bytes(dir / "MNIST/raw/train-labels-idx1-ubyte", idx_labels(7));
  data::MNIST mnist(dir.path(), {.split = data::Split::Train});
  ASSERT_EQ(mnist.size(), 7);
  for (int64_t i = 0; i < 7; ++i) expect_sample(mnist, i);
  EXPECT_EQ(mnist.images().shape(), (Shape{7, kSide, kSide}));
  EXPECT_EQ(mnist.images().dtype(), DType::UInt8);
  EXPECT_EQ(mnist.images()[4][2][9].item<uint8_t>(), pixel(4, 2, 9));
  EXPECT_EQ(mnist.targets().dtype(), DType::Int64);
  EXPECT_EQ(mnist.targets().to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 7, 0, 3, 6, 9}));
  EXPECT_NE(mnist.describe().find("MNIST(train, 7 images"), std::string::npos) << mnist.describe();
  expect_error([&] { mnist.sample(7); }, {"out of range"});
}

TEST(DataMNIST, ReadsGzipByItsMagicBytesNotItsName) {
  TempFolder dir;
  // The test split: .gz files as downloaded (gzip inside), in root itself.
  write_gzip(dir / "t10k-images-idx3-ubyte.gz", idx_images(5));
  write_gzip(dir / "t10k-labels-idx1-ubyte.gz", idx_labels(5));
  data::MNIST test(dir.path(), {.split = data::Split::Test});
  ASSERT_EQ(test.size(), 5);
  for (int64_t i = 0; i < 5; ++i) expect_sample(test, i);
  // The train split: gzip data under the plain name, plain data under the .gz name.
  write_gzip(dir / "train-images-idx3-ubyte", idx_images(3));
  write_bytes(dir / "train-labels-idx1-ubyte.gz", idx_labels(3));
  data::MNIST train(dir.path());
  ASSERT_EQ(train.size(), 3);
  for (int64_t i = 0; i < 3; ++i) expect_sample(train, i);
}

TEST(DataMNIST, FashionMNISTIsTheSameFormatUnderItsOwnName) {
  TempFolder dir;
  write_gzip(dir / "FashionMNIST/raw/t10k-images-idx3-ubyte.gz", idx_images(4));
  write_gzip(dir / "FashionMNIST/raw/t10k-labels-idx1-ubyte.gz", idx_labels(4));
  data::FashionMNIST fashion(dir.path(), {.split = data::Split::Test});
  ASSERT_EQ(fashion.size(), 4);
  expect_sample(fashion, 3);
  EXPECT_NE(fashion.describe().find("FashionMNIST(test, 4 images"), std::string::npos) << fashion.describe();
  // MNIST does not look in FashionMNIST's folder.
  expect_error([&] { data::MNIST m(dir.path(), {.split = data::Split::Test}); },
               {"MNIST", "t10k-images-idx3-ubyte", "MNIST/raw"});
}

TEST(DataMNIST, TransformRunsOnEachImage) {
  TempFolder dir;
  write_bytes(dir / "train-images-idx3-ubyte", idx_images(2));
  write_bytes(dir / "train-labels-idx1-ubyte", idx_labels(2));
  data::MNIST mnist(dir.path(), {.transform = [](Tensor image, data::SampleRng& rng) {
                      EXPECT_EQ(image.shape(), (Shape{kSide, kSide, 1}));
                      return internal::full({1}, static_cast<double>(rng.randint(1000)));
                    }});
  data::Example ex = mnist.sample(1, /*seed=*/5, /*epoch=*/2);
  data::SampleRng rng(5, 2, 1);
  EXPECT_EQ(ex["image"].shape(), (Shape{1}));
  EXPECT_EQ(ex["image"].item<float>(), static_cast<float>(rng.randint(1000)));
  EXPECT_EQ(ex["label"].item<int64_t>(), label_of(1));
}

class DataMNISTBadInput : public ::testing::Test {
 protected:
  void write(const std::vector<uint8_t>& images, const std::vector<uint8_t>& labels) {
    write_bytes(dir / "train-images-idx3-ubyte", images);
    write_bytes(dir / "train-labels-idx1-ubyte", labels);
  }
  void expect_load_error(const std::vector<std::string>& fragments) {
    expect_error([&] { data::MNIST m(dir.path()); }, fragments);
  }
  TempFolder dir;
};

TEST_F(DataMNISTBadInput, MissingFilesAreNamedWithTheFoldersSearched) {
  expect_load_error(
      {"cannot find train-images-idx3-ubyte or train-images-idx3-ubyte.gz", dir.path().string(), "MNIST/raw"});
  write_bytes(dir / "train-images-idx3-ubyte", idx_images(2));
  expect_load_error({"train-labels-idx1-ubyte"});
}

TEST_F(DataMNISTBadInput, WrongMagicNumber) {
  std::vector<uint8_t> images = idx_images(2);
  images[3] = 0x01;  // 2049: a label file's magic in the image file
  write(images, idx_labels(2));
  expect_load_error({"train-images-idx3-ubyte", "magic number 2049", "expected 2051"});
  write(idx_images(2), idx_images(2));  // image data where the labels should be
  expect_load_error({"train-labels-idx1-ubyte", "magic number 2051", "expected 2049"});
}

TEST_F(DataMNISTBadInput, TruncatedImageFileGivesExpectedAndActualBytes) {
  std::vector<uint8_t> images = idx_images(3);
  images.resize(2000);
  write(images, idx_labels(3));
  expect_load_error({"train-images-idx3-ubyte", "truncated", "expected 2368 bytes", "got 2000 bytes"});
  images.resize(10);  // shorter than the header
  write(images, idx_labels(3));
  expect_load_error({"train-images-idx3-ubyte", "truncated", "10 bytes", "16-byte header"});
}

TEST_F(DataMNISTBadInput, TruncatedGzip) {
  write_gzip(dir / "train-images-idx3-ubyte.gz", idx_images(20));
  write_bytes(dir / "train-labels-idx1-ubyte", idx_labels(20));
  std::vector<uint8_t> gz = read_bytes(dir / "train-images-idx3-ubyte.gz");
  ASSERT_GT(gz.size(), 100u);
  gz.resize(gz.size() / 2);
  write_bytes(dir / "train-images-idx3-ubyte.gz", gz);
  expect_load_error({"train-images-idx3-ubyte.gz", "truncated gzip"});
  // A corrupt stream (bytes flipped in the middle) is caught too (by zlib's checks or the CRC).
  write_gzip(dir / "train-images-idx3-ubyte.gz", idx_images(20));
  std::vector<uint8_t> bad = read_bytes(dir / "train-images-idx3-ubyte.gz");
  for (size_t k = 20; k < 40; ++k) bad[k] ^= 0x5a;
  write_bytes(dir / "train-images-idx3-ubyte.gz", bad);
  expect_load_error({"train-images-idx3-ubyte.gz", "gzip"});
}

TEST_F(DataMNISTBadInput, EmptyFile) {
  write({}, idx_labels(2));
  expect_load_error({"train-images-idx3-ubyte", "is empty"});
}

TEST_F(DataMNISTBadInput, ImageAndLabelCountsDiffer) {
  write(idx_images(4), idx_labels(3));
  expect_load_error({"train-images-idx3-ubyte", "4 images", "train-labels-idx1-ubyte", "3 labels"});
}

TEST_F(DataMNISTBadInput, GarbageBytes) {
  std::vector<uint8_t> garbage(5000);
  for (size_t k = 0; k < garbage.size(); ++k) garbage[k] = static_cast<uint8_t>((k * 7919 + 13) % 251);
  write(garbage, idx_labels(2));
  expect_load_error({"train-images-idx3-ubyte", "not an IDX image file", "magic number"});
}

TEST_F(DataMNISTBadInput, ExtraBytesAndLabelsOutOfRange) {
  std::vector<uint8_t> images = idx_images(2);
  images.push_back(0);
  write(images, idx_labels(2));
  expect_load_error({"train-images-idx3-ubyte", "1 bytes after"});
  std::vector<uint8_t> labels = idx_labels(2);
  labels[9] = 10;
  write(idx_images(2), labels);
  expect_load_error({"train-labels-idx1-ubyte", "label 1 is 10", "not below 10"});
}

}  // namespace
}  // namespace kiln::testing
