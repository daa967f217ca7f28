// kiln/data/datasets/mnist.h — MNIST and Fashion-MNIST from their IDX files (gzip-compressed or not).
//
//   data::MNIST train("data/", {.split = data::Split::Train, .transform = to_float});
//   data::Example ex = train.sample(0);       // {"image": uint8 (28, 28, 1) HWC, "label": int64 scalar}
//   Tensor all = train.images();              // uint8 (N, 28, 28), Tensor y = train.targets(); int64 (N)
//   data::FashionMNIST fashion("data/", {.split = data::Split::Test});
//
// The files keep torchvision's names (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
// t10k-labels-idx1-ubyte, each optionally with .gz) and are looked for in root, then root/MNIST/raw (or
// root/FashionMNIST/raw for FashionMNIST). A gzip file is recognised by its magic bytes. Both files are read
// whole at construction and checked (magic numbers, dims, lengths, counts, labels < 10); get() only copies.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "kiln/data/dataset.h"
#include "kiln/data/datasets/split.h"

namespace kiln::data {

// Options of MNIST and FashionMNIST.
struct MNISTOptions {
  Split split = Split::Train;     // the train-* files, or the t10k-* files
  ImageTransform transform = {};  // applied to the uint8 (H, W, 1) image in get(); none when empty
};

// The MNIST (or Fashion-MNIST) IDX files as a Dataset of (1, 28, 28) images and labels.
class MNIST : public Dataset {
 public:
  // Reads the split's files from root or root/MNIST/raw; kiln::Error naming a missing or bad file.
  explicit MNIST(const std::filesystem::path& root, MNISTOptions options = {});

  int64_t size() const override { return targets_.numel(); }
  // {"image": uint8 (28, 28, 1), or what options.transform makes of it, "label": int64 scalar}
  Example get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;

  // Every image, uint8 (N, 28, 28).
  const Tensor& images() const { return images_; }  // uint8 (N, 28, 28)
  // Every label, int64 (N).
  const Tensor& targets() const { return targets_; }  // int64 (N)
  // The images file that was read (found in root or its raw folder).
  const std::filesystem::path& images_file() const { return images_file_; }

 protected:
  // `name` is what describe() and errors say; `subdir` is the folder torchvision downloads it to.
  MNIST(const std::filesystem::path& root, MNISTOptions options, std::string name, const std::string& subdir);

 private:
  std::string name_;
  MNISTOptions options_;
  std::filesystem::path images_file_, labels_file_;
  Tensor images_;   // uint8 (N, H, W)
  Tensor targets_;  // int64 (N)
};

// The same format and class with another name, found in root or root/FashionMNIST/raw.
class FashionMNIST : public MNIST {
 public:
  // Reads the split's files from root or root/FashionMNIST/raw; kiln::Error naming a missing or bad file.
  explicit FashionMNIST(const std::filesystem::path& root, MNISTOptions options = {});
};

}  // namespace kiln::data
