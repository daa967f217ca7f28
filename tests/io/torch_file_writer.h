// tests/io/torch_file_writer.h — an independent writer of torch.save files for the reader's tests: pickle
// bytes built opcode by opcode as PyTorch 2.x emits them for a state dict (protocol 2), and a zip archive of
// stored entries with hand-computed CRC-32s (optionally zip64, optionally "deflated" as deflate stored
// blocks). Shares no code with kiln/io.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "kiln/io/safetensors.h"  // io::NamedTensors
#include "kiln/tensor/tensor.h"

namespace kiln::test_io {

inline uint32_t crc32(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

inline void put_le(std::string& out, uint64_t v, int n) {
  for (int k = 0; k < n; ++k) out.push_back(static_cast<char>((v >> (8 * k)) & 0xFF));
}

// Pickle opcodes, appended one by one.
struct Pickle {
  std::string b;
  uint32_t next_memo = 0;
  Pickle& op(char c) {
    b.push_back(c);
    return *this;
  }
  Pickle& proto() { return op('\x80').op('\x02'); }
  Pickle& stop() { return op('.'); }
  Pickle& mark() { return op('('); }
  Pickle& str(const std::string& s) {  // BINUNICODE
    op('X');
    put_le(b, s.size(), 4);
    b += s;
    return *this;
  }
  Pickle& short_str(const std::string& s) {  // SHORT_BINUNICODE (protocol 4)
    op('\x8c');
    put_le(b, s.size(), 1);
    b += s;
    return *this;
  }
  Pickle& integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');
      put_le(b, static_cast<uint64_t>(v), 1);
    } else if (v >= 0 && v < 65536) {
      op('M');
      put_le(b, static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      put_le(b, static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {  // LONG1 of 8 bytes
      op('\x8a').op('\x08');
      put_le(b, static_cast<uint64_t>(v), 8);
    }
    return *this;
  }
  Pickle& binfloat(double d) {  // big-endian
    op('G');
    uint64_t v;
    std::memcpy(&v, &d, 8);
    for (int k = 7; k >= 0; --k) b.push_back(static_cast<char>((v >> (8 * k)) & 0xFF));
    return *this;
  }
  Pickle& global(const std::string& module, const std::string& name) {
    op('c');
    b += module + "\n" + name + "\n";
    return *this;
  }
  Pickle& put() {  // BINPUT of the next memo slot
    op('q');
    put_le(b, next_memo++, 1);
    return *this;
  }
  Pickle& get(uint32_t k) {
    op('h');
    put_le(b, k, 1);
    return *this;
  }
  Pickle& ints(const std::vector<int64_t>& v) {  // a tuple of ints, as torch writes sizes and strides
    if (v.empty()) return op(')');
    if (v.size() <= 3) {
      for (auto x : v) integer(x);
      return op(static_cast<char>(0x84 + v.size()));
    }
    mark();
    for (auto x : v) integer(x);
    return op('t');
  }
  // _rebuild_tensor_v2((storage pid), offset, size, stride, False, OrderedDict()), REDUCE.
  Pickle& tensor(const std::string& storage_type, const std::string& key, int64_t storage_numel, int64_t offset,
                 const std::vector<int64_t>& size, const std::vector<int64_t>& stride) {
    global("torch._utils", "_rebuild_tensor_v2").put();
    mark();
    mark().str("storage").global("torch", storage_type).str(key).str("cpu").integer(storage_numel).op('t');
    op('Q');
    integer(offset).ints(size).ints(stride).op('\x89');
    global("collections", "OrderedDict").op(')').op('R');
    op('t').op('R');
    return *this;
  }
  Pickle& ordered_dict() { return global("collections", "OrderedDict").op(')').op('R'); }
};

// The bytes of a tensor as torch stores them (contiguous, little-endian).
inline std::string tensor_bytes(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

inline std::string storage_type_of(DType d) {
  switch (d) {
    case DType::Float32: return "FloatStorage";
    case DType::Float64: return "DoubleStorage";
    case DType::Float16: return "HalfStorage";
    case DType::BFloat16: return "BFloat16Storage";
    case DType::Int64: return "LongStorage";
    case DType::Int32: return "IntStorage";
    case DType::UInt8: return "ByteStorage";
    case DType::Bool: return "BoolStorage";
    case DType::Float8_e4m3fn: return "Float8_e4m3fnStorage";
    case DType::Float8_e5m2: return "Float8_e5m2Storage";
  }
  return "?";
}

struct ZipFile {
  struct Entry {
    std::string name, data;
    bool deflate = false;
    std::string compressed;  // a deflate stream made elsewhere (zlib), used as is when set
  };
  std::vector<Entry> entries;
  bool zip64 = false;

  void add(std::string name, std::string data, bool deflate = false) {
    entries.push_back({std::move(name), std::move(data), deflate, {}});
  }
  // Deflate "stored" blocks (BTYPE 00): a valid deflate stream without compression.
  static std::string deflate_stored(const std::string& d) {
    std::string out;
    size_t pos = 0;
    do {
      const size_t n = std::min<size_t>(d.size() - pos, 65535);
      out.push_back(pos + n == d.size() ? '\x01' : '\x00');
      put_le(out, n, 2);
      put_le(out, ~n & 0xFFFF, 2);
      out += d.substr(pos, n);
      pos += n;
    } while (pos < d.size());
    return out;
  }
  std::string bytes() const {
    std::string out, cd;
    for (const auto& e : entries) {
      const std::string payload = !e.compressed.empty() ? e.compressed : e.deflate ? deflate_stored(e.data) : e.data;
      const uint64_t offset = out.size();
      const uint32_t crc = crc32(e.data);
      put_le(out, 0x04034b50, 4);
      put_le(out, zip64 ? 45 : 20, 2);
      put_le(out, 0, 2);
      put_le(out, e.deflate ? 8 : 0, 2);
      put_le(out, 0, 4);  // time, date
      put_le(out, crc, 4);
      put_le(out, zip64 ? 0xFFFFFFFFu : payload.size(), 4);
      put_le(out, zip64 ? 0xFFFFFFFFu : e.data.size(), 4);
      put_le(out, e.name.size(), 2);
      put_le(out, 0, 2);
      out += e.name;
      out += payload;
      std::string extra;
      if (zip64) {  // uncompressed, compressed, offset
        put_le(extra, 1, 2);
        put_le(extra, 24, 2);
        put_le(extra, e.data.size(), 8);
        put_le(extra, payload.size(), 8);
        put_le(extra, offset, 8);
      }
      put_le(cd, 0x02014b50, 4);
      put_le(cd, zip64 ? 45 : 20, 2);
      put_le(cd, zip64 ? 45 : 20, 2);
      put_le(cd, 0, 2);
      put_le(cd, e.deflate ? 8 : 0, 2);
      put_le(cd, 0, 4);
      put_le(cd, crc, 4);
      put_le(cd, zip64 ? 0xFFFFFFFFu : payload.size(), 4);
      put_le(cd, zip64 ? 0xFFFFFFFFu : e.data.size(), 4);
      put_le(cd, e.name.size(), 2);
      put_le(cd, extra.size(), 2);
      put_le(cd, 0, 2);  // comment
      put_le(cd, 0, 2);  // disk
      put_le(cd, 0, 2);
      put_le(cd, 0, 4);
      put_le(cd, zip64 ? 0xFFFFFFFFu : offset, 4);
      cd += e.name + extra;
    }
    const uint64_t cd_offset = out.size();
    out += cd;
    if (zip64) {
      const uint64_t z_offset = out.size();
      put_le(out, 0x06064b50, 4);
      put_le(out, 44, 8);
      put_le(out, 45, 2);
      put_le(out, 45, 2);
      put_le(out, 0, 4);
      put_le(out, 0, 4);
      put_le(out, entries.size(), 8);
      put_le(out, entries.size(), 8);
      put_le(out, cd.size(), 8);
      put_le(out, cd_offset, 8);
      put_le(out, 0x07064b50, 4);
      put_le(out, 0, 4);
      put_le(out, z_offset, 8);
      put_le(out, 1, 4);
    }
    put_le(out, 0x06054b50, 4);
    put_le(out, 0, 2);
    put_le(out, 0, 2);
    put_le(out, zip64 ? 0xFFFF : entries.size(), 2);
    put_le(out, zip64 ? 0xFFFF : entries.size(), 2);
    put_le(out, zip64 ? 0xFFFFFFFFu : cd.size(), 4);
    put_le(out, zip64 ? 0xFFFFFFFFu : cd_offset, 4);
    put_le(out, 0, 2);
    return out;
  }
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A torch.save file of a state dict (an OrderedDict of contiguous tensors, one storage each), as
// torch.save(model.state_dict(), path) writes it.
inline std::string torch_save_bytes(const io::NamedTensors& tensors, const std::string& archive = "archive") {
  Pickle p;
  p.proto().ordered_dict().put().mark();
  ZipFile zip;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i].second;
    std::vector<int64_t> stride(t.shape().size(), 1);
    for (int64_t d = static_cast<int64_t>(t.shape().size()) - 2; d >= 0; --d)
      stride[d] = stride[d + 1] * t.shape()[d + 1];
    p.str(tensors[i].first);
    p.tensor(storage_type_of(t.dtype()), std::to_string(i), t.numel(), 0, t.shape(), stride);
  }
  p.op('u').stop();
  zip.add(archive + "/data.pkl", p.b);
  zip.add(archive + "/byteorder", "little");
  for (size_t i = 0; i < tensors.size(); ++i)
    zip.add(archive + "/data/" + std::to_string(i), tensor_bytes(tensors[i].second));
  zip.add(archive + "/version", "3\n");
  return zip.bytes();
}

}  // namespace kiln::test_io
