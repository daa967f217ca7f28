// ImageFolder over a tree the test writes: torchvision's class order, sample order and labels; transforms;
// bad trees and bad files.
#include <gtest/gtest.h>

#include <filesystem>

#include "image_test_files.h"
#include "kiln/data/image_folder.h"
#include "kiln/data/transforms.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

namespace T = data::transforms;

std::vector<uint8_t> tiny_png(uint64_t seed, int h = 6, int w = 8) {
  auto img = random_image(h, w, 3, seed);
  return encode_png({img.begin(), img.end()}, h, w, {});
}

std::vector<uint8_t> tiny_jpeg(int h = 40, int w = 48) { return encode_jpeg(smooth_image(h, w), h, w, 3); }

// root/
//   C_upper/q.png                    (uppercase sorts before lowercase)
//   a_class/x.jpeg, a_class/y.PNG, a_class/notes.txt
//   b_class/img2.png, b_class/a.JPG, b_class/sub/zz.jpg, b_class/sub/deep/d.png, b_class/sub-2/a.png
//   readme.txt                       (a file at the root: not a class)
void make_tree(const TempFolder& dir) {
  write_bytes(dir.file("C_upper/q.png"), tiny_png(1));
  write_bytes(dir.file("a_class/x.jpeg"), tiny_jpeg());
  write_bytes(dir.file("a_class/y.PNG"), tiny_png(2));
  write_bytes(dir.file("a_class/notes.txt"), {'h', 'i'});
  write_bytes(dir.file("b_class/img2.png"), tiny_png(3));
  write_bytes(dir.file("b_class/a.JPG"), tiny_jpeg(20, 30));
  write_bytes(dir.file("b_class/sub/zz.jpg"), tiny_jpeg());
  write_bytes(dir.file("b_class/sub/deep/d.png"), tiny_png(4));
  write_bytes(dir.file("b_class/sub-2/a.png"), tiny_png(5));
  write_bytes(dir.file("readme.txt"), {'x'});
}

TEST(ImageFolder, ClassesAndSamplesInTorchvisionOrder) {
  TempFolder dir;
  make_tree(dir);
  data::ImageFolder ds(dir.path().string());
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"C_upper", "a_class", "b_class"}));
  EXPECT_EQ(ds.class_to_idx().at("b_class"), 2);
  std::vector<std::string> rel;
  for (const auto& s : ds.samples()) rel.push_back(std::filesystem::relative(s.path, dir.path()).string());
  // os.walk sorted by directory path: "b_class/sub" < "b_class/sub-2" < "b_class/sub/deep" ('-' < '/').
  EXPECT_EQ(rel, (std::vector<std::string>{"C_upper/q.png", "a_class/x.jpeg", "a_class/y.PNG", "b_class/a.JPG",
                                           "b_class/img2.png", "b_class/sub/zz.jpg", "b_class/sub-2/a.png",
                                           "b_class/sub/deep/d.png"}));
  EXPECT_EQ(ds.targets(), (std::vector<int64_t>{0, 1, 1, 2, 2, 2, 2, 2}));
  EXPECT_EQ(ds.size(), 8);
  EXPECT_NE(ds.describe().find("8 images, 3 classes"), std::string::npos);

  // No transform: the decoded uint8 image and an int64 scalar label.
  data::Example ex = ds.sample(3);
  EXPECT_EQ(ex["image"].shape(), (Shape{20, 30, 3}));
  EXPECT_EQ(ex["image"].dtype(), DType::UInt8);
  EXPECT_EQ(ex["label"].dim(), 0);
  EXPECT_EQ(ex["label"].dtype(), DType::Int64);
  EXPECT_EQ(ex["label"].item<int64_t>(), 2);
  auto png = random_image(6, 8, 3, 1);
  EXPECT_EQ(ds.sample(0)["image"].to_vector<uint8_t>(), png);
  expect_error([&] { ds.sample(8); }, {"out of range"});

  // Only .png files.
  data::ImageFolder pngs(dir.path().string(), {}, {.extensions = {".png"}});
  EXPECT_EQ(pngs.size(), 5);
}

