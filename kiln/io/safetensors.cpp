// kiln/io/safetensors.cpp — reading safetensors files tensor by tensor (pread into fresh CPU tensors) and
// writing them atomically. The header is parsed and checked in safetensors_header.cpp.
#include "kiln/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>  // std::bad_alloc
#include <set>

#include <nlohmann/json.hpp>

#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::io {

namespace {

std::string os_error() { return std::strerror(errno); }

// Closes a file descriptor on every path out.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

Fd open_for_reading(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  KILN_CHECK(fd.get() >= 0, "safetensors file '", path, "': cannot open it (", os_error(), ")");
  return fd;
}

uint64_t file_size(const Fd& fd, const std::string& path) {
  struct stat st {};
  KILN_CHECK(::fstat(fd.get(), &st) == 0, "safetensors file '", path, "': cannot stat it (", os_error(), ")");
  KILN_CHECK(S_ISREG(st.st_mode), "safetensors file '", path, "' is not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

// Reads exactly n bytes at offset; a short read means the file shrank since its header was checked.
void read_at(const Fd& fd, void* out, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
    const ssize_t got = ::pread(fd.get(), p, chunk, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    KILN_CHECK(got >= 0, "safetensors file '", path, "': read failed at byte ", offset, " (", os_error(), ")");
    KILN_CHECK(got > 0, "safetensors file '", path, "': ends at byte ", offset,
               " before its tensors do (truncated while being read?)");
    p += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (put < 0 && errno == EINTR) continue;
    KILN_CHECK(put > 0, "save_safetensors('", path, "'): write failed (", os_error(), ")");
    p += put;
    n -= static_cast<size_t>(put);
  }
}

// A failed allocation names the file and the tensor (the shape was checked against the file's size already).
Tensor empty_for(const SafetensorsEntry& e, const std::string& path) {
  try {
    return internal::empty(e.shape, {.dtype = e.dtype, .device = Device::cpu()});
  } catch (const OutOfMemoryError& err) {
    throw OutOfMemoryError(kiln::detail::str_cat("safetensors file '", path, "': tensor '", e.name, "': ", err.what()));
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError(kiln::detail::str_cat("safetensors file '", path, "': out of host memory for tensor '",
                                                 e.name, "' (", e.end - e.begin, " bytes)"));
  }
}

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::Float64: return "F64";
    case DType::Float32: return "F32";
    case DType::Float16: return "F16";
    case DType::BFloat16: return "BF16";
    case DType::Int64: return "I64";
    case DType::Int32: return "I32";
    case DType::UInt8: return "U8";
    case DType::Bool: return "BOOL";
    case DType::Float8_e4m3fn: return "F8_E4M3";
    case DType::Float8_e5m2: return "F8_E5M2";
  }
  return nullptr;
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  Fd fd = open_for_reading(path_);
  const uint64_t size = file_size(fd, path_);
  uint8_t first8[8] = {};
  if (size >= 8) read_at(fd, first8, 8, 0, path_);
  const uint64_t n = safetensors_header_length(first8, size, path_);
  SafetensorsHeader header;
  try {
    std::vector<uint8_t> json(static_cast<size_t>(n));
    read_at(fd, json.data(), n, 8, path_);
    header = parse_safetensors_json(json.data(), json.size(), size, path_);
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError(
        kiln::detail::str_cat("safetensors file '", path_, "': out of host memory for its ", n, "-byte header"));
  }
  data_start_ = header.data_start;
  entries_ = std::move(header.entries);
  metadata_ = std::move(header.metadata);
}

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const SafetensorsEntry& e) { return e.name == name; });
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return e;
  }
  KILN_FAIL("safetensors file '", path_, "' has no tensor named '", name, "' (it has ", entries_.size(),
            " tensors; SafetensorsFile::entries() lists them)");
}

Tensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  Fd fd = open_for_reading(path_);
  Tensor t = empty_for(e, path_);
  read_at(fd, t.data_ptr(), e.end - e.begin, data_start_ + e.begin, path_);
  if (e.dtype == DType::Bool)
    detail::check_safetensors_bools(static_cast<const uint8_t*>(t.data_ptr()), t.nbytes(), e, path_);
  return t;
}

NamedTensors SafetensorsFile::read_all() const {
  Fd fd = open_for_reading(path_);
  NamedTensors out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) {
    Tensor t = empty_for(e, path_);
    read_at(fd, t.data_ptr(), e.end - e.begin, data_start_ + e.begin, path_);
    if (e.dtype == DType::Bool)
      detail::check_safetensors_bools(static_cast<const uint8_t*>(t.data_ptr()), t.nbytes(), e, path_);
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

NamedTensors load_safetensors(const std::string& path) { return SafetensorsFile(path).read_all(); }

NamedTensors load_safetensors(const uint8_t* data, size_t size, const std::string& name) {
  const SafetensorsHeader header = parse_safetensors_header(data, size, name);
  NamedTensors out;
  for (const auto& e : header.entries) {
    Tensor t = empty_for(e, name);
    if (e.end > e.begin) std::memcpy(t.data_ptr(), data + header.data_start + e.begin, e.end - e.begin);
    if (e.dtype == DType::Bool)
      detail::check_safetensors_bools(static_cast<const uint8_t*>(t.data_ptr()), t.nbytes(), e, name);
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  KILN_CHECK(fs::is_directory(folder, ec), "save_safetensors('", path, "'): the folder '", folder.string(),
             "' does not exist; create it first");

  // The header: keys in the given order ("__metadata__" first), offsets consecutive.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(t.defined(), "save_safetensors('", path, "'): tensor '", name, "' is undefined");
    KILN_CHECK(name != "__metadata__", "save_safetensors('", path,
               "'): '__metadata__' is reserved for the metadata and cannot name a tensor");
    KILN_CHECK(names.insert(name).second, "save_safetensors('", path, "'): the name '", name,
               "' is used by two tensors");
    const char* dtype = safetensors_dtype(t.dtype());
    KILN_CHECK(dtype != nullptr, "save_safetensors('", path, "'): tensor '", name, "' has dtype ", t.dtype(),
               ", which safetensors cannot store");
    const uint64_t nbytes = t.nbytes();
    header[name] = {{"dtype", dtype}, {"shape", t.shape()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("save_safetensors('", path, "'): a tensor name or metadata string is not valid UTF-8 (", e.what(), ")");
  }
  json.append((8 - json.size() % 8) % 8, ' ');  // as the reference writer: the data starts 8-byte aligned
  const uint64_t json_size = json.size();

  // A temporary file beside the target, renamed over it once complete and synced: readers never see half a file.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  KILN_CHECK(fd.get() >= 0, "save_safetensors('", path, "'): cannot create the temporary file '", tmp, "' (",
             os_error(), "); is the folder writable?");
  try {
    uint8_t length[8];
    std::memcpy(length, &json_size, 8);  // little-endian
    write_all(fd.get(), length, 8, path);
    write_all(fd.get(), json.data(), json.size(), path);
    for (const auto& [name, t] : tensors) {
      // One tensor at a time on the host, so a model on the GPU is not copied whole.
      const Tensor host = t.to(Device::cpu()).contiguous();
      if (host.nbytes() > 0) write_all(fd.get(), host.data_ptr(), host.nbytes(), path);
    }
    KILN_CHECK(::fsync(fd.get()) == 0, "save_safetensors('", path, "'): fsync failed (", os_error(), ")");
    KILN_CHECK(::close(fd.release()) == 0, "save_safetensors('", path, "'): close failed (", os_error(), ")");
    fs::rename(tmp, target, ec);
    KILN_CHECK(!ec, "save_safetensors('", path, "'): cannot rename '", tmp, "' to it (", ec.message(), ")");
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  // The rename itself is durable once the folder is synced.
  Fd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) ::fsync(dir.get());
}

}  // namespace kiln::io
