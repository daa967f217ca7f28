// kiln/monitor/metrics_tfrecord.h — the bytes of a TensorBoard event file, for TensorBoardWriter (metrics.h)
// and for tests: CRC-32C (ISA-L's), TFRecord framing, and the few Event protobufs a scalar log needs, encoded by
// hand.
//
//   std::string file = tfrecord::frame(tfrecord::file_version_event(now));
//   file += tfrecord::frame(tfrecord::scalars_event(now, 100, {{"loss", 0.25}}));
//
// A TFRecord is: uint64 length (little-endian), uint32 masked_crc32c(length bytes), the data, uint32
// masked_crc32c(data); masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
// The messages (tensorflow/core/util/event.proto, summary.proto), with their field numbers and wire types:
//   Event      { double wall_time = 1;  int64 step = 2;  string file_version = 3;  Summary summary = 5;
//                SessionLog session_log = 7; }          (6 is the deprecated LogMessage: not session_log)
//   Summary    { repeated Value value = 1; }      Value { string tag = 1;  float simple_value = 2; }
//   SessionLog { SessionStatus status = 1; }      SessionStatus: START = 1
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/monitor/metrics.h"  // Scalars

namespace kiln::monitor::tfrecord {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), computed by ISA-L (crc32_iscsi); crc32c("123456789") ==
// 0xE3069283. `crc` continues the CRC of earlier bytes: crc32c(b, crc32c(a)) == crc32c(a + b).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view s) { return crc32c(s.data(), s.size()); }
inline uint32_t masked_crc32c(std::string_view s) {
  const uint32_t c = crc32c(s);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// `data` framed as one TFRecord (16 bytes more than data).
std::string frame(std::string_view data);

// The first event of every file: its wall time and file_version "brain.Event:2".
std::string file_version_event(double wall_time);
// SessionLog START at `step`: readers drop the folder's earlier points at steps >= step.
std::string session_start_event(double wall_time, int64_t step);
// One event holding a simple_value (float32) per scalar.
std::string scalars_event(double wall_time, int64_t step, const Scalars& values);

}  // namespace kiln::monitor::tfrecord
