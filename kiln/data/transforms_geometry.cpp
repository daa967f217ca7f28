// kiln/data/transforms_geometry.cpp — Resize, CenterCrop, RandomCrop, RandomResizedCrop, RandomHorizontalFlip.
#include <algorithm>
#include <cmath>

#include "kiln/data/image_resize.h"
#include "kiln/data/transforms.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::data::transforms {

namespace {

// uint8 (H, W, C): one plane of H rows of W pixels of C values; float32 (C, H, W): C planes, pixels of 1 value.
struct Layout {
  int64_t planes, h, w, px;
  bool hwc;
};

Layout layout_of(const Tensor& t, const std::string& who) {
  KILN_CHECK(t.dim() == 3 && (t.dtype() == DType::UInt8 || t.dtype() == DType::Float32), who,
             ": expected a uint8 (H, W, C) image or a float32 (C, H, W) tensor, got ", t.dtype(), " ", t.shape());
  const Shape& s = t.shape();
  if (t.dtype() == DType::UInt8) return {1, s[0], s[1], s[2], true};
  return {s[0], s[1], s[2], 1, false};
}

void check_uint8_image(const Tensor& t, const std::string& who) {
  KILN_CHECK(t.dtype() == DType::UInt8 && t.dim() == 3 && t.shape()[0] > 0 && t.shape()[1] > 0, who,
             ": expected a non-empty uint8 (H, W, C) image (resize before ToTensor), got ", t.dtype(), " ", t.shape());
}

// The (h, w) window at (top, left) of src (may reach outside it: those pixels are `fill`).
template <class T>
Tensor crop_pad_as(const Tensor& src, const Layout& l, int64_t top, int64_t left, int64_t h, int64_t w, T fill) {
  Tensor out = internal::empty(l.hwc ? Shape{h, w, l.px} : Shape{l.planes, h, w}, {.dtype = src.dtype()});
  const T* in = src.data_ptr<T>();
  T* o = out.data_ptr<T>();
  const int64_t x_lo = std::clamp<int64_t>(-left, 0, w), x_hi = std::clamp<int64_t>(l.w - left, x_lo, w);
  for (int64_t p = 0; p < l.planes; ++p) {
    for (int64_t y = 0; y < h; ++y) {
      T* row = o + (p * h + y) * w * l.px;
      const int64_t sy = top + y;
      if (sy < 0 || sy >= l.h) {
        std::fill(row, row + w * l.px, fill);
        continue;
      }
      std::fill(row, row + x_lo * l.px, fill);
      const T* srow = in + ((p * l.h + sy) * l.w + left + x_lo) * l.px;
      std::copy(srow, srow + (x_hi - x_lo) * l.px, row + x_lo * l.px);
      std::fill(row + x_hi * l.px, row + w * l.px, fill);
    }
  }
  return out;
}

Tensor crop_pad(const Tensor& image, const std::string& who, int64_t top, int64_t left, int64_t h, int64_t w,
                double fill) {
  const Layout l = layout_of(image, who);
  Tensor src = internal::contiguous(internal::to(image, Device::cpu()));
  if (l.hwc) {
    return crop_pad_as<uint8_t>(src, l, top, left, h, w,
                                static_cast<uint8_t>(std::clamp(std::round(fill), 0.0, 255.0)));
  }
  return crop_pad_as<float>(src, l, top, left, h, w, static_cast<float>(fill));
}

template <class T>
Tensor flip_as(const Tensor& src, const Layout& l) {
  Tensor out = internal::empty(src.shape(), {.dtype = src.dtype()});
  const T* in = src.data_ptr<T>();
  T* o = out.data_ptr<T>();
  for (int64_t r = 0; r < l.planes * l.h; ++r) {
    const T* srow = in + r * l.w * l.px;
    T* row = o + r * l.w * l.px;
    if (l.px == 1) {
      std::reverse_copy(srow, srow + l.w, row);
    } else if (l.px == 3) {
      for (int64_t x = 0; x < l.w; ++x) {
        const T* s = srow + x * 3;
        T* d = row + (l.w - 1 - x) * 3;
        d[0] = s[0], d[1] = s[1], d[2] = s[2];
      }
    } else {
      for (int64_t x = 0; x < l.w; ++x)
        for (int64_t c = 0; c < l.px; ++c) row[(l.w - 1 - x) * l.px + c] = srow[x * l.px + c];
    }
  }
  return out;
}

// Python's round(): halves to even.
int64_t round_half_even(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

std::string size_str(ImageSize s) { return std::to_string(s.height) + "x" + std::to_string(s.width); }

}  // namespace

// ---------------------------------------------------------------- Resize

Resize::Resize(int64_t shorter_side, ResizeOptions options)
    : size_{shorter_side, shorter_side}, shorter_side_(true), options_(options) {
  KILN_CHECK(shorter_side > 0, "Resize: the size must be positive, got ", shorter_side);
}

Resize::Resize(ImageSize size, ResizeOptions options) : size_(size), options_(options) {
  KILN_CHECK(size.height > 0 && size.width > 0, "Resize: the size must be positive, got ", size_str(size));
}

ImageSize Resize::output_size(ImageSize in) const {
  if (!shorter_side_) return size_;
  const int64_t s = size_.height;
  const int64_t short_side = std::min(in.height, in.width), long_side = std::max(in.height, in.width);
  const auto new_long = static_cast<int64_t>(static_cast<double>(s) * static_cast<double>(long_side) /
                                             static_cast<double>(short_side));  // int() truncates, as torchvision
  return in.height <= in.width ? ImageSize{s, new_long} : ImageSize{new_long, s};
}

Tensor Resize::operator()(Tensor image, SampleRng&) const {
  check_uint8_image(image, name());
  const ImageSize out = output_size({image.shape()[0], image.shape()[1]});
  return resize_image(image, out.height, out.width);
}

std::optional<DecodePlan> Resize::plan(ImageSize size, SampleRng&) const {
  const ImageSize out = output_size(size);
  return DecodePlan{{0, 0, static_cast<double>(size.height), static_cast<double>(size.width)},
                    out.height,
                    out.width,
                    options_.dct_scaling};
}

Tensor Resize::apply_planned(const DecodedRegion& region, const DecodePlan& plan) const {
  return resize_image(region.image, plan.out_height, plan.out_width, region.box);
}

std::string Resize::name() const {
  return "Resize(" + (shorter_side_ ? std::to_string(size_.height) : size_str(size_)) + ")";
}

// ---------------------------------------------------------------- CenterCrop

CenterCrop::CenterCrop(ImageSize size) : size_(size) {
  KILN_CHECK(size.height > 0 && size.width > 0, "CenterCrop: the size must be positive, got ", size_str(size));
}

Tensor CenterCrop::operator()(Tensor image, SampleRng&) const {
  const Layout l = layout_of(image, name());
  // Zero padding where the crop is larger (torchvision: floor half before, the rest after), then the center.
  const int64_t pad_top = size_.height > l.h ? (size_.height - l.h) / 2 : 0;
  const int64_t pad_left = size_.width > l.w ? (size_.width - l.w) / 2 : 0;
  const int64_t padded_h = std::max(l.h, size_.height), padded_w = std::max(l.w, size_.width);
  const int64_t top = round_half_even(static_cast<double>(padded_h - size_.height) / 2.0) - pad_top;
  const int64_t left = round_half_even(static_cast<double>(padded_w - size_.width) / 2.0) - pad_left;
  return crop_pad(image, name(), top, left, size_.height, size_.width, 0.0);
}

std::string CenterCrop::name() const { return "CenterCrop(" + size_str(size_) + ")"; }

// ---------------------------------------------------------------- RandomCrop

RandomCrop::RandomCrop(ImageSize size, RandomCropOptions options) : size_(size), options_(std::move(options)) {
  KILN_CHECK(size.height > 0 && size.width > 0, "RandomCrop: the size must be positive, got ", size_str(size));
  const auto& p = options_.padding;
  KILN_CHECK(p.empty() || p.size() == 1 || p.size() == 2 || p.size() == 4,
             "RandomCrop: padding takes 1 (all sides), 2 (left/right, top/bottom) or 4 (left, top, right, bottom) ",
             "values, got ", p.size());
  for (int64_t v : p) KILN_CHECK(v >= 0, "RandomCrop: padding must not be negative, got ", v);
  if (p.size() == 1) pad_[0] = pad_[1] = pad_[2] = pad_[3] = p[0];
  if (p.size() == 2) pad_[0] = pad_[2] = p[0], pad_[1] = pad_[3] = p[1];
  if (p.size() == 4) std::copy(p.begin(), p.end(), pad_);
}

Tensor RandomCrop::operator()(Tensor image, SampleRng& rng) const {
  const Layout l = layout_of(image, name());
  int64_t left = pad_[0], top = pad_[1];
  int64_t w = l.w + pad_[0] + pad_[2], h = l.h + pad_[1] + pad_[3];
  if (options_.pad_if_needed && w < size_.width) {  // torchvision pads both sides by the difference
    left += size_.width - w;
    w += 2 * (size_.width - w);
  }
  if (options_.pad_if_needed && h < size_.height) {
    top += size_.height - h;
    h += 2 * (size_.height - h);
  }
  KILN_CHECK(h >= size_.height && w >= size_.width, name(), ": the image (", l.h, " x ", l.w, ", ", h, " x ", w,
             " after padding) is smaller than the crop; use pad_if_needed or a larger padding");
  int64_t i = 0, j = 0;
  if (h != size_.height || w != size_.width) {  // torchvision draws nothing when the sizes match
    i = rng.randint(h - size_.height + 1);
    j = rng.randint(w - size_.width + 1);
  }
  return crop_pad(image, name(), i - top, j - left, size_.height, size_.width, options_.fill);
}

std::string RandomCrop::name() const { return "RandomCrop(" + size_str(size_) + ")"; }

// ---------------------------------------------------------------- RandomResizedCrop

RandomResizedCrop::RandomResizedCrop(ImageSize size, RandomResizedCropOptions options)
    : size_(size), options_(options) {
  KILN_CHECK(size.height > 0 && size.width > 0, "RandomResizedCrop: the size must be positive, got ", size_str(size));
  const auto& o = options_;
  KILN_CHECK(0 < o.scale[0] && o.scale[0] <= o.scale[1] && o.ratio[0] > 0 && o.ratio[0] <= o.ratio[1],
             "RandomResizedCrop: need 0 < scale[0] <= scale[1] and 0 < ratio[0] <= ratio[1], got scale (", o.scale[0],
             ", ", o.scale[1], "), ratio (", o.ratio[0], ", ", o.ratio[1], ")");
}

Box RandomResizedCrop::sample_box(ImageSize size, SampleRng& rng) const {
  const auto height = size.height, width = size.width;
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(options_.ratio[0]), log_hi = std::log(options_.ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(options_.scale[0], options_.scale[1]);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int64_t w = round_half_even(std::sqrt(target_area * aspect));
    const int64_t h = round_half_even(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int64_t i = rng.randint(height - h + 1);
      const int64_t j = rng.randint(width - w + 1);
      return {static_cast<double>(i), static_cast<double>(j), static_cast<double>(h), static_cast<double>(w)};
    }
  }
  // Fallback: the whole image, cut to the nearest ratio in range, centered.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < options_.ratio[0]) {
    h = round_half_even(static_cast<double>(w) / options_.ratio[0]);
  } else if (in_ratio > options_.ratio[1]) {
    w = round_half_even(static_cast<double>(h) * options_.ratio[1]);
  }
  return {static_cast<double>((height - h) / 2), static_cast<double>((width - w) / 2), static_cast<double>(h),
          static_cast<double>(w)};
}

