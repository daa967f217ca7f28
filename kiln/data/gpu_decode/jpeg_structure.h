// kiln/data/gpu_decode/jpeg_structure.h — a walk over a JPEG file's markers, before it goes to a GPU decoder.
//
//   gpu::JpegInspection j = gpu::inspect_jpeg(bytes);  // j.problem empty: sound; j.stores_rgb: not YCbCr
//
// What nvJPEG makes of a damaged file is its own affair (the JPEG engines' batched call reports one status for the
// whole batch, not one per image), and it need not be what kiln's CPU decoding makes of it. So every JPEG is walked
// first, and one whose structure is broken goes to libjpeg-turbo instead, which decodes it or names the file in its
// error, exactly as with Decode::Cpu: the same file gives the same result on either path. Sound means:
//   - SOI first; every marker segment's length fits in the file;
//   - exactly one frame header (SOF) before the first scan, and none after it;
//   - each scan's entropy-coded data holds only stuffed bytes (FF 00), fill bytes (FF FF) and restart markers
//     (FF D0..D7), and ends at a marker that may follow a scan (tables, restart interval, comment, application
//     data, DNL, another scan, or EOI);
//   - the walk reaches EOI (bytes after EOI are allowed, as libjpeg-turbo allows them).
// Damage inside the entropy-coded data that keeps this structure (flipped bits) is not found here; libjpeg-turbo
// recovers from most of that too.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kiln::data::gpu {

// What one walk over a JPEG file's markers finds.
struct JpegInspection {
  std::string problem;  // what is wrong with its marker structure, or empty when it is sound
  // Whether a three-component JPEG stores RGB instead of YCbCr, by libjpeg-turbo's rule (what kiln's CPU decoding
  // follows): a JFIF marker means YCbCr; else an Adobe marker means RGB for its transform 0 and YCbCr otherwise;
  // else the component ids 'R', 'G', 'B' mean RGB; else YCbCr. nvJPEG's output assumes YCbCr, so such a file is
  // decoded on the CPU. False for other component counts, and where the headers up to the frame header cannot be
  // read.
  bool stores_rgb = false;
};
JpegInspection inspect_jpeg(std::span<const uint8_t> bytes);

}  // namespace kiln::data::gpu
