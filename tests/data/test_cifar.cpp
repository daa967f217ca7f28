// CIFAR-10 and CIFAR-100: binary records written here as the official tarballs hold them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/format_files.h"
#include "kiln/data/datasets/cifar.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

constexpr int kSide = 32, kPlane = kSide * kSide;

// The byte of channel c at (h, w) of record r (a global record number, so files differ).
uint8_t value(int64_t r, int c, int h, int w) { return static_cast<uint8_t>((r * 31 + c * 101 + h * 7 + w) % 256); }

// Records of `labels.size()` label bytes each (per record: labels[k](r)), then the CHW image.
std::vector<uint8_t> records(int64_t first, int64_t n, const std::vector<uint8_t (*)(int64_t)>& labels) {
  std::vector<uint8_t> out;
  for (int64_t r = first; r < first + n; ++r) {
    for (auto label : labels) out.push_back(label(r));
    for (int c = 0; c < 3; ++c)
      for (int h = 0; h < kSide; ++h)
        for (int w = 0; w < kSide; ++w) out.push_back(value(r, c, h, w));
  }
  return out;
}

uint8_t label10(int64_t r) { return static_cast<uint8_t>((r * 3) % 10); }
uint8_t coarse(int64_t r) { return static_cast<uint8_t>((r * 7) % 20); }
uint8_t fine(int64_t r) { return static_cast<uint8_t>((r * 13 + 5) % 100); }

void expect_sample(const data::Dataset& ds, int64_t i, int64_t record, int64_t label) {
  data::Example ex = ds.sample(i);
  const Tensor& image = ex["image"];
  ASSERT_EQ(image.dtype(), DType::UInt8);
  ASSERT_EQ(image.shape(), (Shape{kSide, kSide, 3}));
  const uint8_t* p = image.data_ptr<uint8_t>();
  for (int h = 0; h < kSide; ++h)
    for (int w = 0; w < kSide; ++w)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(p[(h * kSide + w) * 3 + c], value(record, c, h, w))
            << "sample " << i << " (" << h << "," << w << "," << c << ")";
  EXPECT_EQ(ex["label"].dtype(), DType::Int64);
  EXPECT_EQ(ex["label"].dim(), 0);
  EXPECT_EQ(ex["label"].item<int64_t>(), label);
}

void write_cifar10_train(const std::filesystem::path& dir, int64_t per_batch) {
  for (int b = 1; b <= 5; ++b)
    write_bytes(dir / ("data_batch_" + std::to_string(b) + ".bin"), records((b - 1) * per_batch, per_batch, {label10}));
}

TEST(DataCIFAR, Cifar10TrainReadsTheFiveBatchesInOrder) {
  TempFolder dir;
  write_cifar10_train(dir / "cifar-10-batches-bin", 3);
  data::CIFAR10 train(dir.path(), {.split = data::Split::Train});
  ASSERT_EQ(train.size(), 15);
  for (int64_t i = 0; i < 15; ++i) expect_sample(train, i, i, label10(i));
  EXPECT_EQ(train.images().shape(), (Shape{15, kSide, kSide, 3}));
  EXPECT_EQ(train.targets().to_vector<int64_t>()[4], 2);
  ASSERT_EQ(train.classes().size(), 10u);
  EXPECT_EQ(train.classes()[0], "airplane");
  EXPECT_EQ(train.classes()[3], "cat");
  EXPECT_EQ(train.classes()[9], "truck");
  EXPECT_NE(train.describe().find("CIFAR10(train, 15 images"), std::string::npos) << train.describe();
}

TEST(DataCIFAR, Cifar10TestInRootAndTransform) {
  TempFolder dir;
  write_bytes(dir / "test_batch.bin", records(100, 4, {label10}));
  data::CIFAR10 test(dir.path(), {.split = data::Split::Test});
  ASSERT_EQ(test.size(), 4);
  expect_sample(test, 2, 102, label10(102));
  data::CIFAR10 mapped(dir.path(), {.split = data::Split::Test, .transform = [](Tensor image, data::SampleRng&) {
                                      return image.to(DType::Float32);
                                    }});
  EXPECT_EQ(mapped.sample(1)["image"].dtype(), DType::Float32);
  EXPECT_EQ(mapped.sample(1)["image"][5][6][2].item<float>(), static_cast<float>(value(101, 2, 5, 6)));
}

