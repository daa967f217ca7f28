// kiln/data/datasets/cifar.h — CIFAR-10 and CIFAR-100 from their binary versions.
//
//   data::CIFAR10 train("data/", {.split = data::Split::Train, .transform = augment});
//   data::Example ex = train.sample(0);   // {"image": uint8 (32, 32, 3) HWC, "label": int64 scalar}
//   data::CIFAR100 test("data/", {.split = data::Split::Test, .label = data::CIFAR100Label::Coarse});
//   std::string name = test.classes()[label];
//
// CIFAR-10: data_batch_1.bin .. data_batch_5.bin (train) and test_batch.bin, records of 1 label byte and 3072
// image bytes (CHW). CIFAR-100: train.bin and test.bin, records of a coarse label byte, a fine label byte and
// 3072 image bytes. Looked for in root, then in the folder the official tarball unpacks to
// (root/cifar-10-batches-bin, root/cifar-100-binary). Read whole at construction (stored HWC), checked
// (whole records, labels in range); get() only copies.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/data/datasets/split.h"

namespace kiln::data {

// Options of CIFAR10.
struct CIFAR10Options {
  Split split = Split::Train;     // the five training batches, or the test batch
  ImageTransform transform = {};  // applied to the uint8 (32, 32, 3) image in get(); none when empty
};

// Which CIFAR-100 label "label" holds: one of the 100 fine classes or of the 20 coarse superclasses.
enum class CIFAR100Label { Fine, Coarse };

// Options of CIFAR100.
struct CIFAR100Options {
  Split split = Split::Train;                 // train.bin or test.bin
  ImageTransform transform = {};              // applied to the uint8 (32, 32, 3) image in get(); none when empty
  CIFAR100Label label = CIFAR100Label::Fine;  // which of the two labels "label" holds
};

// What CIFAR-10 and CIFAR-100 share: images held in memory (N, 32, 32, 3) and one int64 label each.
class CIFARBase : public Dataset {
 public:
  int64_t size() const override { return targets_.numel(); }
  // {"image": uint8 (32, 32, 3), or what the transform makes of it, "label": int64 scalar}
  Example get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;

  // Every image, uint8 (N, 32, 32, 3) HWC.
  const Tensor& images() const { return images_; }  // uint8 (N, 32, 32, 3) HWC
  // Every label, int64 (N).
  const Tensor& targets() const { return targets_; }  // int64 (N)
  // The class names, indexed by label (CIFAR-100: empty without the label-names file).
  const std::vector<std::string>& classes() const { return classes_; }

 protected:
  // An empty dataset; the subclass's constructor finds dir_ and calls load().
  CIFARBase(std::string name, Split split, ImageTransform transform);
  // Reads the records of `files`: label_bounds.size() label bytes (each checked below its bound), of which
  // the one at `label_byte` becomes the label, then the CHW image.
  void load(const std::vector<std::filesystem::path>& files, const std::vector<int64_t>& label_bounds, int label_byte);

  std::string name_;           // "CIFAR10" or "CIFAR100", for describe() and errors
  Split split_;                // as constructed
  ImageTransform transform_;   // applied in get(); none when empty
  std::filesystem::path dir_;  // the folder the files were found in
  // uint8 (N, 32, 32, 3), HWC.
  Tensor images_, targets_;           // int64 (N)
  std::vector<std::string> classes_;  // what classes() returns
};

// CIFAR-10's binary batches as a Dataset of (3, 32, 32) images and labels.
class CIFAR10 : public CIFARBase {
 public:
  // Reads the split's files from root or root/cifar-10-batches-bin; kiln::Error naming a missing or bad file.
  explicit CIFAR10(const std::filesystem::path& root, CIFAR10Options options = {});
};

// CIFAR-100's binary files as a Dataset of (3, 32, 32) images and fine (or coarse) labels.
class CIFAR100 : public CIFARBase {
 public:
  // classes() are read from fine_label_names.txt / coarse_label_names.txt when the folder has them (the
  // official tarball does), else empty.
  explicit CIFAR100(const std::filesystem::path& root, CIFAR100Options options = {});
};

}  // namespace kiln::data
