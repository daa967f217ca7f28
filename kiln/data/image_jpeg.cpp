// kiln/data/image_jpeg.cpp — JPEG decoding through libjpeg-turbo's jpeglib.h API, whole or planned (only the
// rows and columns a crop needs, at a reduced DCT scale when allowed).
//
// libjpeg reports errors through error_exit, which must not return: ours longjmps back into the phase that
// called libjpeg (functions holding no C++ objects with destructors), and the caller throws kiln::Error.
#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kiln/data/image.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

// jerror.h after jpeglib.h: its message codes depend on JPEG_LIB_VERSION (jconfig.h, which jpeglib.h includes).
// Included first, it numbers them as libjpeg 6.2 does; against a libjpeg 8 library (Ubuntu's) the codes are off by
// up to three, so a recoverable "premature end of data segment" read as a truncated file, and a truncated file
// passed as gray rows.
#include <jerror.h>
#if !defined(JPEG_LIB_VERSION)
#error "jpeglib.h must define JPEG_LIB_VERSION before jerror.h is read"
#endif

namespace kiln::data::detail {

namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are ignored (libjpeg recovers from most corrupt data), except running out of data: libjpeg
// would fill the rest of a truncated file with gray, and a truncated file is an error.
void on_message(j_common_ptr cinfo, int level) {
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) on_error(cinfo);
}

struct Decoder {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  bool created = false;
  std::vector<uint8_t> row;  // one output row, when rows are not decoded straight into the tensor
  Decoder() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.message[0] = 0;
  }
  ~Decoder() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;
};

// The geometry of one decode: scaled output rows [y0, y1) and columns [x0, x1).
struct Window {
  int scale_num = 8;
  JDIMENSION y0 = 0, y1 = 0, x0 = 0, x1 = 0;
  JDIMENSION crop_x = 0, crop_width = 0;  // what jpeg_crop_scanline decodes (widened to iMCU boundaries)
  bool cmyk = false;
};

[[noreturn]] void fail(const Decoder& d, const std::string& name, const char* what) {
  KILN_FAIL("decode_jpeg: '", name, "' ", what, ": ", d.err.message,
            " (the file is corrupt, truncated or not a JPEG; re-encode or remove it)");
}

// Phase 1: the header. No C++ objects with destructors live in this frame (longjmp target).
bool read_header(Decoder& d, const uint8_t* data, size_t size) {
  if (setjmp(d.err.jump)) return false;
  jpeg_create_decompress(&d.cinfo);
  d.created = true;
  jpeg_mem_src(&d.cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&d.cinfo, TRUE);
  return true;
}

// Phase 2: output parameters, start, crop and skip to the first row.
bool start(Decoder& d, Window& w, const DecodePlan* plan) {
  if (setjmp(d.err.jump)) return false;
  jpeg_decompress_struct& c = d.cinfo;
  w.cmyk = c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
  c.out_color_space = w.cmyk ? JCS_CMYK : JCS_RGB;  // libjpeg-turbo converts grayscale to RGB itself
  c.dct_method = JDCT_ISLOW;
  if (plan != nullptr && plan->dct_scaling) {
    // The smallest k/8 that keeps at least the output resolution over the box.
    for (int k = 1; k <= 8; ++k) {
      if (plan->box.height * k / 8.0 >= static_cast<double>(plan->out_height) &&
          plan->box.width * k / 8.0 >= static_cast<double>(plan->out_width)) {
        w.scale_num = k;
        break;
      }
    }
  }
  c.scale_num = static_cast<unsigned>(w.scale_num);
  c.scale_denom = 8;
  jpeg_start_decompress(&c);
  const double s = w.scale_num / 8.0;
  w.y0 = 0, w.y1 = c.output_height, w.x0 = 0, w.x1 = c.output_width;
  if (plan != nullptr) {
    auto clamp = [](double v, JDIMENSION hi) {
      return static_cast<JDIMENSION>(std::clamp(v, 0.0, static_cast<double>(hi)));
    };
    w.y0 = clamp(std::floor(plan->box.top * s), c.output_height);
    w.y1 = std::max(w.y0 + 1, clamp(std::ceil((plan->box.top + plan->box.height) * s), c.output_height));
    w.x0 = clamp(std::floor(plan->box.left * s), c.output_width);
    w.x1 = std::max(w.x0 + 1, clamp(std::ceil((plan->box.left + plan->box.width) * s), c.output_width));
    w.y1 = std::min(w.y1, static_cast<JDIMENSION>(c.output_height));
    w.x1 = std::min(w.x1, static_cast<JDIMENSION>(c.output_width));
    w.y0 = std::min(w.y0, w.y1 - 1);
    w.x0 = std::min(w.x0, w.x1 - 1);
  }
  w.crop_x = w.x0;
  w.crop_width = w.x1 - w.x0;
  if (w.crop_width < c.output_width) jpeg_crop_scanline(&c, &w.crop_x, &w.crop_width);  // widens to iMCUs
  else w.crop_x = 0, w.crop_width = c.output_width;
  if (w.y0 > 0) jpeg_skip_scanlines(&c, w.y0);
  return true;
}

