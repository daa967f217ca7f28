// kiln/io/zip_reader.cpp — the end of central directory (and its zip64 form), the central directory, local
// headers, and stored / deflated data with its CRC-32 checked.
#include "kiln/io/zip_reader.h"

#include <zlib.h>  // inflate (raw deflate), crc32

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>  // std::bad_alloc

#include "kiln/tensor/error.h"

namespace kiln::io {
namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint64_t kEndSize = 22, kZip64LocatorSize = 20, kZip64EndSize = 56;
constexpr uint64_t kCentralHeaderSize = 46, kLocalHeaderSize = 30;
constexpr uint64_t kMaxComment = 65535;

uint16_t le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t le32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t le64(const unsigned char* p) { return le32(p) | (static_cast<uint64_t>(le32(p + 4)) << 32); }

// Reads [offset, offset + n) of the file, checked against its length.
void read_at(std::ifstream& in, const std::string& path, uint64_t file_size, uint64_t offset, void* out, uint64_t n,
             const char* what) {
  KILN_CHECK(offset <= file_size && n <= file_size - offset, path, ": truncated or corrupt zip archive: the ", what,
             " (bytes ", offset, "..", offset + n, ") lies beyond the end of the file (", file_size,
             " bytes); the file is incomplete, download or save it again");
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
  KILN_CHECK(in.good() || (in.eof() && static_cast<uint64_t>(in.gcount()) == n), path, ": reading the ", what,
             " failed");
}

std::ifstream open_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.is_open(), path, ": cannot open the file (missing, or not readable)");
  return in;
}

}  // namespace

