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
// each on stderr, listed by skipped_files() (a class left without images keeps its index); a header that
// claims more than data::max_image_pixels() pixels counts as bad, so a decompression bomb is skipped without
// being decoded. A file whose header is fine but whose pixels fail to decode still throws from get(), naming it.
//
// Decoding on the GPU (nvJPEG; kiln/data/gpu_decode/): one option, the same transform and the same random crops:
//   auto train = std::make_shared<data::ImageFolder>("imagenet/train", data::transforms::imagenet_train(224),
//                                                    data::ImageFolderOptions{.decode = data::Decode::Gpu});
//   data::DataLoader loader(train, {.batch_size = 256, .workers = 8, .device = Device::cuda(0)});
// Worker threads read each file, parse its header and draw its crop and flip (as the CPU transform would); the
// loader's collate (collate_fn()) decodes the batch on the loader's GPU and runs the crop, resize, flip and
// normalisation there in one kernel ("image" (N, 3, H, W) float32, or bfloat16 / channels-last by
// options.gpu). get() then returns the undecoded sample (gpu_sample.h). PNGs are decoded on the CPU and
// uploaded; a JPEG nvJPEG cannot decode goes through libjpeg-turbo; a file neither can decode throws naming it.
// The resize is bilinear without antialiasing (gpu_transform.h says how it differs from the CPU's).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/data/gpu_transform.h"

namespace kiln::data {

// Options of ImageFolder: which files count as images, what to do with bad ones, and where to decode.
struct ImageFolderOptions {
  std::vector<std::string> extensions = {".jpg", ".jpeg", ".png"};  // torchvision's, that kiln decodes
  bool skip_bad_files = false;  // read every header at construction and drop the files that fail (see above)
  Decode decode = Decode::Cpu;  // Decode::Gpu: nvJPEG on the loader's GPU (see the top of this file)
  GpuTransformOptions gpu{};    // the batch's dtype and memory format when decoding on the GPU
};

// A folder of class folders of JPEG/PNG images as a Dataset, as torchvision's ImageFolder.
class ImageFolder : public Dataset {
 public:
  // One image file and its class.
  struct Sample {
    std::string path{};  // the file's path (root joined with its relative path)
    int64_t label = 0;   // the index of its class in classes()
  };

  // Lists root's class folders and their images (see the top of this file); transform applies to each image in
  // get(). kiln::Error for a bad root, no class folder, a class folder without images, or no extensions.
  explicit ImageFolder(std::string root, ImageTransform transform = {}, ImageFolderOptions options = {});

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  Example get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;
  CollateFn collate_fn() const override;  // with Decode::Gpu: decodes a batch on the current GPU

  // The root folder given at construction.
  const std::string& root() const { return root_; }
  // The class folder names, sorted; a label is an index into it.
  const std::vector<std::string>& classes() const { return classes_; }
  // Each class folder name's label, as torchvision's class_to_idx.
  const std::map<std::string, int64_t>& class_to_idx() const { return class_to_idx_; }
  // Every sample (path, label), in dataset order.
  const std::vector<Sample>& samples() const { return samples_; }
  std::vector<int64_t> targets() const;  // every sample's label, in order
  // With skip_bad_files: the files dropped because their header failed (damaged, or a decompression bomb
  // over data::max_image_pixels()), in the order found, each with the reason.
  const std::vector<std::pair<std::string, std::string>>& skipped_files() const { return skipped_; }

 private:
  std::string root_;
  ImageTransform transform_;
  ImageFolderOptions options_;
  std::optional<GpuTransform> gpu_;  // with Decode::Gpu
  std::vector<std::string> classes_;
  std::map<std::string, int64_t> class_to_idx_;
  std::vector<Sample> samples_;
  std::vector<std::pair<std::string, std::string>> skipped_;  // (path, reason)
};

}  // namespace kiln::data