// Phase 3: rows [y0, y1) into `out` (h, w, 3).
bool read_rows(Decoder& d, const Window& w, uint8_t* out) {
  if (setjmp(d.err.jump)) return false;
  jpeg_decompress_struct& c = d.cinfo;
  const size_t width = w.x1 - w.x0;
  const size_t skip = w.x0 - w.crop_x;  // columns decoded left of the box
  const bool direct = !w.cmyk && skip == 0 && width == w.crop_width;
  for (JDIMENSION y = w.y0; y < w.y1; ++y) {
    uint8_t* dst = out + (y - w.y0) * width * 3;
    JSAMPROW row = direct ? dst : d.row.data();
    if (jpeg_read_scanlines(&c, &row, 1) != 1) {
      std::snprintf(d.err.message, sizeof(d.err.message), "no data for row %u", static_cast<unsigned>(y));
      return false;
    }
    if (direct) continue;
    if (!w.cmyk) {
      std::memcpy(dst, d.row.data() + skip * 3, width * 3);
      continue;
    }
    // CMYK as Adobe writes it (inverted): r = c * k / 255, as PIL and torchvision.
    const uint8_t* src = d.row.data() + skip * 4;
    for (size_t x = 0; x < width; ++x, src += 4, dst += 3) {
      const unsigned k = src[3];
      for (int ch = 0; ch < 3; ++ch) dst[ch] = static_cast<uint8_t>((src[ch] * k + 127) / 255);
    }
  }
  return true;
}

}  // namespace

ImageSize jpeg_size(std::span<const uint8_t> bytes, const std::string& name) {
  Decoder d;
  if (!read_header(d, bytes.data(), bytes.size())) fail(d, name, "has a bad header");
  const auto h = static_cast<int64_t>(d.cinfo.image_height), w = static_cast<int64_t>(d.cinfo.image_width);
  check_image_pixels(h, w, name, "image_size");
  return {h, w};
}

DecodedRegion decode_jpeg(std::span<const uint8_t> bytes, const std::string& name, const DecodePlan* plan) {
  Decoder d;
  if (!read_header(d, bytes.data(), bytes.size())) fail(d, name, "has a bad header");
  // From the header, before libjpeg allocates its buffers and before the tensor: a decompression bomb (a tiny
  // file claiming 60000 x 60000) is refused here. A planned decode still refuses the whole image's size.
  check_image_pixels(static_cast<int64_t>(d.cinfo.image_height), static_cast<int64_t>(d.cinfo.image_width), name,
                     "decode_jpeg");
  Window w;
  if (!start(d, w, plan)) fail(d, name, "cannot be decoded");
  d.row.resize(static_cast<size_t>(w.crop_width) * (w.cmyk ? 4 : 3));
  const auto h = static_cast<int64_t>(w.y1 - w.y0), width = static_cast<int64_t>(w.x1 - w.x0);
  Tensor out = empty_image(h, width, name, "decode_jpeg");
  if (!read_rows(d, w, out.data_ptr<uint8_t>())) fail(d, name, "cannot be decoded");
  DecodedRegion r{out, {0, 0, static_cast<double>(h), static_cast<double>(width)}, w.scale_num / 8.0};
  if (plan != nullptr) {
    r.box = {plan->box.top * r.scale - w.y0, plan->box.left * r.scale - w.x0, plan->box.height * r.scale,
             plan->box.width * r.scale};
  }
  return r;
}

}  // namespace kiln::data::detail