ZipReader::ZipReader(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  KILN_CHECK(std::filesystem::is_regular_file(path_, ec), path_, ": no such file");
  file_size_ = std::filesystem::file_size(path_, ec);
  KILN_CHECK(!ec, path_, ": cannot read the file's size: ", ec.message());
  std::ifstream in = open_file(path_);
  KILN_CHECK(file_size_ >= kEndSize, path_, ": not a zip archive (", file_size_,
             " bytes, too short for one); the file is truncated or of another format");

  // The end-of-central-directory record sits in the last 22 + up to 65535 (comment) bytes.
  const uint64_t tail_len = std::min<uint64_t>(file_size_, kEndSize + kMaxComment);
  std::vector<unsigned char> tail(tail_len);
  read_at(in, path_, file_size_, file_size_ - tail_len, tail.data(), tail_len, "end of the archive");
  int64_t end_pos = -1;  // within tail
  for (int64_t i = static_cast<int64_t>(tail_len - kEndSize); i >= 0; --i) {
    if (le32(&tail[i]) == kEndSig && i + kEndSize + le16(&tail[i + 20]) == tail_len) {
      end_pos = i;
      break;
    }
  }
  KILN_CHECK(end_pos >= 0, path_,
             ": not a zip archive (no end-of-central-directory record); the file is truncated or of another format");
  const unsigned char* end = &tail[end_pos];
  const uint64_t end_offset = file_size_ - tail_len + static_cast<uint64_t>(end_pos);
  uint64_t num_entries = le16(end + 10);
  uint64_t cd_size = le32(end + 12);
  uint64_t cd_offset = le32(end + 16);
  KILN_CHECK(le16(end + 4) == 0 && le16(end + 6) == 0 && le16(end + 8) == le16(end + 10), path_,
             ": multi-disk zip archives are not supported");

  // zip64: a locator just before the record points at the zip64 end record, which has the 64-bit values.
  if (end_offset >= kZip64LocatorSize) {
    unsigned char loc[kZip64LocatorSize];
    read_at(in, path_, file_size_, end_offset - kZip64LocatorSize, loc, kZip64LocatorSize, "zip64 locator");
    if (le32(loc) == kZip64LocatorSig) {
      const uint64_t z_offset = le64(loc + 8);
      unsigned char z[kZip64EndSize];
      read_at(in, path_, file_size_, z_offset, z, kZip64EndSize, "zip64 end of central directory");
      KILN_CHECK(le32(z) == kZip64EndSig, path_, ": corrupt zip64 archive: no zip64 end record at offset ", z_offset);
      num_entries = le64(z + 32);
      cd_size = le64(z + 40);
      cd_offset = le64(z + 48);
    }
  }
  KILN_CHECK(cd_offset <= file_size_ && cd_size <= file_size_ - cd_offset && cd_offset + cd_size <= end_offset, path_,
             ": corrupt zip archive: the central directory (offset ", cd_offset, ", ", cd_size,
             " bytes) does not lie within the file (", file_size_, " bytes)");
  KILN_CHECK(num_entries <= cd_size / kCentralHeaderSize, path_, ": corrupt zip archive: ", num_entries,
             " entries cannot fit in a central directory of ", cd_size, " bytes");

  std::vector<unsigned char> cd(cd_size);
  read_at(in, path_, file_size_, cd_offset, cd.data(), cd_size, "central directory");
  uint64_t pos = 0;
  entries_.reserve(num_entries);
  for (uint64_t i = 0; i < num_entries; ++i) {
    KILN_CHECK(pos + kCentralHeaderSize <= cd_size && le32(&cd[pos]) == kCentralHeaderSig, path_,
               ": corrupt zip archive: central directory entry ", i, " is damaged");
    const unsigned char* h = &cd[pos];
    ZipEntry e;
    const uint16_t flags = le16(h + 8);
    e.method = le16(h + 10);
    e.crc32 = le32(h + 16);
    e.compressed_size = le32(h + 20);
    e.size = le32(h + 24);
    const uint64_t name_len = le16(h + 28), extra_len = le16(h + 30), comment_len = le16(h + 32);
    e.header_offset = le32(h + 42);
    KILN_CHECK(pos + kCentralHeaderSize + name_len + extra_len + comment_len <= cd_size, path_,
               ": corrupt zip archive: central directory entry ", i, " runs past the directory's end");
    e.name.assign(reinterpret_cast<const char*>(h + kCentralHeaderSize), name_len);
    // zip64 extra field (id 1): the 64-bit values of whichever fields read 0xFFFFFFFF, in this order.
    const unsigned char* x = h + kCentralHeaderSize + name_len;
    for (uint64_t xp = 0; xp + 4 <= extra_len;) {
      const uint16_t id = le16(x + xp), len = le16(x + xp + 2);
      KILN_CHECK(xp + 4 + len <= extra_len, path_, ": corrupt zip archive: bad extra field in entry '", e.name, "'");
      if (id == 1) {
        uint64_t q = xp + 4;
        auto take = [&](uint64_t& field) {
          if (field != 0xFFFFFFFFu) return;
          KILN_CHECK(q + 8 <= xp + 4 + len, path_, ": corrupt zip64 extra field in entry '", e.name, "'");
          field = le64(x + q);
          q += 8;
        };
        take(e.size);
        take(e.compressed_size);
        take(e.header_offset);
      }
      xp += 4 + len;
    }
    KILN_CHECK((flags & 1) == 0, path_, ": entry '", e.name, "' is encrypted, which kiln does not read");
    KILN_CHECK(e.method == 0 || e.method == 8, path_, ": entry '", e.name, "' uses compression method ", e.method,
               "; kiln reads stored (0) and deflated (8) entries only");
    KILN_CHECK(e.header_offset <= file_size_ && e.compressed_size <= file_size_ - e.header_offset, path_,
               ": corrupt zip archive: entry '", e.name, "' (offset ", e.header_offset, ", ", e.compressed_size,
               " bytes) lies beyond the end of the file (", file_size_, " bytes); the file is truncated");
    KILN_CHECK(e.method != 0 || e.size == e.compressed_size, path_, ": corrupt zip archive: stored entry '", e.name,
               "' has different compressed and uncompressed sizes");
    // Deflate expands at most 1032:1 (258 bytes from a 2-bit code, plus block headers): an entry that claims
    // more is corrupt or hostile, and is refused before anything is allocated for it.
    KILN_CHECK(e.method != 8 || e.size / 1032 <= e.compressed_size + 64, path_,
               ": corrupt zip archive: deflated entry '", e.name, "' claims ", e.size, " bytes from ",
               e.compressed_size, " compressed bytes, more than deflate can produce");
    KILN_CHECK(index_.emplace(e.name, entries_.size()).second, path_, ": zip archive has two entries named '", e.name,
               "'");
    entries_.push_back(std::move(e));
    pos += kCentralHeaderSize + name_len + extra_len + comment_len;
  }
}

const ZipEntry& ZipReader::entry(const std::string& name) const {
  auto it = index_.find(name);
  KILN_CHECK(it != index_.end(), path_, ": the archive has no entry '", name, "'");
  return entries_[it->second];
}

