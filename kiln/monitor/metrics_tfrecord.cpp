// kiln/monitor/metrics_tfrecord.cpp — CRC-32C (slice-by-8), TFRecord framing and hand-encoded Event protobufs.
#include "kiln/monitor/metrics_tfrecord.h"

#include <array>
#include <bit>

namespace kiln::monitor::tfrecord {
namespace {

// ---------------------------------------------------------------- CRC-32C

// kTables[0] is the usual byte-at-a-time table; kTables[k][b] is the CRC of byte b followed by k zero bytes,
// so 8 input bytes are folded with 8 lookups (slice-by-8).
constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, reflected
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kPolynomial : 0u);
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b)
    for (size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}
constexpr Tables kTables = make_tables();

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
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    // Little-endian loads, whatever the host's byte order (compilers make them single moves on x86).
    uint32_t lo = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
    const uint32_t hi = uint32_t{p[4]} | uint32_t{p[5]} << 8 | uint32_t{p[6]} << 16 | uint32_t{p[7]} << 24;
    lo ^= c;
    c = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^ kTables[4][lo >> 24] ^
        kTables[3][hi & 0xFF] ^ kTables[2][(hi >> 8) & 0xFF] ^ kTables[1][(hi >> 16) & 0xFF] ^ kTables[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFF];
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
