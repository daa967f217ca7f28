// tests/data/test_image_files.cpp — the test JPEG/PNG writers of image_test_files.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>

#include "image_test_files.h"

#include <jpeglib.h>
#include <png.h>

namespace kiln::testing {

std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& pixels, int h, int w, int channels, JpegOptions o) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);  // the writer's inputs are the test's own: libjpeg's exit() is acceptable here
  jpeg_create_compress(&c);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buffer, &size);
  c.image_width = static_cast<JDIMENSION>(w);
  c.image_height = static_cast<JDIMENSION>(h);
  c.input_components = channels;
  c.in_color_space = channels == 1 ? JCS_GRAYSCALE : channels == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, o.quality, TRUE);
  if (channels == 3 && o.rgb_coded) jpeg_set_colorspace(&c, JCS_RGB);
  if (channels == 3) {
    const bool factors = o.luma_h > 0 && o.luma_v > 0;
    c.comp_info[0].h_samp_factor = factors ? o.luma_h : o.subsample ? 2 : 1;
    c.comp_info[0].v_samp_factor = factors ? o.luma_v : o.subsample ? 2 : 1;
    for (int i = 1; i < 3; ++i) c.comp_info[i].h_samp_factor = c.comp_info[i].v_samp_factor = 1;
  }
  if (o.progressive) jpeg_simple_progression(&c);
  c.restart_in_rows = o.restart_rows;
  jpeg_start_compress(&c, TRUE);
  for (int left = o.extra_app_bytes; left > 0; left -= 60000) {
    std::vector<uint8_t> junk(static_cast<size_t>(std::min(left, 60000)), 0x5A);
    jpeg_write_marker(&c, JPEG_APP0 + 15, junk.data(), static_cast<unsigned>(junk.size()));
  }
  while (c.next_scanline < c.image_height) {
    auto* row = const_cast<JSAMPROW>(pixels.data() + static_cast<size_t>(c.next_scanline) * w * channels);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::vector<uint8_t> out(buffer, buffer + size);
  std::free(buffer);
  return out;
}

namespace {
void png_write_fn(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}
void png_flush_fn(png_structp) {}
}  // namespace

std::vector<uint8_t> encode_png(const std::vector<uint16_t>& samples, int h, int w, PngOptions o) {
  const int per_pixel = o.color_type == 0 || o.color_type == 3 ? 1 : o.color_type == 4 ? 2 : o.color_type == 2 ? 3 : 4;
  std::vector<uint8_t> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) throw std::runtime_error("png write failed");
  png_set_write_fn(png, &out, png_write_fn, png_flush_fn);
  png_set_IHDR(png, info, static_cast<png_uint_32>(w), static_cast<png_uint_32>(h), o.bit_depth, o.color_type,
               o.interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> palette;
  for (size_t i = 0; i + 2 < o.palette.size(); i += 3)
    palette.push_back({o.palette[i], o.palette[i + 1], o.palette[i + 2]});
  if (o.color_type == 3) png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  png_write_info(png, info);
  // Pack each row: sub-byte depths MSB first, 16-bit big-endian.
  const size_t row_samples = static_cast<size_t>(w) * per_pixel;
  const size_t row_bytes = (row_samples * o.bit_depth + 7) / 8;
  std::vector<std::vector<uint8_t>> rows(h, std::vector<uint8_t>(row_bytes, 0));
  for (int y = 0; y < h; ++y) {
    for (size_t i = 0; i < row_samples; ++i) {
      const uint16_t v = samples[y * row_samples + i];
      if (o.bit_depth == 16) {
        rows[y][2 * i] = static_cast<uint8_t>(v >> 8), rows[y][2 * i + 1] = static_cast<uint8_t>(v & 0xFF);
      } else if (o.bit_depth == 8) {
        rows[y][i] = static_cast<uint8_t>(v);
      } else {
        const size_t bit = i * o.bit_depth;
        rows[y][bit / 8] |= static_cast<uint8_t>(v << (8 - o.bit_depth - bit % 8));
      }
    }
  }
  std::vector<png_bytep> ptrs;
  for (auto& r : rows) ptrs.push_back(r.data());
  png_write_image(png, ptrs.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

std::vector<uint8_t> smooth_image(int h, int w, int seed) {
  std::vector<uint8_t> p(static_cast<size_t>(h) * w * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        const double v = 128 + 60 * std::sin(0.11 * x + 0.07 * y + c + seed) + 40 * std::cos(0.05 * (x - y) * (c + 1));
        p[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 255.0)));
      }
  return p;
}

std::vector<uint8_t> first_channel(const std::vector<uint8_t>& rgb) {
  std::vector<uint8_t> gray(rgb.size() / 3);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = rgb[3 * i];
  return gray;
}

std::vector<uint8_t> random_image(int h, int w, int channels, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<uint8_t> p(static_cast<size_t>(h) * w * channels);
  for (auto& v : p) v = static_cast<uint8_t>(gen() & 0xFF);
  return p;
}

}  // namespace kiln::testing
