// tests/data/gpu_decode_reference.h — what GPU image decoding should give for one image, in float64: the plan's
// box sampled bilinearly (pixel centres, clamped to the plan's clamp box), mirrored when flipped, normalised.
// Written from the definition, independently of the kernel.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kiln/data/gpu_transform.h"

namespace kiln::testing {

// pixels: (h, w, 3) RGB, 0..255 (uint8, or double where the pixels are converted from JPEG's planes). Returns
// (3, oh, ow) row-major.
template <class Pixel>
std::vector<double> gpu_decode_reference(const std::vector<Pixel>& pixels, int64_t h, int64_t w,
                                         const data::GpuImagePlan& p, int64_t oh, int64_t ow,
                                         std::array<double, 3> mean, std::array<double, 3> std) {
  std::vector<double> out(static_cast<size_t>(3 * oh * ow));
  const double lo_y = p.clamp.top, hi_y = p.clamp.top + p.clamp.height - 1;
  const double lo_x = p.clamp.left, hi_x = p.clamp.left + p.clamp.width - 1;
  auto at = [&](int64_t y, int64_t x, int c) {
    EXPECT_TRUE(y >= 0 && y < h && x >= 0 && x < w);
    return static_cast<double>(pixels[static_cast<size_t>((y * w + x) * 3 + c)]);
  };
  for (int64_t oy = 0; oy < oh; ++oy) {
    for (int64_t ox = 0; ox < ow; ++ox) {
      const int64_t col = p.flip ? ow - 1 - ox : ox;
      const double sy = std::clamp(p.box.top + (oy + 0.5) * p.box.height / oh - 0.5, lo_y, hi_y);
      const double sx = std::clamp(p.box.left + (col + 0.5) * p.box.width / ow - 0.5, lo_x, hi_x);
      const auto y0 = static_cast<int64_t>(std::floor(sy)), x0 = static_cast<int64_t>(std::floor(sx));
      const int64_t y1 = std::min<int64_t>(y0 + 1, static_cast<int64_t>(hi_y));
      const int64_t x1 = std::min<int64_t>(x0 + 1, static_cast<int64_t>(hi_x));
      const double fy = sy - y0, fx = sx - x0;
      for (int c = 0; c < 3; ++c) {
        const double v = (1 - fy) * ((1 - fx) * at(y0, x0, c) + fx * at(y0, x1, c)) +
                         fy * ((1 - fx) * at(y1, x0, c) + fx * at(y1, x1, c));
        out[static_cast<size_t>((c * oh + oy) * ow + ox)] = (v / 255.0 - mean[c]) / std[c];
      }
    }
  }
  return out;
}

}  // namespace kiln::testing
