// kiln/data/image_resize.cpp — separable antialiased bilinear resize of uint8 (H, W, C) images.
#include "kiln/data/image_resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::data {

namespace {

constexpr int kPrecisionBits = 22;  // fixed-point weights: sum(pixel * weight) < 2^31 for weights summing to 1

// For each output index: the first input index, the number of taps, and the taps' fixed-point weights
// (`taps` per output, padded with zeros).
struct Weights {
  std::vector<int32_t> first, count;
  std::vector<int32_t> w;
  int taps = 0;
};

Weights compute_weights(int64_t in_size, double box_start, double box_size, int64_t out_size) {
  const double scale = box_size / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;  // the triangle's support is 1, widened when downscaling
  // The box's pixels [begin, end): whole pixels around a fractional box.
  const int64_t begin = std::clamp<int64_t>(static_cast<int64_t>(std::floor(box_start + 1e-9)), 0, in_size - 1);
  const int64_t end =
      std::clamp<int64_t>(static_cast<int64_t>(std::ceil(box_start + box_size - 1e-9)), begin + 1, in_size);
  Weights r;
  r.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  r.first.resize(out_size), r.count.resize(out_size), r.w.assign(out_size * r.taps, 0);
  std::vector<double> k(r.taps);
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = box_start + (static_cast<double>(o) + 0.5) * scale;
    // Truncation toward zero, then clamping, as PIL and torch.
    auto lo = static_cast<int64_t>(center - support + 0.5);
    auto hi = static_cast<int64_t>(center + support + 0.5);
    // Only pixels of the box (as if it were cropped first, as torchvision's resized_crop).
    lo = std::clamp<int64_t>(lo, begin, end - 1);
    hi = std::clamp<int64_t>(hi, lo + 1, end);
    int64_t n = std::min<int64_t>(hi - lo, r.taps);
    double total = 0;
    for (int64_t t = 0; t < n; ++t) {
      const double x = (static_cast<double>(t + lo) - center + 0.5) / filter_scale;
      k[t] = std::max(0.0, 1.0 - std::abs(x));
      total += k[t];
    }
    for (int64_t t = 0; t < n; ++t) {
      const double v = total != 0 ? k[t] / total : (t == 0 ? 1.0 : 0.0);
      r.w[o * r.taps + t] = static_cast<int32_t>(std::lround(v * (1 << kPrecisionBits)));
    }
    r.first[o] = static_cast<int32_t>(lo);
    r.count[o] = static_cast<int32_t>(n);
  }
  // Every output reads exactly `taps` inputs when the image is wide enough (zero weights pad the rest): the
  // inner loops then have a fixed trip count. Taps that would run past the end start earlier instead.
  if (in_size >= r.taps) {
    for (int64_t o = 0; o < out_size; ++o) {
      const int64_t shift = std::max<int64_t>(0, r.first[o] + r.taps - in_size);
      if (shift == 0) continue;
      int32_t* w = &r.w[o * r.taps];
      std::copy_backward(w, w + r.taps - shift, w + r.taps);
      std::fill(w, w + shift, 0);
      r.first[o] -= static_cast<int32_t>(shift);
    }
    std::fill(r.count.begin(), r.count.end(), r.taps);
  }
  return r;
}

inline uint8_t clip8(int32_t acc) {
  const int32_t v = (acc + (1 << (kPrecisionBits - 1))) >> kPrecisionBits;
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
}

// rows [row0, row1) of src (H, W, C) -> dst (row1 - row0, out_w, C), along each row.
template <int C, int Taps = 0>
void horizontal(const uint8_t* __restrict src, int64_t width, int64_t channels, int64_t row0, int64_t row1,
                const Weights& wx, uint8_t* __restrict dst) {
  const int64_t ch = C > 0 ? C : channels;
  const auto out_w = static_cast<int64_t>(wx.first.size());
  const int32_t* __restrict first = wx.first.data();
  const int32_t* __restrict count = wx.count.data();
  const int32_t* __restrict weights = wx.w.data();
  for (int64_t y = row0; y < row1; ++y) {
    const uint8_t* __restrict in = src + y * width * ch;
    uint8_t* __restrict out = dst + (y - row0) * out_w * ch;
    for (int64_t x = 0; x < out_w; ++x) {
      const uint8_t* __restrict p = in + static_cast<int64_t>(first[x]) * ch;
      const int32_t* __restrict w = weights + x * wx.taps;
      const int n = count[x];
      if constexpr (C == 3 && Taps > 0) {
        int32_t a0 = 0, a1 = 0, a2 = 0;
        for (int t = 0; t < Taps; ++t, p += 3) a0 += p[0] * w[t], a1 += p[1] * w[t], a2 += p[2] * w[t];
        out[x * 3] = clip8(a0), out[x * 3 + 1] = clip8(a1), out[x * 3 + 2] = clip8(a2);
      } else if constexpr (C == 3) {
        int32_t a0 = 0, a1 = 0, a2 = 0;
        for (int t = 0; t < n; ++t, p += 3) a0 += p[0] * w[t], a1 += p[1] * w[t], a2 += p[2] * w[t];
        out[x * 3] = clip8(a0), out[x * 3 + 1] = clip8(a1), out[x * 3 + 2] = clip8(a2);
      } else {
        for (int64_t c = 0; c < ch; ++c) {
          int32_t a = 0;
          for (int t = 0; t < n; ++t) a += p[t * ch + c] * w[t];
          out[x * ch + c] = clip8(a);
        }
      }
    }
  }
}

