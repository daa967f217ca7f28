// kiln/data/datasets/file_bytes.cpp — reading whole files, inflating gzip with zlib.
#include "kiln/data/datasets/file_bytes.h"

#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <new>  // std::bad_alloc
#include <string>

#include "kiln/tensor/error.h"

namespace kiln::data::detail {

namespace {

std::vector<uint8_t> read_raw(const std::filesystem::path& path) {
  std::error_code ec;
  KILN_CHECK(std::filesystem::is_regular_file(path, ec), "cannot read ", path.string(), ": no such file");
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "cannot open ", path.string(), " for reading (check its permissions)");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  KILN_CHECK(!in.bad(), "error while reading ", path.string());
  return bytes;
}

bool is_gzip(const std::vector<uint8_t>& bytes, size_t at) {
  return bytes.size() >= at + 2 && bytes[at] == 0x1f && bytes[at + 1] == 0x8b;
}

std::vector<uint8_t> inflate_gzip(const std::vector<uint8_t>& in, const std::filesystem::path& path) {
  std::vector<uint8_t> out;
  // The last member's trailer holds its uncompressed size mod 2^32: a good first guess for one member.
  if (in.size() >= 18) {
    const size_t n = in.size();
    const uint32_t isize =
        uint32_t(in[n - 4]) | uint32_t(in[n - 3]) << 8 | uint32_t(in[n - 2]) << 16 | uint32_t(in[n - 1]) << 24;
    // A forged trailer must not reserve more than deflate can make from this input (1032:1).
    out.reserve(std::min<size_t>({isize, size_t(1) << 31, in.size() * 1032}));
  }
  z_stream zs{};
  KILN_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, "zlib: inflateInit2 failed for ", path.string());
  size_t consumed = 0;  // input bytes used by finished members
  uint8_t buffer[1 << 16];
  int ret = Z_OK;
  while (true) {
    zs.next_in = const_cast<Bytef*>(in.data() + consumed);
    zs.avail_in = static_cast<uInt>(std::min<size_t>(in.size() - consumed, UINT32_MAX));
    const size_t start = consumed;
    do {
      zs.next_out = buffer;
      zs.avail_out = sizeof(buffer);
      ret = inflate(&zs, Z_NO_FLUSH);
      out.insert(out.end(), buffer, buffer + (sizeof(buffer) - zs.avail_out));
      if (ret == Z_BUF_ERROR && zs.avail_in == 0) break;  // input ended before the stream did
    } while (ret == Z_OK);
    const size_t used = start + (zs.next_in - (in.data() + start));
    if (ret != Z_STREAM_END) {
      const std::string msg = zs.msg ? zs.msg : "error " + std::to_string(ret);
      inflateEnd(&zs);
      KILN_CHECK(ret != Z_BUF_ERROR, path.string(), ": truncated gzip file (the compressed stream ends after ",
                 in.size(), " bytes, ", out.size(), " bytes inflated); download it again");
      KILN_CHECK(false, path.string(), ": corrupt gzip data (zlib: ", zs.msg ? zs.msg : "error ", ret,
                 "); download it again");
    }
    consumed = used;
    if (!is_gzip(in, consumed)) break;  // trailing zero padding or nothing: done
    inflateReset(&zs);
  }
  inflateEnd(&zs);
  return out;
}

}  // namespace

std::vector<uint8_t> read_maybe_gzip(const std::filesystem::path& path) {
  try {
    std::vector<uint8_t> bytes = read_raw(path);
    return is_gzip(bytes, 0) ? inflate_gzip(bytes, path) : bytes;
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError("out of host memory while reading " + path.string() +
                           " (a gzip file inflates up to 1032 times its size); free memory, or check the file");
  }
}

std::optional<std::filesystem::path> find_file(const std::vector<std::filesystem::path>& dirs,
                                               const std::vector<std::string>& names) {
  std::error_code ec;
  for (const auto& dir : dirs)
    for (const auto& name : names)
      if (std::filesystem::is_regular_file(dir / name, ec)) return dir / name;
  return std::nullopt;
}

std::string join_paths(const std::vector<std::filesystem::path>& paths) {
  std::string s;
  for (const auto& p : paths) s += (s.empty() ? "" : ", ") + p.string();
  return s;
}

}  // namespace kiln::data::detail
