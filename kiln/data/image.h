// kiln/data/image.h — decoding JPEG (libjpeg-turbo) and PNG (libpng) files into uint8 (H, W, 3) RGB tensors.
//
//   Tensor img = data::read_image("cat.jpg");                // (H, W, 3) uint8, HWC contiguous
//   data::ImageSize s = data::image_size("cat.jpg");         // header only: {height, width}
//   Tensor img2 = data::decode_image(bytes, "cat.jpg");      // from memory; the name is for messages
//
//   // Decode only what a crop needs (JPEG): rows/columns of the box, at a reduced DCT scale when allowed.
//   data::DecodePlan plan{.box = {.top = 40, .left = 60, .height = 200, .width = 300}, .out_height = 224,
//                         .out_width = 224, .dct_scaling = true};
//   data::DecodedRegion r = data::decode_image_region(bytes, "cat.jpg", plan);
//   // r.image covers at least the box; r.box is the box in r.image's pixels (fractional when scaled).
//
// Every image comes out as RGB: grayscale is replicated, CMYK/YCCK JPEGs converted, PNG palettes expanded,
// 16-bit PNG channels scaled to 8 bits, alpha dropped (as PIL's convert("RGB") and torchvision's
// ImageReadMode.RGB). Bad files (empty, truncated, garbage, unsupported) throw kiln::Error naming the file.
//
// Decompression bombs: a file whose header claims more than max_image_pixels() pixels (height x width) is
// refused from its header, before anything is allocated, by every decoder (JPEG, PNG, image_size, and so the
// GPU path and ImageFolder's skip_bad_files, which read the header through image_size). The default,
// kDefaultMaxImagePixels = 178,956,970, is where PIL raises DecompressionBombError (2 x Image.MAX_IMAGE_PIXELS,
// 2 x 89,478,485: a 1 GB 24-bit image); PIL only warns between 1x and 2x, and kiln, having no warnings, accepts
// what PIL accepts. data::set_max_image_pixels(n) changes it for the process, std::nullopt removes it
// (PIL's Image.MAX_IMAGE_PIXELS = None).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::data {

// An image's size in pixels.
struct ImageSize {
  int64_t height = 0;  // rows
  int64_t width = 0;   // columns
  // Equal when both sides are.
  bool operator==(const ImageSize&) const = default;
};

// A box in pixels of an image; fractional coordinates are allowed where a box is scaled.
struct Box {
  double top = 0;     // the first row
  double left = 0;    // the first column
  double height = 0;  // rows
  double width = 0;   // columns
};

// What a transform wants decoded: the source pixels of `box` (in full-resolution coordinates), to be resized
// to (out_height, out_width). With dct_scaling, a JPEG is decoded at the smallest libjpeg scale k/8
// (k = 1..8) that still gives at least out_height x out_width pixels over the box: much faster for large
// photos, and pixel values differ slightly from a full decode + resize (as with torchvision's and DALI's
// fast paths). Without it the pixels are those of a full decode (exactly, except that with 4:2:0 chroma,
// skipping into the middle of a 16-row band may move a few pixels of the box's first row by one level).
struct DecodePlan {
  Box box{};                 // the source pixels wanted, in full-resolution coordinates
  int64_t out_height = 0;    // the height the box is resized to
  int64_t out_width = 0;     // the width the box is resized to
  bool dct_scaling = false;  // allow a reduced JPEG scale (see above)
};

// The decoded part of an image for a plan: `image` (h, w, 3) uint8 holds at least the plan's box, which is
// `box` in image's pixel coordinates (scaled by `scale` = k/8 of the source, offset by the rows/columns
// that were not decoded).
struct DecodedRegion {
  Tensor image{};      // (h, w, 3) uint8, holding at least the plan's box
  Box box{};           // the plan's box in image's pixel coordinates
  double scale = 1.0;  // the decode scale, k/8 of the source (1 for a full-scale decode)
};

// PIL's Image.MAX_IMAGE_PIXELS is 89,478,485; PIL refuses images of more than twice that.
inline constexpr int64_t kDefaultMaxImagePixels = 2 * int64_t{89'478'485};

// The largest height x width any decoder accepts (process-wide, thread-safe); std::nullopt: no limit.
std::optional<int64_t> max_image_pixels();
void set_max_image_pixels(std::optional<int64_t> limit);  // kiln::Error for a limit <= 0

// An image file's format, as image_format() finds it.
enum class ImageFormat { Jpeg, Png, Unknown };

// The format from the magic number (not the file name).
ImageFormat image_format(std::span<const uint8_t> bytes);

// The whole file's bytes (a clear error when it cannot be read).
std::vector<uint8_t> read_file_bytes(const std::string& path);

// The JPEG or PNG file at `path`, decoded to (H, W, 3) uint8 RGB.
Tensor read_image(const std::string& path);
// A JPEG or PNG file's bytes decoded to (H, W, 3) uint8 RGB; `name` names it in errors.
Tensor decode_image(std::span<const uint8_t> bytes, const std::string& name);
// What `plan` needs of a JPEG (see DecodePlan); a PNG is decoded whole (scale 1). kiln::Error for a plan whose box
// or output size is not positive.
DecodedRegion decode_image_region(std::span<const uint8_t> bytes, const std::string& name, const DecodePlan& plan);

// Height and width from the header alone (reads the first few KB; validates the magic number and header).
ImageSize image_size(const std::string& path);
ImageSize image_size(std::span<const uint8_t> bytes, const std::string& name);  // from bytes in memory

// The per-format decoders (image_jpeg.cpp, image_png.cpp); decode_image dispatches on the magic number.
namespace detail {
// Throws kiln::Error naming `op`, the file, its claimed size and the limit when height x width exceeds
// max_image_pixels(); called from the header, before any pixel memory is allocated.
void check_image_pixels(int64_t height, int64_t width, const std::string& name, std::string_view op);
// An uninitialised (height, width, 3) uint8 tensor; a failed allocation is rethrown naming the file.
Tensor empty_image(int64_t height, int64_t width, const std::string& name, std::string_view op);
DecodedRegion decode_jpeg(std::span<const uint8_t> bytes, const std::string& name, const DecodePlan* plan);
ImageSize jpeg_size(std::span<const uint8_t> bytes, const std::string& name);
Tensor decode_png(std::span<const uint8_t> bytes, const std::string& name);
ImageSize png_size(std::span<const uint8_t> bytes, const std::string& name);
}  // namespace detail

}  // namespace kiln::data
