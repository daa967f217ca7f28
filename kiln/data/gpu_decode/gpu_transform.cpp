// kiln/data/gpu_decode/gpu_transform.cpp — reading a Compose into the GPU kernel's parameters, and the per-image
// choices (drawn on the CPU, as the CPU transforms draw them).
#include "kiln/data/gpu_transform.h"

#include <cmath>

#include "kiln/tensor/error.h"

namespace kiln::data {

namespace {

template <class T>
const T* as(const std::shared_ptr<const transforms::Transform>& step) {
  return dynamic_cast<const T*>(step.get());
}

}  // namespace

GpuTransform GpuTransform::from(const transforms::Compose& compose, GpuTransformOptions options) {
  KILN_CHECK(options.dtype == DType::Float32 || options.dtype == DType::BFloat16,
             "GPU image decoding: the batch dtype must be float32 or bfloat16, got ", options.dtype);
  GpuTransform g;
  g.steps_ = compose.steps();
  g.options_ = options;
  g.describe_ = "GPU(" + compose.describe() + ")";
  const auto& steps = g.steps_;
  auto unsupported = [&](size_t i, const std::string& why) {
    KILN_FAIL("GPU image decoding cannot run ", compose.describe(), ": step ", i, " (",
              i < steps.size() ? steps[i]->name() : std::string("end"), ") ", why,
              ". The GPU path takes RandomResizedCrop [RandomHorizontalFlip] ToTensor [Normalize] or Resize "
              "[CenterCrop] [RandomHorizontalFlip] ToTensor [Normalize]; decode this pipeline on the CPU "
              "(Decode::Cpu)");
  };
  size_t i = 0;
  if (i < steps.size() && (g.random_crop_ = as<transforms::RandomResizedCrop>(steps[i]))) {
    g.out_ = g.random_crop_->size();
    ++i;
  } else if (i < steps.size() && (g.resize_ = as<transforms::Resize>(steps[i]))) {
    ++i;
    if (i < steps.size() && (g.center_crop_ = as<transforms::CenterCrop>(steps[i]))) {
      g.out_ = g.center_crop_->size();
      ++i;
    }
  } else {
    unsupported(i, "is not a RandomResizedCrop or Resize (a batch needs one output size)");
  }
  if (i < steps.size() && (g.flip_ = as<transforms::RandomHorizontalFlip>(steps[i]))) {
    g.flip_step_ = i;
    ++i;
  }
  if (i >= steps.size() || !as<transforms::ToTensor>(steps[i])) unsupported(i, "should be ToTensor");
  ++i;
  if (i < steps.size()) {
    const auto* norm = as<transforms::Normalize>(steps[i]);
    if (!norm) unsupported(i, "is not Normalize");
    const auto& m = norm->mean();
    const auto& s = norm->std();
    KILN_CHECK(m.size() == 1 || m.size() == 3, "GPU image decoding: Normalize needs 1 or 3 values (RGB), got ",
               m.size());
    for (size_t c = 0; c < 3; ++c) {
      g.mean_[c] = static_cast<float>(m[m.size() == 1 ? 0 : c]);
      g.std_[c] = static_cast<float>(s[s.size() == 1 ? 0 : c]);
    }
    ++i;
  }
  if (i < steps.size()) unsupported(i, "comes after Normalize");
  // Resize(int) alone gives a size that depends on each image: a batch cannot hold those.
  if (g.resize_ && !g.center_crop_) {
    const ImageSize a = g.resize_->output_size({100, 200}), b = g.resize_->output_size({200, 100});
    if (!(a == b))
      unsupported(0,
                  "resizes the shorter side only, so images of other shapes differ in size; add a "
                  "CenterCrop");
    g.out_ = a;
  }
  return g;
}

GpuImagePlan GpuTransform::plan(ImageSize size, SampleRng& rng) const {
  KILN_CHECK(size.height > 0 && size.width > 0, "GPU image decoding: an empty image (", size.height, " x ", size.width,
             ")");
  GpuImagePlan p;
  const auto h = static_cast<double>(size.height), w = static_cast<double>(size.width);
  if (random_crop_) {
    SampleRng step_rng = rng.fork(0);
    p.box = random_crop_->sample_box(size, step_rng);
    p.clamp = p.box;
  } else {
    // Resize to (rh, rw), then the center crop of that: the crop's source region, fractional. Sampling the
    // resized image at output pixel x reads source (x + 0.5) * w / rw - 0.5, so the crop at `left` reads source
    // (left + x + 0.5) * w / rw - 0.5: a box starting at left * w / rw, crop.width * w / rw wide.
    const ImageSize r = resize_->output_size(size);
    const auto rh = static_cast<double>(r.height), rw = static_cast<double>(r.width);
    double top = 0, left = 0, ch = rh, cw = rw;
    if (center_crop_) {
      const ImageSize c = center_crop_->size();
      KILN_CHECK(c.height <= r.height && c.width <= r.width, "GPU image decoding: ", center_crop_->name(),
                 " is larger than the resized image (", r.height, " x ", r.width,
                 "); the GPU path does not pad: decode on the CPU");
      top = std::nearbyint((rh - static_cast<double>(c.height)) / 2.0);  // half to even, as torchvision's round
      left = std::nearbyint((rw - static_cast<double>(c.width)) / 2.0);
      ch = static_cast<double>(c.height), cw = static_cast<double>(c.width);
    }
    p.box = {top * h / rh, left * w / rw, ch * h / rh, cw * w / rw};
    p.clamp = {0, 0, h, w};
  }
  if (flip_) {
    SampleRng step_rng = rng.fork(flip_step_);
    p.flip = step_rng.bernoulli(flip_->p());
  }
  return p;
}

}  // namespace kiln::data