// src rows (row0 first) of `row_elems` values -> dst (out_h, row_elems), along each column.
void vertical(const uint8_t* __restrict src, int64_t row0, int64_t row_elems, const Weights& wy,
              uint8_t* __restrict dst) {
  std::vector<int32_t> acc(row_elems);
  const auto out_h = static_cast<int64_t>(wy.first.size());
  for (int64_t y = 0; y < out_h; ++y) {
    std::fill(acc.begin(), acc.end(), 0);
    for (int t = 0; t < wy.count[y]; ++t) {
      const int32_t w = wy.w[y * wy.taps + t];
      const uint8_t* __restrict in = src + (wy.first[y] + t - row0) * row_elems;
      int32_t* __restrict a = acc.data();
      for (int64_t i = 0; i < row_elems; ++i) a[i] += in[i] * w;
    }
    uint8_t* __restrict out = dst + y * row_elems;
    const int32_t* __restrict a = acc.data();
    for (int64_t i = 0; i < row_elems; ++i) out[i] = clip8(a[i]);
  }
}

}  // namespace

Tensor resize_image(const Tensor& image, int64_t out_height, int64_t out_width, std::optional<Box> box) {
  KILN_CHECK(image.dtype() == DType::UInt8 && image.dim() == 3 && image.shape()[0] > 0 && image.shape()[1] > 0,
             "resize_image: expected a non-empty (H, W, C) uint8 image, got ", image.dtype(), " ", image.shape());
  KILN_CHECK(out_height > 0 && out_width > 0, "resize_image: the output size must be positive, got ", out_height, " x ",
             out_width);
  Tensor src = internal::contiguous(internal::to(image, Device::cpu()));
  const int64_t h = src.shape()[0], w = src.shape()[1], c = src.shape()[2];
  const Box b = box.value_or(Box{0, 0, static_cast<double>(h), static_cast<double>(w)});
  KILN_CHECK(b.height > 0 && b.width > 0 && b.top >= -1e-6 && b.left >= -1e-6 && b.top + b.height <= h + 1e-6 &&
                 b.left + b.width <= w + 1e-6,
             "resize_image: the box (top ", b.top, ", left ", b.left, ", ", b.height, " x ", b.width,
             ") must lie inside the ", h, " x ", w, " image");
  const Weights wx = compute_weights(w, b.left, b.width, out_width);
  const Weights wy = compute_weights(h, b.top, b.height, out_height);
  const int64_t row0 = wy.first.front();
  const int64_t row1 = wy.first.back() + wy.count.back();
  Tensor out = internal::empty({out_height, out_width, c}, {.dtype = DType::UInt8});
  // The horizontal pass over just the rows the vertical pass reads; (row1 - row0, out_w, C).
  std::vector<uint8_t> mid((row1 - row0) * out_width * c);
  const uint8_t* in = src.data_ptr<uint8_t>();
  const bool fixed = wx.count.front() == wx.taps && w >= wx.taps;  // every output has `taps` taps
  if (c == 3 && fixed && wx.taps == 3) horizontal<3, 3>(in, w, c, row0, row1, wx, mid.data());
  else if (c == 3 && fixed && wx.taps == 5) horizontal<3, 5>(in, w, c, row0, row1, wx, mid.data());
  else if (c == 3) horizontal<3>(in, w, c, row0, row1, wx, mid.data());
  else horizontal<0>(in, w, c, row0, row1, wx, mid.data());
  vertical(mid.data(), row0, out_width * c, wy, out.data_ptr<uint8_t>());
  return out;
}

}  // namespace kiln::data
