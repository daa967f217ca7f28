// kiln/data/gpu_decode/jpeg_structure.cpp — the marker walk of jpeg_structure.h.
#include "kiln/data/gpu_decode/jpeg_structure.h"

#include <cstring>

namespace kiln::data::gpu {

namespace {

std::string hex(uint8_t v) {
  static const char digits[] = "0123456789ABCDEF";
  return std::string("FF ") + digits[v >> 4] + digits[v & 15];
}

std::string at(const std::string& what, size_t offset) { return what + " at byte " + std::to_string(offset); }

bool is_sof(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }
bool is_rst(uint8_t m) { return m >= 0xD0 && m <= 0xD7; }

// Markers that may stand between a scan's data and the next scan or EOI: DHT, DAC, DQT, DNL, DRI, APPn, COM, JPGn.
bool allowed_between_scans(uint8_t m) {
  return m == 0xC4 || m == 0xCC || m == 0xDB || m == 0xDC || m == 0xDD || (m >= 0xE0 && m <= 0xEF) ||
         (m >= 0xF0 && m <= 0xFE);
}

// The colour space libjpeg-turbo reads from the segments before the frame header (JpegInspection::stores_rgb).
struct ColourMarkers {
  bool jfif = false;
  int adobe_transform = -1;  // none seen

  void note(uint8_t marker, const uint8_t* data, size_t data_length) {
    if (marker == 0xE0 && data_length >= 14 && std::memcmp(data, "JFIF\0", 5) == 0) jfif = true;
    if (marker == 0xEE && data_length >= 12 && std::memcmp(data, "Adobe", 5) == 0) adobe_transform = data[11];
  }

  // For the frame header's data: three components stored as RGB.
  bool rgb(const uint8_t* frame, size_t frame_length) const {
    if (frame_length < 6 + 3 * 3 || frame[5] != 3 || jfif) return false;
    if (adobe_transform >= 0) return adobe_transform == 0;
    return frame[6] == 'R' && frame[9] == 'G' && frame[12] == 'B';
  }
};

std::string walk(std::span<const uint8_t> bytes, bool& stores_rgb) {
  const uint8_t* p = bytes.data();
  const size_t n = bytes.size();
  if (n < 4 || p[0] != 0xFF || p[1] != 0xD8) return "no SOI marker (FF D8) at its start";
  size_t i = 2;
  int frames = 0;
  bool scanned = false;  // a scan's data has been walked
  ColourMarkers colour;
  while (true) {
    // The next marker: FF, any fill bytes FF, then the marker's code.
    if (i >= n) return at("no EOI marker (FF D9): the file ends", n);
    if (p[i] != 0xFF) return at("a byte that is not a marker (" + std::to_string(p[i]) + ") where one belongs", i);
    while (i < n && p[i] == 0xFF) ++i;
    if (i >= n) return at("no EOI marker (FF D9): the file ends", n);
    const uint8_t m = p[i];
    const size_t marker_at = i - 1;
    ++i;
    if (m == 0xD9) {
      if (!scanned) return at("EOI before any scan", marker_at);
      return "";
    }
    if (m == 0x00 || m == 0xD8 || is_rst(m)) return at("a misplaced marker " + hex(m), marker_at);
    if (m == 0x01) continue;  // TEM: no segment
    if (scanned && !(m == 0xDA || allowed_between_scans(m))) {
      return at("a marker " + hex(m) + " after the first scan", marker_at);
    }
    if (i + 2 > n) return at("a marker segment " + hex(m) + " cut off by the end of the file", marker_at);
    const size_t length = static_cast<size_t>(p[i]) << 8 | p[i + 1];
    if (length < 2 || i + length > n) {
      return at("a marker segment " + hex(m) + " whose length (" + std::to_string(length) + ") runs past the file",
                marker_at);
    }
    const uint8_t* data = p + i + 2;
    i += length;
    if (frames == 0) colour.note(m, data, length - 2);
    if (is_sof(m)) {
      if (++frames > 1) return at("a second frame header " + hex(m), marker_at);
      stores_rgb = colour.rgb(data, length - 2);
      continue;
    }
    if (m != 0xDA) continue;
    if (frames == 0) return at("a scan before any frame header", marker_at);
    // The scan's entropy-coded data: up to the first FF that is not stuffing, fill or a restart marker.
    while (true) {
      const void* ff = std::memchr(p + i, 0xFF, n - i);
      if (ff == nullptr) return at("no EOI marker (FF D9): the scan data runs to the end of the file", n);
      i = static_cast<size_t>(static_cast<const uint8_t*>(ff) - p);
      size_t j = i + 1;
      while (j < n && p[j] == 0xFF) ++j;  // fill bytes
      if (j >= n) return at("no EOI marker (FF D9): the file ends", n);
      if (p[j] == 0x00 || is_rst(p[j])) {
        i = j + 1;
        continue;
      }
      break;  // a marker: i is its first FF
    }
    scanned = true;
  }
}

}  // namespace

JpegInspection inspect_jpeg(std::span<const uint8_t> bytes) {
  JpegInspection j;
  j.problem = walk(bytes, j.stores_rgb);
  return j;
}

}  // namespace kiln::data::gpu
