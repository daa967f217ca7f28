// kiln/io/safetensors.h — safetensors files, the format Hugging Face publishes weights in: an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the tensors' bytes.
//
//   auto tensors = io::load_safetensors("model.safetensors");          // in file order, CPU tensors
//   io::save_safetensors("out.safetensors", model->state_dict(), {{"format", "pt"}});
//   io::SafetensorsFile f("model.safetensors");                          // header only; read tensors on demand
//   Tensor w = f.read("bert.embeddings.word_embeddings.weight");
//
// Every header is checked before a byte of data is used (offsets within the file, covering the data without
// gaps or overlaps, sizes matching dtype x shape, known dtypes): a file that lies gives a kiln::Error naming
// the file and the problem, never an out-of-bounds read.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::io {

// Tensors by name, in order (a state dict's form).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// One tensor of a safetensors header.
struct SafetensorsEntry {
  std::string name{};  // its key in the header
  DType dtype{};       // the stored dtype
  Shape shape{};       // the stored shape
  // begin, end: byte offsets within the data section.
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
};

// The checked header of a safetensors file: where its data section starts, its tensors in data-offset order
// (together they cover the data section exactly), its string metadata.
struct SafetensorsHeader {
  uint64_t data_start = 0;                        // 8 + the JSON header's length
  std::vector<SafetensorsEntry> entries{};        // in data-offset order
  std::map<std::string, std::string> metadata{};  // the header's "__metadata__" strings
};

// The largest JSON header accepted (as the reference implementation): a bigger one is a corrupt file.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// The JSON header's length from a file's first 8 bytes, checked against the file's size.
uint64_t safetensors_header_length(const uint8_t* first8, uint64_t file_size, const std::string& name);
// Parses and checks the JSON header (`json`, `json_size` bytes, as found after the 8-byte length) of a file of
// `file_size` bytes. Everything a later read relies on is checked here; `name` names the file in errors.
SafetensorsHeader parse_safetensors_json(const uint8_t* json, size_t json_size, uint64_t file_size,
                                         const std::string& name);
// Both steps for a whole file in memory (`size` bytes at `data`).
SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, const std::string& name);

namespace detail {
// Throws unless every byte of a BOOL tensor is 0 or 1 (any other byte is not a valid C++ bool).
void check_safetensors_bools(const uint8_t* bytes, size_t n, const SafetensorsEntry& entry, const std::string& name);
}  // namespace detail

// A safetensors file on disk, its header read at construction; tensors are read one by one or all at once.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);  // reads and checks the header
  // The file offset of the data section: 8 + the JSON header's length.
  uint64_t data_start() const { return data_start_; }
  // The path given at construction.
  const std::string& path() const { return path_; }
  // The tensors, in data-offset order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in data-offset order
  // The header's "__metadata__" strings.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;                  // whether a tensor is named `name`
  const SafetensorsEntry& entry(const std::string& name) const;  // throws, naming the file
  Tensor read(const std::string& name) const;                    // a CPU tensor of the stored dtype
  NamedTensors read_all() const;                                 // every tensor, in data-offset order, as CPU tensors

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Every tensor of the safetensors file `path` (CPU tensors of the stored dtypes), in data-offset order.
NamedTensors load_safetensors(const std::string& path);
// A whole safetensors file already in memory (`name` names it in errors); the tensors are copied out.
NamedTensors load_safetensors(const uint8_t* data, size_t size, const std::string& name);
// Writes atomically (a temporary file in the same folder, then renamed). Tensors may be on any device and
// of any layout; they are stored contiguous, in the given order.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace kiln::io
