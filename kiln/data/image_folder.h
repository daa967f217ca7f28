// kiln/data/image_folder.h — torchvision's ImageFolder: root/<class>/**/<image>, classes in sorted order.
//
//   data::ImageFolder train("imagenet/train", data::transforms::imagenet_train(224));
//   data::Example ex = train.sample(0);           // {"image": float (3, 224, 224), "label": int64 scalar}
//   train.classes();                              // sorted class folder names; label = position in it
//
// Samples are ordered as torchvision's make_dataset: classes sorted, each class folder walked recursively
// (directories in sorted path order, files sorted by name), keeping files whose lowercase name ends with one
// of the extensions. A transforms::Compose transform decodes through its decode plan (only the crop a
// RandomResizedCrop needs); any other ImageTransform gets the whole decoded uint8 (H, W, 3) image; without a
// transform, "image" is that uint8 image.
//
// Bad input: a missing or empty root, no class folders, or a class folder without images throw kiln::Error
// naming the folder. A bad image file throws from get() naming the file. With skip_bad_files the
// constructor reads every file's header (data::image_size) and drops those that fail, with one warning line
// each on stderr (a class left without images keeps its index); a file whose header is fine but whose
// pixels fail to decode still throws from get(), naming it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/data/dataset.h"

namespace kiln::data {

struct ImageFolderOptions {
  std::vector<std::string> extensions = {".jpg", ".jpeg", ".png"};  // torchvision's, that kiln decodes
  bool skip_bad_files = false;
};

class ImageFolder : public Dataset {
 public:
  struct Sample {
    std::string path;
    int64_t label = 0;
  };

  explicit ImageFolder(std::string root, ImageTransform transform = {}, ImageFolderOptions options = {});

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  Example get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;

  const std::string& root() const { return root_; }
  const std::vector<std::string>& classes() const { return classes_; }
  const std::map<std::string, int64_t>& class_to_idx() const { return class_to_idx_; }
  const std::vector<Sample>& samples() const { return samples_; }
  std::vector<int64_t> targets() const;  // every sample's label, in order

 private:
  std::string root_;
  ImageTransform transform_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_;
  std::map<std::string, int64_t> class_to_idx_;
  std::vector<Sample> samples_;
};

}  // namespace kiln::data