std::string ZipReader::read(const std::string& name) const {
  const ZipEntry& e = entry(name);
  KILN_CHECK(e.size <= static_cast<uint64_t>(std::numeric_limits<std::streamsize>::max()), path_, ": entry '", name,
             "' is too large");
  std::string out;
  try {
    out.assign(e.size, '\0');
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError(detail::str_cat(path_, ": out of host memory for entry '", name, "' (", e.size, " bytes)"));
  }
  read_into(e, out.data(), out.size());
  return out;
}

void ZipReader::read_into(const ZipEntry& e, void* out, uint64_t out_size) const {
  KILN_CHECK(out_size == e.size, path_, ": entry '", e.name, "' holds ", e.size, " bytes, not the ", out_size,
             " expected");
  std::ifstream in = open_file(path_);
  unsigned char local[kLocalHeaderSize];
  read_at(in, path_, file_size_, e.header_offset, local, kLocalHeaderSize, "local header of an entry");
  KILN_CHECK(le32(local) == kLocalHeaderSig, path_, ": corrupt zip archive: no local header for entry '", e.name,
             "' at offset ", e.header_offset);
  const uint64_t data_offset = e.header_offset + kLocalHeaderSize + le16(local + 26) + le16(local + 28);
  KILN_CHECK(data_offset <= file_size_ && e.compressed_size <= file_size_ - data_offset, path_,
             ": truncated zip archive: the data of entry '", e.name, "' (", e.compressed_size, " bytes at offset ",
             data_offset, ") runs past the end of the file (", file_size_, " bytes); save or download it again");
  uLong crc = crc32(0L, Z_NULL, 0);
  constexpr uint64_t kChunk = 1u << 20;  // zlib takes 32-bit lengths
  if (e.method == 0) {
    read_at(in, path_, file_size_, data_offset, out, e.size, "entry data");
    auto* p = static_cast<const unsigned char*>(out);
    for (uint64_t done = 0; done < e.size; done += kChunk)
      crc = crc32(crc, p + done, static_cast<uInt>(std::min(kChunk, e.size - done)));
  } else {
    z_stream zs{};
    KILN_CHECK(inflateInit2(&zs, -MAX_WBITS) == Z_OK, path_, ": zlib could not start inflating '", e.name, "'");
    std::vector<unsigned char> buf(std::min<uint64_t>(kChunk, std::max<uint64_t>(e.compressed_size, 1)));
    auto* dst = static_cast<unsigned char*>(out);
    uint64_t read = 0, written = 0;
    int rc = Z_OK;
    in.clear();
    in.seekg(static_cast<std::streamoff>(data_offset));
    while (rc != Z_STREAM_END) {
      if (zs.avail_in == 0 && read < e.compressed_size) {
        const uint64_t n = std::min<uint64_t>(buf.size(), e.compressed_size - read);
        in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(n));
        if (static_cast<uint64_t>(in.gcount()) != n) {
          inflateEnd(&zs);
          KILN_CHECK(false, path_, ": reading entry '", e.name, "' failed");
        }
        zs.next_in = buf.data();
        zs.avail_in = static_cast<uInt>(n);
        read += n;
      }
      const uint64_t room = std::min<uint64_t>(kChunk, e.size - written);
      zs.next_out = dst + written;
      zs.avail_out = static_cast<uInt>(room);
      rc = inflate(&zs, Z_NO_FLUSH);
      const uint64_t produced = room - zs.avail_out;
      crc = crc32(crc, dst + written, static_cast<uInt>(produced));
      written += produced;
      const bool stuck = (rc == Z_BUF_ERROR && zs.avail_in == 0 && read == e.compressed_size) ||
                         (rc == Z_BUF_ERROR && written == e.size);
      if ((rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) || stuck) {
        inflateEnd(&zs);
        KILN_CHECK(false, path_, ": corrupt deflate data in entry '", e.name,
                   "' (zlib: ", zs.msg != nullptr ? zs.msg : "data ends early or is longer than the recorded size",
                   ")");
      }
    }
    inflateEnd(&zs);
    KILN_CHECK(written == e.size, path_, ": entry '", e.name, "' inflates to ", written, " bytes, not the ", e.size,
               " recorded");
  }
  KILN_CHECK(crc == e.crc32, path_, ": entry '", e.name, "' fails its CRC-32 check (the file is corrupt)");
}

}  // namespace kiln::io
