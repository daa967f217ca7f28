// kiln/io/checkpoint_header.cpp — the kiln header in a checkpoint's HDF5 user block: the file's length and a
// crc32 of every byte after the block, checked before HDF5 sees the file.
//
// Why: the serial HDF5 library trusts the bytes it parses, and damaged or hostile files can crash it. A file
// whose length and checksum match what kiln wrote is one HDF5 itself wrote, so only such files reach HDF5.
//
// Layout of the first kCheckpointUserBlock (512) bytes (all integers little-endian; HDF5 finds its superblock
// at offset 512 and ignores the block, so h5py and h5ls read the file as usual):
//   [0, 8)    "KILNCKPT"
//   [8, 12)   uint32 header version (1)
//   [12, 16)  uint32 user block size (512)
//   [16, 24)  uint64 the file's length in bytes, user block included
//   [24, 28)  uint32 zlib crc32 of bytes [512, length)
//   [28, 32)  uint32 zlib crc32 of bytes [0, 28) (the header itself)
//   [32, 512) zero
#include <fcntl.h>   // open
#include <unistd.h>  // pread, pwrite, close

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "kiln/io/checkpoint_internal.h"
#include "kiln/tensor/error.h"

namespace kiln::io::detail {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'K', 'P', 'T'};
constexpr uint32_t kHeaderVersion = 1;
constexpr size_t kHeaderBytes = 32;
constexpr unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

void put_le(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// An open file descriptor, closed on scope exit.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly `n` bytes at `offset`; false at end of file.
bool pread_all(int fd, void* buf, size_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    KILN_CHECK(got >= 0, path, ": cannot read the file (", std::strerror(errno), ")");
    if (got == 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

// zlib's crc32 of bytes [from, to) of the file, read in 4 MiB pieces.
uint32_t crc32_of_range(int fd, uint64_t from, uint64_t to, const std::string& path) {
  std::vector<unsigned char> buf(size_t{4} << 20);
  uint32_t crc = 0;  // zlib's initial value
  for (uint64_t at = from; at < to;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), to - at));
    KILN_CHECK(pread_all(fd, buf.data(), n, at, path), path, ": the file shrank while its checksum was computed");
    crc = crc32_bytes(buf.data(), n, crc);
    at += n;
  }
  return crc;
}

uint64_t file_size(int fd, const std::string& path) {
  const off_t end = ::lseek(fd, 0, SEEK_END);
  KILN_CHECK(end >= 0, path, ": cannot find the file's size (", std::strerror(errno), ")");
  return static_cast<uint64_t>(end);
}

}  // namespace

void seal_checkpoint(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDWR)};
  KILN_CHECK(f.fd >= 0, path, ": cannot open the file to write its kiln header (", std::strerror(errno), ")");
  const uint64_t length = file_size(f.fd, path);
  KILN_CHECK(length > kCheckpointUserBlock, path, ": ", length, " bytes, no room after the ", kCheckpointUserBlock,
             "-byte user block; HDF5 did not write the file");
  std::array<unsigned char, kCheckpointUserBlock> block{};
  std::memcpy(block.data(), kMagic, sizeof(kMagic));
  put_le(block.data() + 8, kHeaderVersion, 4);
  put_le(block.data() + 12, kCheckpointUserBlock, 4);
  put_le(block.data() + 16, length, 8);
  put_le(block.data() + 24, crc32_of_range(f.fd, kCheckpointUserBlock, length, path), 4);
  put_le(block.data() + 28, crc32_bytes(block.data(), 28), 4);
  size_t done = 0;
  while (done < block.size()) {
    const ssize_t n = ::pwrite(f.fd, block.data() + done, block.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    KILN_CHECK(n > 0, path, ": cannot write the kiln header (", std::strerror(errno), "); is the disk full?");
    done += static_cast<size_t>(n);
  }
}

void verify_checkpoint_file(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY)};
  if (f.fd < 0) {
    const int err = errno;
    KILN_CHECK(err != ENOENT, path, ": no such file");
    KILN_CHECK(false, path, ": cannot open the file (", std::strerror(err), ")");
  }
  const uint64_t size = file_size(f.fd, path);
  KILN_CHECK(size > 0, path, ": the file is empty (not a kiln checkpoint)");
  std::array<unsigned char, kHeaderBytes> h{};
  pread_all(f.fd, h.data(), static_cast<size_t>(std::min<uint64_t>(size, kHeaderBytes)), 0, path);
  if (size >= sizeof(kHdf5Signature) && std::memcmp(h.data(), kHdf5Signature, sizeof(kHdf5Signature)) == 0) {
    KILN_CHECK(false, path,
               ": not a kiln checkpoint of this layout: an HDF5 file without kiln's KILNCKPT header (written by "
               "another program, or by a kiln before checkpoints carried the header); load it with a kiln of its "
               "time and save it again");
  }
  KILN_CHECK(size >= sizeof(kMagic) && std::memcmp(h.data(), kMagic, sizeof(kMagic)) == 0, path,
             ": not a kiln checkpoint (it does not start with KILNCKPT; another format, or damaged)");
  KILN_CHECK(size >= kHeaderBytes, path, ": truncated: ", size, " bytes, shorter than kiln's header");
  KILN_CHECK(get_le(h.data() + 28, 4) == crc32_bytes(h.data(), 28), path,
             ": corrupted: the kiln header's checksum does not match; the file is damaged");
  const uint64_t version = get_le(h.data() + 8, 4);
  KILN_CHECK(version == kHeaderVersion, path, ": kiln header version ", version, "; this kiln reads version ",
             kHeaderVersion, version > kHeaderVersion ? " (written by a newer kiln: update kiln)" : "");
  const uint64_t block = get_le(h.data() + 12, 4);
  KILN_CHECK(block == kCheckpointUserBlock, path, ": a kiln header for a ", block, "-byte user block; kiln writes ",
             kCheckpointUserBlock, "; the file is damaged");
  const uint64_t length = get_le(h.data() + 16, 8);
  KILN_CHECK(size >= length, path, ": truncated: ", size, " of ", length,
             " bytes (the copy or the save was cut short); use another checkpoint");
  KILN_CHECK(size == length, path, ": ", size, " bytes where kiln wrote ", length,
             " (bytes were appended); the file is damaged");
  KILN_CHECK(length > kCheckpointUserBlock, path, ": the kiln header gives a length of ", length,
             " bytes, no room for HDF5's data; the file is damaged");
  const uint32_t stored = static_cast<uint32_t>(get_le(h.data() + 24, 4));
  const uint32_t actual = crc32_of_range(f.fd, kCheckpointUserBlock, length, path);
  KILN_CHECK(stored == actual, path, ": corrupted: checksum mismatch (crc32 of the file's ", length - kCheckpointUserBlock,
             " bytes after the header is ", actual, ", the header says ", stored,
             "); the file was damaged after it was written: use another checkpoint");
}

}  // namespace kiln::io::detail