TEST(DataCIFAR, Cifar100FineOrCoarseLabelsAndClassNames) {
  TempFolder dir;
  const auto folder = dir / "cifar-100-binary";
  write_bytes(folder / "train.bin", records(0, 6, {coarse, fine}));
  data::CIFAR100 fine_ds(dir.path());
  ASSERT_EQ(fine_ds.size(), 6);
  for (int64_t i = 0; i < 6; ++i) expect_sample(fine_ds, i, i, fine(i));
  EXPECT_TRUE(fine_ds.classes().empty());  // no names file
  data::CIFAR100 coarse_ds(dir.path(), {.label = data::CIFAR100Label::Coarse});
  for (int64_t i = 0; i < 6; ++i) expect_sample(coarse_ds, i, i, coarse(i));

  std::string fine_names, coarse_names;
  for (int k = 0; k < 100; ++k) fine_names += "fine" + std::to_string(k) + "\n";
  for (int k = 0; k < 20; ++k) coarse_names += "coarse" + std::to_string(k) + "\n\n";  // blank lines ignored
  write_bytes(folder / "fine_label_names.txt", std::vector<uint8_t>(fine_names.begin(), fine_names.end()));
  write_bytes(folder / "coarse_label_names.txt", std::vector<uint8_t>(coarse_names.begin(), coarse_names.end()));
  write_bytes(folder / "test.bin", records(50, 2, {coarse, fine}));
  data::CIFAR100 test(dir.path(), {.split = data::Split::Test});
  ASSERT_EQ(test.classes().size(), 100u);
  EXPECT_EQ(test.classes()[fine(51)], "fine" + std::to_string(fine(51)));
  expect_sample(test, 1, 51, fine(51));
  data::CIFAR100 test_coarse(dir.path(), {.split = data::Split::Test, .label = data::CIFAR100Label::Coarse});
  ASSERT_EQ(test_coarse.classes().size(), 20u);
  EXPECT_EQ(test_coarse.classes()[19], "coarse19");
}

TEST(DataCIFAR, BadInputNamesTheFile) {
  TempFolder dir;
  // A missing batch.
  write_cifar10_train(dir.path(), 2);
  std::filesystem::remove(dir / "data_batch_3.bin");
  expect_error([&] { data::CIFAR10 c(dir.path()); }, {"CIFAR10", "data_batch_3.bin", "cifar-10-batches-bin"});
  // A partial record.
  std::vector<uint8_t> partial = records(0, 2, {label10});
  partial.resize(partial.size() - 100);
  write_bytes(dir / "data_batch_3.bin", partial);
  expect_error([&] { data::CIFAR10 c(dir.path()); },
               {"data_batch_3.bin", "not a whole number of 3073-byte", "1 records and 2973 bytes more"});
  // An empty file.
  write_bytes(dir / "data_batch_3.bin", {});
  expect_error([&] { data::CIFAR10 c(dir.path()); }, {"data_batch_3.bin", "is empty"});
  // A label out of range (CIFAR-100 data read as CIFAR-10 would be this).
  std::vector<uint8_t> bad = records(0, 2, {label10});
  bad[3073] = 10;
  write_bytes(dir / "data_batch_3.bin", bad);
  expect_error([&] { data::CIFAR10 c(dir.path()); }, {"data_batch_3.bin", "record 1 has label 10", "not below 10"});
  // CIFAR-100: a fine label past 99, and a record size that is CIFAR-10's.
  std::vector<uint8_t> c100 = records(0, 3, {coarse, fine});
  c100[3074 * 2 + 1] = 100;
  write_bytes(dir / "train.bin", c100);
  expect_error([&] { data::CIFAR100 c(dir.path()); }, {"train.bin", "record 2 has label 100", "not below 100"});
  write_bytes(dir / "train.bin", records(0, 3, {label10}));
  expect_error([&] { data::CIFAR100 c(dir.path()); }, {"train.bin", "3074-byte"});
  // A names file with the wrong number of lines.
  write_bytes(dir / "train.bin", records(0, 3, {coarse, fine}));
  write_bytes(dir / "fine_label_names.txt", {'a', '\n', 'b', '\n'});
  expect_error([&] { data::CIFAR100 c(dir.path()); }, {"fine_label_names.txt", "lists 2 class names, expected 100"});
}

}  // namespace
}  // namespace kiln::testing
