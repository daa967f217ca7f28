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

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);  // reads and checks the header
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in data-offset order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;  // throws, naming the file
  Tensor read(const std::string& name) const;                    // a CPU tensor of the stored dtype
  NamedTensors read_all() const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

NamedTensors load_safetensors(const std::string& path);
// Writes atomically (a temporary file in the same folder, then renamed). Tensors may be on any device and
// of any layout; they are stored contiguous, in the given order.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace kiln::io
