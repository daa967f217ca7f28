// kiln/data/transforms.cpp — Compose, Lambda, ToTensor, Normalize, and the presets (the geometric transforms
// are in transforms_geometry.cpp).
#include "kiln/data/transforms.h"

#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::data::transforms {

std::optional<DecodePlan> Transform::plan(ImageSize, SampleRng&) const { return std::nullopt; }

Tensor Transform::apply_planned(const DecodedRegion&, const DecodePlan&) const {
  KILN_FAIL(name(), " has no decode plan; call it on a decoded image");
}

Compose::Compose(std::vector<std::shared_ptr<const Transform>> steps) : steps_(std::move(steps)) {
  for (const auto& s : steps_) KILN_CHECK(s != nullptr, "Compose: a step is null");
}

Tensor Compose::run_from(Tensor image, size_t first, SampleRng& rng) const {
  for (size_t i = first; i < steps_.size(); ++i) {
    if (i + 1 < steps_.size() && image.dtype() == DType::UInt8 && image.dim() == 3 &&
        dynamic_cast<const ToTensor*>(steps_[i].get()) != nullptr) {
      if (const auto* norm = dynamic_cast<const Normalize*>(steps_[i + 1].get())) {  // neither draws numbers
        image = norm->from_uint8(image);
        ++i;
        continue;
      }
    }
    SampleRng step_rng = rng.fork(i);
    image = (*steps_[i])(std::move(image), step_rng);
  }
  return image;
}

Tensor Compose::operator()(Tensor image, SampleRng& rng) const { return run_from(std::move(image), 0, rng); }

Tensor Compose::load(std::span<const uint8_t> bytes, const std::string& name, SampleRng& rng) const {
  size_t next = 0;
  Tensor image;
  if (!steps_.empty()) {
    SampleRng step_rng = rng.fork(0);
    std::optional<DecodePlan> plan = steps_[0]->plan(image_size(bytes, name), step_rng);
    if (plan) {
      image = steps_[0]->apply_planned(decode_image_region(bytes, name, *plan), *plan);
      next = 1;
    }
  }
  if (next == 0) image = decode_image(bytes, name);
  return run_from(std::move(image), next, rng);
}

std::string Compose::describe() const {
  std::string s = "Compose(";
  for (size_t i = 0; i < steps_.size(); ++i) s += (i ? ", " : "") + steps_[i]->name();
  return s + ")";
}

Lambda::Lambda(std::function<Tensor(Tensor, SampleRng&)> fn, std::string name)
    : fn_(std::move(fn)), name_(std::move(name)) {
  KILN_CHECK(fn_ != nullptr, "Lambda: the function is empty");
}

Tensor Lambda::operator()(Tensor image, SampleRng& rng) const { return fn_(std::move(image), rng); }

Tensor ToTensor::operator()(Tensor image, SampleRng&) const {
  KILN_CHECK(image.dtype() == DType::UInt8 && image.dim() == 3, "ToTensor: expected a uint8 (H, W, C) image, got ",
             image.dtype(), " ", image.shape());
  Tensor src = internal::contiguous(internal::to(image, Device::cpu()));
  const int64_t h = src.shape()[0], w = src.shape()[1], c = src.shape()[2];
  Tensor out = internal::empty({c, h, w}, {.dtype = DType::Float32});
  float lut[256];  // x / 255 rounded as float division, as torchvision's img.float().div(255)
  for (int v = 0; v < 256; ++v) lut[v] = static_cast<float>(v) / 255.0f;
  const uint8_t* __restrict in = src.data_ptr<uint8_t>();
  float* __restrict o = out.data_ptr<float>();
  const int64_t plane = h * w;
  if (c == 3) {
    for (int64_t i = 0; i < plane; ++i, in += 3) {
      o[i] = lut[in[0]], o[plane + i] = lut[in[1]], o[2 * plane + i] = lut[in[2]];
    }
  } else {
    for (int64_t i = 0; i < plane; ++i)
      for (int64_t ch = 0; ch < c; ++ch) o[ch * plane + i] = lut[in[i * c + ch]];
  }
  return out;
}

Normalize::Normalize(std::vector<double> mean, std::vector<double> std) : mean_(std::move(mean)), std_(std::move(std)) {
  KILN_CHECK(!mean_.empty() && mean_.size() == std_.size(), "Normalize: mean and std need the same, non-zero number ",
             "of values (one per channel), got ", mean_.size(), " and ", std_.size());
  for (double s : std_) KILN_CHECK(s > 0, "Normalize: every std must be positive, got ", s);
}

