// kiln/data/transforms.h — image transforms as torchvision's, drawing every random number from a SampleRng.
//
//   namespace T = data::transforms;
//   T::Compose train{T::RandomResizedCrop(224), T::RandomHorizontalFlip(), T::ToTensor(),
//                    T::Normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225})};   // = T::imagenet_train(224)
//   Tensor x = train(image, rng);                        // uint8 (H, W, 3) -> float (3, 224, 224)
//   Tensor y = train.load(jpeg_bytes, "cat.jpg", rng);   // decodes only the crop (see DecodePlan)
//   data::ImageTransform fn = train;                     // what image datasets take
//
// Layout convention: uint8 tensors are images (H, W, C); float32 tensors are (C, H, W) (after ToTensor).
// Resize and the crops-with-resize use antialiased bilinear filtering (kiln/data/image_resize.h), as
// torchvision's resize(antialias=True) on tensors, to within a level or two out of 255.
//
// Decode plans: a first transform that crops or resizes (RandomResizedCrop, Resize) can tell Compose::load
// which part of the file to decode and at what size before decoding. With `dct_scaling` (on by default for
// RandomResizedCrop, off for Resize) JPEGs are decoded at a reduced libjpeg scale when the crop is large
// against its output: faster, with pixel values slightly different from a full decode + resize.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/data/image.h"
#include "kiln/data/sample_rng.h"
#include "kiln/tensor/tensor.h"

namespace kiln::data::transforms {

// One step of a pipeline.
class Transform {
 public:
  virtual ~Transform() = default;
  // The transformed image; random choices draw from rng.
  virtual Tensor operator()(Tensor image, SampleRng& rng) const = 0;
  // The step and its settings, for messages and Compose::describe() ("Resize(256)").
  virtual std::string name() const = 0;
  // For a first step: the region of a `size` image it needs decoded and the size it resizes it to, with its
  // random numbers drawn now (the same ones operator() would draw). nullopt: decode the whole image.
  virtual std::optional<DecodePlan> plan(ImageSize size, SampleRng& rng) const;
  // Finishes the step on what decode_image_region returned for plan(); the same result as operator() on the
  // whole image (exactly so without dct_scaling).
  virtual Tensor apply_planned(const DecodedRegion& region, const DecodePlan& plan) const;
};

// Steps in order; step i draws from rng.fork(i), so each step's random numbers do not depend on the others'.
// ToTensor directly followed by Normalize runs as one pass (Normalize::from_uint8).
class Compose {
 public:
  Compose() = default;
  // The steps in order, shared; kiln::Error if one is null.
  explicit Compose(std::vector<std::shared_ptr<const Transform>> steps);
  // Compose(Resize(256), CenterCrop(224), ToTensor()): transform values, copied or moved in.
  template <class... Ts>
  requires(sizeof...(Ts) > 0 && (std::derived_from<std::decay_t<Ts>, Transform> && ...)) Compose(Ts&&... steps) {
    (add(std::forward<Ts>(steps)), ...);
  }
  // Appends a copy of (or moves in) `step`; returns *this.
  template <class T>
  requires std::derived_from<std::decay_t<T>, Transform> Compose& add(T&& step) {
    steps_.push_back(std::make_shared<const std::decay_t<T>>(std::forward<T>(step)));
    return *this;
  }

  // The steps applied in order to an already decoded image; no step: the image unchanged.
  Tensor operator()(Tensor image, SampleRng& rng) const;
  // Decodes a JPEG/PNG file's bytes and applies the steps, letting the first step plan the decode.
  Tensor load(std::span<const uint8_t> bytes, const std::string& name, SampleRng& rng) const;
  // The steps in order.
  const std::vector<std::shared_ptr<const Transform>>& steps() const { return steps_; }
  std::string describe() const;  // "Compose(RandomResizedCrop(224x224), ...)"

