// kiln/data/image_png.cpp — PNG decoding through libpng: palette, gray, 16-bit, alpha and interlaced images
// all come out as (H, W, 3) uint8 RGB.
//
// libpng reports errors through a function that must not return: ours longjmps back (png_jmpbuf) into the
// phase that called libpng (functions holding no C++ objects with destructors), and the caller throws.
#include <cstring>
#include <vector>

#include "kiln/data/image.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

#include <png.h>

namespace kiln::data::detail {

namespace {

struct Decoder {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  char message[256] = {};
  png_uint_32 width = 0, height = 0;
  ~Decoder() {
    if (png != nullptr) png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
  }
};

void on_error(png_structp png, png_const_charp msg) {
  auto* d = static_cast<Decoder*>(png_get_error_ptr(png));
  std::snprintf(d->message, sizeof(d->message), "%s", msg);
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}  // libpng recovers; the pixels are what matters

void read_fn(png_structp png, png_bytep out, png_size_t n) {
  auto* d = static_cast<Decoder*>(png_get_io_ptr(png));
  if (d->size - d->pos < n) png_error(png, "unexpected end of file (truncated)");
  std::memcpy(out, d->data + d->pos, n);
  d->pos += n;
}

// Phase 1: header and the transforms to 8-bit RGB.
bool read_header(Decoder& d) {
  if (setjmp(png_jmpbuf(d.png))) return false;
  png_set_read_fn(d.png, &d, read_fn);
  png_read_info(d.png, d.info);
  const int color = png_get_color_type(d.png, d.info);
  const int depth = png_get_bit_depth(d.png, d.info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(d.png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(d.png);
  if (depth == 16) png_set_scale_16(d.png);  // rounds v * 255 / 65535, as PIL
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(d.png);
  if ((color & PNG_COLOR_MASK_ALPHA) != 0) png_set_strip_alpha(d.png);
  png_set_interlace_handling(d.png);
  png_read_update_info(d.png, d.info);
  d.width = png_get_image_width(d.png, d.info);
  d.height = png_get_image_height(d.png, d.info);
  if (png_get_rowbytes(d.png, d.info) != static_cast<size_t>(d.width) * 3) png_error(d.png, "unexpected row layout");
  return true;
}

// Phase 2: every row (all passes of an interlaced image).
bool read_pixels(Decoder& d, png_bytepp rows) {
  if (setjmp(png_jmpbuf(d.png))) return false;
  png_read_image(d.png, rows);
  return true;
}

[[noreturn]] void fail(const Decoder& d, const std::string& name) {
  KILN_FAIL("decode_png: '", name, "' cannot be decoded: ", d.message,
            " (the file is corrupt, truncated or not a PNG; re-encode or remove it)");
}

uint32_t big_endian(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

ImageSize png_size(std::span<const uint8_t> bytes, const std::string& name) {
  // Signature (8), IHDR length (4), "IHDR" (4), width (4), height (4), ...
  KILN_CHECK(bytes.size() >= 33 && std::memcmp(bytes.data() + 12, "IHDR", 4) == 0, "image_size: '", name,
             "' is not a valid PNG: its header (IHDR chunk) is missing or truncated");
  const uint32_t width = big_endian(bytes.data() + 16), height = big_endian(bytes.data() + 20);
  KILN_CHECK(width > 0 && height > 0 && width < (1u << 31) && height < (1u << 31), "image_size: '", name,
             "' is not a valid PNG: its header says ", width, " x ", height, " pixels");
  check_image_pixels(height, width, name, "image_size");
  return {static_cast<int64_t>(height), static_cast<int64_t>(width)};
}

Tensor decode_png(std::span<const uint8_t> bytes, const std::string& name) {
  Decoder d;
  d.data = bytes.data(), d.size = bytes.size();
  d.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &d, on_error, on_warning);
  KILN_CHECK(d.png != nullptr, "decode_png: '", name, "': libpng could not start (out of memory?)");
  d.info = png_create_info_struct(d.png);
  KILN_CHECK(d.info != nullptr, "decode_png: '", name, "': libpng could not start (out of memory?)");
  if (!read_header(d)) fail(d, name);
  // From the header, before the pixels are allocated (libpng has read only IHDR and the chunks before IDAT).
  check_image_pixels(d.height, d.width, name, "decode_png");
  Tensor out = empty_image(d.height, d.width, name, "decode_png");
  std::vector<png_bytep> rows(d.height);
  for (png_uint_32 y = 0; y < d.height; ++y) rows[y] = out.data_ptr<uint8_t>() + size_t{y} * d.width * 3;
  if (!read_pixels(d, rows.data())) fail(d, name);
  return out;
}

}  // namespace kiln::data::detail