Tensor Normalize::operator()(Tensor image, SampleRng&) const {
  KILN_CHECK(image.dtype() == DType::Float32 && image.dim() == 3,
             "Normalize: expected a float32 (C, H, W) tensor (apply ToTensor to uint8 images first), got ",
             image.dtype(), " ", image.shape());
  const int64_t c = image.shape()[0];
  KILN_CHECK(static_cast<int64_t>(mean_.size()) == c || mean_.size() == 1, "Normalize: ", mean_.size(),
             " mean/std values for an image of ", c, " channels");
  Tensor src = internal::contiguous(internal::to(image, Device::cpu()));
  Tensor out = internal::empty(src.shape(), {.dtype = DType::Float32});
  const int64_t plane = src.shape()[1] * src.shape()[2];
  const float* __restrict in = src.data_ptr<float>();
  float* __restrict o = out.data_ptr<float>();
  for (int64_t ch = 0; ch < c; ++ch) {
    // (x - mean) / std in float32, as torchvision's sub_ then div_.
    const auto m = static_cast<float>(mean_[mean_.size() == 1 ? 0 : ch]);
    const auto s = static_cast<float>(std_[std_.size() == 1 ? 0 : ch]);
    for (int64_t i = 0; i < plane; ++i) o[ch * plane + i] = (in[ch * plane + i] - m) / s;
  }
  return out;
}

Tensor Normalize::from_uint8(const Tensor& image) const {
  KILN_CHECK(image.dtype() == DType::UInt8 && image.dim() == 3, "ToTensor + Normalize: expected a uint8 (H, W, C) ",
             "image, got ", image.dtype(), " ", image.shape());
  Tensor src = internal::contiguous(internal::to(image, Device::cpu()));
  const int64_t h = src.shape()[0], w = src.shape()[1], c = src.shape()[2];
  KILN_CHECK(static_cast<int64_t>(mean_.size()) == c || mean_.size() == 1, "Normalize: ", mean_.size(),
             " mean/std values for an image of ", c, " channels");
  // Per channel, every uint8 value's result, computed as the two steps would: (float(v) / 255 - mean) / std.
  std::vector<float> lut(static_cast<size_t>(c) * 256);
  for (int64_t ch = 0; ch < c; ++ch) {
    const auto m = static_cast<float>(mean_[mean_.size() == 1 ? 0 : ch]);
    const auto s = static_cast<float>(std_[std_.size() == 1 ? 0 : ch]);
    for (int v = 0; v < 256; ++v) lut[ch * 256 + v] = (static_cast<float>(v) / 255.0f - m) / s;
  }
  Tensor out = internal::empty({c, h, w}, {.dtype = DType::Float32});
  const uint8_t* __restrict in = src.data_ptr<uint8_t>();
  float* __restrict o = out.data_ptr<float>();
  const float* __restrict l = lut.data();
  const int64_t plane = h * w;
  if (c == 3) {
    for (int64_t i = 0; i < plane; ++i) {
      o[i] = l[in[3 * i]], o[plane + i] = l[256 + in[3 * i + 1]], o[2 * plane + i] = l[512 + in[3 * i + 2]];
    }
  } else {
    for (int64_t i = 0; i < plane; ++i)
      for (int64_t ch = 0; ch < c; ++ch) o[ch * plane + i] = l[ch * 256 + in[i * c + ch]];
  }
  return out;
}

std::string Normalize::name() const {
  auto list = [](const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  return "Normalize(mean=" + list(mean_) + ", std=" + list(std_) + ")";
}

Compose imagenet_train(int64_t size) {
  return Compose{RandomResizedCrop(size), RandomHorizontalFlip(0.5), ToTensor(),
                 Normalize(kImageNetMean, kImageNetStd)};
}

Compose imagenet_eval(int64_t size) {
  return Compose{Resize(size * 256 / 224), CenterCrop(size), ToTensor(), Normalize(kImageNetMean, kImageNetStd)};
}

Compose cifar_train() {
  return Compose{RandomCrop(32, {.padding = {4}}), RandomHorizontalFlip(0.5), ToTensor(),
                 Normalize(kCifarMean, kCifarStd)};
}

Compose cifar_eval() { return Compose{ToTensor(), Normalize(kCifarMean, kCifarStd)}; }

}  // namespace kiln::data::transforms
