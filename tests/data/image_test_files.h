// tests/data/image_test_files.h — small JPEG and PNG files written by the tests themselves (libjpeg, libpng);
// they go to disk through support/temp_folder.h (TempFolder, write_bytes).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "support/temp_folder.h"

namespace kiln::testing {

struct JpegOptions {
  int quality = 100;
  bool subsample = false;      // 4:2:0 chroma instead of 4:4:4
  int luma_h = 0, luma_v = 0;  // else, when set: luma's sampling factors over chroma's (2, 1: 4:2:2; 1, 2: 4:4:0)
  bool progressive = false;
  int extra_app_bytes = 0;  // APP15 segments of this many bytes in total before the frame header
  int restart_rows = 0;     // a restart marker (FF D0..D7) every this many MCU rows (0: none)
  bool rgb_coded = false;   // 3 channels stored as RGB (Adobe marker, transform 0; ids 'R', 'G', 'B'), not YCbCr
};
// pixels: (h, w, channels) row-major; channels 1 (grayscale JPEG), 3 (RGB -> YCbCr) or 4 (CMYK, stored as is).
std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& pixels, int h, int w, int channels, JpegOptions o = {});

struct PngOptions {
  int color_type = 2;  // PNG color type: 0 gray, 2 RGB, 3 palette, 4 gray+alpha, 6 RGBA
  int bit_depth = 8;   // 1, 2, 4, 8 or 16
  bool interlace = false;
  std::vector<uint8_t> palette;  // RGB triples, for color type 3
};
// samples: one value per sample in row-major order (16-bit values as uint16 in `samples16`).
std::vector<uint8_t> encode_png(const std::vector<uint16_t>& samples, int h, int w, PngOptions o);

// A smooth (h, w, 3) color image (JPEG-friendly), and a random one.
std::vector<uint8_t> smooth_image(int h, int w, int seed = 0);
std::vector<uint8_t> random_image(int h, int w, int channels, uint64_t seed = 1);
// The first channel of an (h, w, 3) image, as an (h, w) grayscale one.
std::vector<uint8_t> first_channel(const std::vector<uint8_t>& rgb);

}  // namespace kiln::testing