 private:
  std::vector<std::shared_ptr<const Transform>> steps_;
  Tensor run_from(Tensor image, size_t first, SampleRng& rng) const;
};

// Any function of (image, rng) as a step.
class Lambda : public Transform {
 public:
  // kiln::Error if fn is empty; name is what name() returns.
  explicit Lambda(std::function<Tensor(Tensor, SampleRng&)> fn, std::string name = "Lambda");
  Tensor operator()(Tensor image, SampleRng& rng) const override;  // fn(image, rng)
  // The name given at construction.
  std::string name() const override { return name_; }

 private:
  std::function<Tensor(Tensor, SampleRng&)> fn_;
  std::string name_;
};

// uint8 (H, W, C) -> float32 (C, H, W) in [0, 1] (divided by 255).
class ToTensor : public Transform {
 public:
  Tensor operator()(Tensor image, SampleRng& rng) const override;  // kiln::Error unless uint8 (H, W, C)
  // "ToTensor()".
  std::string name() const override { return "ToTensor()"; }
};

// float (C, H, W): (x - mean[c]) / std[c]. One value per channel (or one for all).
class Normalize : public Transform {
 public:
  // kiln::Error unless mean and std have the same, non-zero size and every std is positive.
  Normalize(std::vector<double> mean, std::vector<double> std);
  Tensor operator()(Tensor image, SampleRng& rng) const override;  // kiln::Error unless float32 (C, H, W)
  std::string name() const override;                               // "Normalize(mean=[...], std=[...])"
  // ToTensor then this, in one pass over a uint8 (H, W, C) image (the same float32 values). Compose uses it.
  Tensor from_uint8(const Tensor& image) const;
  // The per-channel means, as given.
  const std::vector<double>& mean() const { return mean_; }
  // The per-channel standard deviations, as given.
  const std::vector<double>& std() const { return std_; }

 private:
  std::vector<double> mean_, std_;
};

// Resize: an int size sets the shorter side (the longer one is int(size * long / short), as torchvision);
// an ImageSize sets both. uint8 (H, W, C) only.
struct ResizeOptions {
  bool dct_scaling = false;  // decode plans may use a reduced JPEG scale (see the top of this file)
};
// Resizes to a size (see ResizeOptions), as torchvision's Resize.
class Resize : public Transform {
 public:
  explicit Resize(int64_t shorter_side, ResizeOptions options = {});  // kiln::Error unless positive
  explicit Resize(ImageSize size, ResizeOptions options = {});        // kiln::Error unless both sides are positive
  Tensor operator()(Tensor image, SampleRng& rng) const override;
  std::string name() const override;  // "Resize(256)" or "Resize(224x224)"
  std::optional<DecodePlan> plan(ImageSize size, SampleRng& rng) const override;
  Tensor apply_planned(const DecodedRegion& region, const DecodePlan& plan) const override;
  ImageSize output_size(ImageSize input) const;  // the size an `input` image is resized to
  // Whether decode plans may use a reduced JPEG scale (ResizeOptions::dct_scaling).
  bool dct_scaling() const { return options_.dct_scaling; }

 private:
  ImageSize size_;
  bool shorter_side_ = false;
  ResizeOptions options_;
};

// The center (top = round((H - h) / 2) with Python's round-half-to-even, as torchvision), zero-padded first
// where the image is smaller than the crop. uint8 (H, W, C) or float (C, H, W).
class CenterCrop : public Transform {
 public:
  // A size x size crop.
  explicit CenterCrop(int64_t size) : CenterCrop(ImageSize{size, size}) {}
  explicit CenterCrop(ImageSize size);  // kiln::Error unless both sides are positive
  Tensor operator()(Tensor image, SampleRng& rng) const override;
  std::string name() const override;  // "CenterCrop(224x224)"
  // The crop's size.
  ImageSize size() const { return size_; }

