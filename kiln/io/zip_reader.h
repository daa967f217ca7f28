// kiln/io/zip_reader.h — a small, strict reader of zip archives (the container of PyTorch's torch.save files).
//
//   io::ZipReader zip("model.pth");
//   for (const auto& e : zip.entries()) std::cout << e.name << " " << e.size << "\n";
//   std::string pkl = zip.read("archive/data.pkl");            // whole entry, CRC checked
//   zip.read_into(zip.entry("archive/data/0"), buffer, n);     // straight into a tensor's memory
//
// Stored and deflated entries, zip64 (archives and entries over 4 GB). Every offset and size in the end of
// central directory, the central directory and the local headers is checked against the file's length
// before it is used: a truncated or lying archive gives a kiln::Error naming the file, never an
// out-of-bounds read. Multi-disk archives and encrypted entries are refused.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln::io {

// One entry of a zip archive's central directory.
struct ZipEntry {
  std::string name;              // its path in the archive ("archive/data.pkl")
  uint16_t method = 0;           // 0 stored, 8 deflate
  uint32_t crc32 = 0;            // of the uncompressed bytes, checked when read
  uint64_t compressed_size = 0;  // bytes in the archive
  uint64_t size = 0;             // uncompressed
  uint64_t header_offset = 0;    // of the local file header
};

// A zip archive on disk, its central directory read at construction (see the top of this file).
class ZipReader {
 public:
  explicit ZipReader(std::string path);  // reads and checks the central directory
  // The path given at construction.
  const std::string& path() const { return path_; }
  // The archive's size in bytes.
  uint64_t file_size() const { return file_size_; }
  // The entries, in central-directory order.
  const std::vector<ZipEntry>& entries() const { return entries_; }  // in central-directory order
  // Whether the archive has an entry of that name.
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const ZipEntry& entry(const std::string& name) const;  // throws, naming the file and the entry
  std::string read(const std::string& name) const;       // the whole entry, uncompressed, its CRC checked
  // Writes exactly entry.size bytes to out (capacity checked by the caller: out_size must equal entry.size).
  void read_into(const ZipEntry& entry, void* out, uint64_t out_size) const;

 private:
  std::string path_;
  uint64_t file_size_ = 0;
  std::vector<ZipEntry> entries_;
  std::map<std::string, size_t> index_;
};

}  // namespace kiln::io
