// kiln/data/image_resize.h — bilinear resizing of uint8 (H, W, C) images, antialiased when downscaling
// (torchvision's resize(antialias=True) and PIL's BILINEAR).
//
//   Tensor small = data::resize_image(img, 224, 224);                        // the whole image
//   Tensor crop = data::resize_image(img, 224, 224, {.top = 10, .left = 20, .height = 100, .width = 150});
//
// The filter is the triangle (tent) function, its support widened by the downscale factor, so every input
// pixel under an output pixel contributes (no aliasing). Weights are computed once per output row and
// column, in fixed point as PIL does (22 fractional bits); the horizontal pass runs first, into uint8 rows,
// then the vertical one. A box (fractional allowed) resizes just that part of the image: output pixel
// centers map to box.left + (x + 0.5) * box.width / out_width (as PIL's Image.resize(box=...)), and only
// pixels inside the box are read (as cropping first, torchvision's resized_crop).
#pragma once

#include <cstdint>
#include <optional>

#include "kiln/data/image.h"
#include "kiln/tensor/tensor.h"

namespace kiln::data {

// image: (H, W, C) uint8, C >= 1 -> (out_height, out_width, C) uint8, contiguous.
Tensor resize_image(const Tensor& image, int64_t out_height, int64_t out_width, std::optional<Box> box = {});

}  // namespace kiln::data