 private:
  ImageSize size_;
};

// torchvision's RandomCrop: optional padding (1 value: all sides; 2: left/right, top/bottom; 4: left, top,
// right, bottom) with a constant fill; with pad_if_needed, a side shorter than the crop is padded by the
// difference on both ends (as torchvision); then top ~ randint(H - h + 1), left ~ randint(W - w + 1).
struct RandomCropOptions {
  std::vector<int64_t> padding{};  // pixels, 0, 1, 2 or 4 values, none negative (see above); empty: no padding
  bool pad_if_needed = false;      // pad a side shorter than the crop (else such an image is a kiln::Error)
  double fill = 0;                 // the value of padded pixels
};
// A crop of `size` at a random place, after optional padding (see RandomCropOptions), as torchvision's RandomCrop.
class RandomCrop : public Transform {
 public:
  // A size x size crop.
  explicit RandomCrop(int64_t size, RandomCropOptions options = {}) : RandomCrop(ImageSize{size, size}, options) {}
  RandomCrop(ImageSize size, RandomCropOptions options = {});  // kiln::Error for a non-positive size or bad padding
  Tensor operator()(Tensor image, SampleRng& rng) const override;
  std::string name() const override;  // "RandomCrop(32x32)"

 private:
  ImageSize size_;
  RandomCropOptions options_;
  int64_t pad_[4] = {0, 0, 0, 0};  // left, top, right, bottom
};

// torchvision's RandomResizedCrop: a box of area fraction ~ U(scale) and log aspect ratio ~ U(log ratio)
// (10 attempts, then the center crop clamped to the ratio range), resized to `size`. uint8 (H, W, C).
struct RandomResizedCropOptions {
  double scale[2] = {0.08, 1.0};             // the range of the box's area, as a fraction of the image's
  double ratio[2] = {3.0 / 4.0, 4.0 / 3.0};  // the range of the box's aspect ratio (width / height)
  bool dct_scaling = true;                   // decode plans may use a reduced JPEG scale (see the top of this file)
};
// A random box of the image resized to `size` (see RandomResizedCropOptions), as torchvision's RandomResizedCrop.
class RandomResizedCrop : public Transform {
 public:
  // A size x size output.
  explicit RandomResizedCrop(int64_t size, RandomResizedCropOptions options = {})
      : RandomResizedCrop(ImageSize{size, size}, options) {}
  // kiln::Error for a non-positive size, or scale / ratio not positive ranges (lo <= hi).
  RandomResizedCrop(ImageSize size, RandomResizedCropOptions options = {});
  Tensor operator()(Tensor image, SampleRng& rng) const override;
  std::string name() const override;  // "RandomResizedCrop(224x224)"
  std::optional<DecodePlan> plan(ImageSize size, SampleRng& rng) const override;
  Tensor apply_planned(const DecodedRegion& region, const DecodePlan& plan) const override;
  // The box operator() crops from a `size` image (integer pixels), drawing from rng.
  Box sample_box(ImageSize size, SampleRng& rng) const;
  // The output size.
  ImageSize size() const { return size_; }

 private:
  ImageSize size_;
  RandomResizedCropOptions options_;
};

// Mirrors left-right with probability p. uint8 (H, W, C) or float (C, H, W).
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);  // kiln::Error unless 0 <= p <= 1
  Tensor operator()(Tensor image, SampleRng& rng) const override;
  std::string name() const override;  // "RandomHorizontalFlip(p=0.500000)"
  // The flip probability.
  double p() const { return p_; }

 private:
  double p_;
};

inline const std::vector<double> kImageNetMean = {0.485, 0.456, 0.406};
inline const std::vector<double> kImageNetStd = {0.229, 0.224, 0.225};
inline const std::vector<double> kCifarMean = {0.4914, 0.4822, 0.4465};
inline const std::vector<double> kCifarStd = {0.2470, 0.2435, 0.2616};  // per-pixel std over the training set

// RandomResizedCrop(size) + RandomHorizontalFlip + ToTensor + Normalize(ImageNet).
Compose imagenet_train(int64_t size = 224);
// Resize(size * 256 / 224) + CenterCrop(size) + ToTensor + Normalize(ImageNet).
Compose imagenet_eval(int64_t size = 224);
// RandomCrop(32, padding 4) + RandomHorizontalFlip + ToTensor + Normalize(CIFAR).
Compose cifar_train();
// ToTensor + Normalize(CIFAR).
Compose cifar_eval();

}  // namespace kiln::data::transforms