TEST(ImageFolder, TransformsApply) {
  TempFolder dir;
  make_tree(dir);
  data::ImageFolder train(dir.path().string(), T::imagenet_train(16));
  for (int64_t i = 0; i < train.size(); ++i) {
    data::Example a = train.sample(i, 5, 1), b = train.sample(i, 5, 1);
    EXPECT_EQ(a["image"].shape(), (Shape{3, 16, 16}));
    EXPECT_EQ(a["image"].to_vector<float>(), b["image"].to_vector<float>());  // a pure function of (seed, epoch, i)
  }
  // Any ImageTransform: gets the whole decoded image.
  data::ImageFolder lambda(dir.path().string(), [](Tensor img, data::SampleRng&) {
    return internal::full({1}, static_cast<double>(img.shape()[0] * 1000 + img.shape()[1]));
  });
  EXPECT_EQ(lambda.sample(3)["image"].item<float>(), 20030.0f);
}

TEST(ImageFolder, BadTreesNameTheFolder) {
  TempFolder dir;
  expect_error([&] { data::ImageFolder(dir.file("missing")); }, {"missing", "does not exist"});
  std::filesystem::create_directories(dir.file("empty"));
  expect_error([&] { data::ImageFolder(dir.file("empty")); }, {"empty", "no class folders"});
  write_bytes(dir.file("files_only/a.png"), tiny_png(1));
  expect_error([&] { data::ImageFolder(dir.file("files_only")); }, {"files_only", "no class folders"});
  write_bytes(dir.file("one_empty/cat/a.png"), tiny_png(1));
  write_bytes(dir.file("one_empty/dog/readme.txt"), {'x'});
  expect_error([&] { data::ImageFolder(dir.file("one_empty")); }, {"dog", "no image files", ".jpg"});
  write_bytes(dir.file("plain_file"), {'x'});
  expect_error([&] { data::ImageFolder(dir.file("plain_file")); }, {"plain_file", "not a folder"});
}

TEST(ImageFolder, BadFilesErrorOrAreSkipped) {
  TempFolder dir;
  make_tree(dir);
  write_bytes(dir.file("a_class/garbage.jpg"), {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'});
  write_bytes(dir.file("a_class/empty.png"), {});
  auto jpeg = tiny_jpeg(64, 64);
  write_bytes(dir.file("b_class/truncated.jpg"), {jpeg.begin(), jpeg.begin() + jpeg.size() * 2 / 3});
  // Without skipping: get() of a bad file names it.
  data::ImageFolder strict(dir.path().string());
  EXPECT_EQ(strict.size(), 11);
  for (int64_t i = 0; i < strict.size(); ++i) {
    const std::string path = strict.samples()[i].path;
    const bool bad = path.find("garbage") != std::string::npos || path.find("empty") != std::string::npos ||
                     path.find("truncated") != std::string::npos;
    if (bad) {
      expect_error([&] { strict.sample(i); }, {path});
    } else {
      EXPECT_NO_THROW(strict.sample(i));
    }
  }
  // Skipping: headers are checked once; garbage and empty files are dropped, labels unchanged. The truncated
  // JPEG's header is intact, so it stays and still fails to decode, naming the file.
  ::testing::internal::CaptureStderr();
  data::ImageFolder lenient(dir.path().string(), {}, {.skip_bad_files = true});
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warnings.find("garbage.jpg"), std::string::npos);
  EXPECT_NE(warnings.find("empty.png"), std::string::npos);
  EXPECT_EQ(lenient.size(), 9);
  EXPECT_EQ(lenient.classes().size(), 3u);
  for (int64_t i = 0; i < lenient.size(); ++i) {
    if (lenient.samples()[i].path.find("truncated") != std::string::npos) {
      expect_error([&] { lenient.sample(i); }, {"truncated.jpg"});
    }
  }
}

}  // namespace
}  // namespace kiln::testing
