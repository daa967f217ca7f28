// kiln/monitor/metrics_tfrecord.cpp — TFRecord framing (its CRC-32C from ISA-L) and hand-encoded Event protobufs.
#include "kiln/monitor/metrics_tfrecord.h"

#include <isa-l/crc.h>  // crc32_iscsi: CRC-32C (Castagnoli), with the CPU's CRC instructions where there are some

#include <algorithm>
#include <bit>

namespace kiln::monitor::tfrecord {
namespace {

// ---------------------------------------------------------------- protobuf wire format

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }
template <typename T>
void put_little_endian(std::string& out, T v) {  // T: uint32_t or uint64_t
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event fields 1 and 2, which every event here starts with.
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, kFixed64);
  put_little_endian(e, std::bit_cast<uint64_t>(wall_time));
  if (step != 0) {  // proto3: a default value is not written
    put_key(e, 2, kVarint);
    put_varint(e, static_cast<uint64_t>(step));  // int64: two's complement, 10 bytes when negative
  }
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  // ISA-L's crc32_iscsi neither inverts its start value nor its result (the iSCSI convention leaves both to the
  // caller), and takes an int length: the standard CRC-32C is ~crc32_iscsi(data, n, ~crc), a piece at a time.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));  // crc32_iscsi only reads the buffer
  uint32_t c = ~crc;
  constexpr size_t kPiece = size_t{1} << 30;
  while (size > 0) {
    const size_t n = std::min(size, kPiece);
    c = crc32_iscsi(p, static_cast<int>(n), c);
    p += n;
    size -= n;
  }
  return ~c;
}

std::string frame(std::string_view data) {
  std::string length;
  put_little_endian(length, static_cast<uint64_t>(data.size()));
  std::string out = length;
  put_little_endian(out, masked_crc32c(length));
  out.append(data);
  put_little_endian(out, masked_crc32c(data));
  return out;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string session_log;
  put_key(session_log, 1, kVarint);
  put_varint(session_log, 1);  // SessionLog.START
  std::string e = event_head(wall_time, step);
  put_bytes(e, 7, session_log);  // Event.session_log
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const Scalars& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    put_bytes(value, 1, tag);
    put_key(value, 2, kFixed32);
    put_little_endian(value, std::bit_cast<uint32_t>(static_cast<float>(v)));
    put_bytes(summary, 1, value);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

}  // namespace kiln::monitor::tfrecord