Tensor RandomResizedCrop::operator()(Tensor image, SampleRng& rng) const {
  check_uint8_image(image, name());
  const Box box = sample_box({image.shape()[0], image.shape()[1]}, rng);
  return resize_image(image, size_.height, size_.width, box);
}

std::optional<DecodePlan> RandomResizedCrop::plan(ImageSize size, SampleRng& rng) const {
  return DecodePlan{sample_box(size, rng), size_.height, size_.width, options_.dct_scaling};
}

Tensor RandomResizedCrop::apply_planned(const DecodedRegion& region, const DecodePlan& plan) const {
  return resize_image(region.image, plan.out_height, plan.out_width, region.box);
}

std::string RandomResizedCrop::name() const { return "RandomResizedCrop(" + size_str(size_) + ")"; }

// ---------------------------------------------------------------- RandomHorizontalFlip

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  KILN_CHECK(p >= 0 && p <= 1, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

Tensor RandomHorizontalFlip::operator()(Tensor image, SampleRng& rng) const {
  const Layout l = layout_of(image, name());
  if (!rng.bernoulli(p_)) return image;
  Tensor src = internal::contiguous(internal::to(image, Device::cpu()));
  return l.hwc ? flip_as<uint8_t>(src, l) : flip_as<float>(src, l);
}

std::string RandomHorizontalFlip::name() const { return "RandomHorizontalFlip(p=" + std::to_string(p_) + ")"; }

}  // namespace kiln::data::transforms
