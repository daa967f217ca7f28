// kiln/data/datasets/hdf5_dataset.h — samples as rows of arrays in an HDF5 file (as h5py writes them).
//
//   data::HDF5Dataset train("train.h5", {"images", "labels"}, {.chunk_rows = 1024});
//   data::Example ex = train.sample(7);   // {"images": row 7 of /images, "labels": row 7 of /labels}
//   data::HDF5Dataset all("train.h5");    // every top-level dataset (they must share their first dim)
//   data::write_hdf5_arrays("small.h5", {{"images", images}, {"train/labels", labels}});
//
// Sample i is row i of each named array, with the row's shape and the array's dtype: uint8 -> UInt8;
// int8, int16, uint16, int32 -> Int32; uint32, int64, uint64 -> Int64 (uint64 values above 2^63 - 1 clip);
// 16-bit IEEE floats -> Float16 (or Float32 with .float16_as_float32); bfloat16 -> BFloat16; float32, float64.
// Names may be paths into groups ("train/images"); the field is named by the full path as given.
//
// HDF5 (a serial build) is not thread-safe: every HDF5 call in kiln holds hdf5_mutex(). get() reads
// `chunk_rows` rows of every array at once into a small LRU cache, so a run of consecutive indices costs one
// read; worker threads that need the same chunk wait for one read of it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kiln/data/dataset.h"

namespace kiln::data {

// How HDF5Dataset reads: rows in chunks, a few chunks cached.
struct HDF5Options {
  int64_t chunk_rows = 1024;           // rows read per HDF5 call (fewer when a chunk would pass max_chunk_bytes)
  int64_t cache_chunks = 4;            // chunks kept in memory (least recently used evicted)
  int64_t max_chunk_bytes = 64 << 20;  // bound on one chunk's bytes over all arrays (at least one row is read)
  bool float16_as_float32 = false;     // 16-bit float arrays come out as Float32 instead of Float16
};

// Rows of arrays in an HDF5 file as a Dataset: sample i is row i of each named array.
class HDF5Dataset : public Dataset {
 public:
  // `names` empty: every top-level dataset of the file (they must all have the same first dim).
  explicit HDF5Dataset(const std::filesystem::path& path, std::vector<std::string> names = {},
                       HDF5Options options = {});
  ~HDF5Dataset() override;
  HDF5Dataset(const HDF5Dataset&) = delete;
  HDF5Dataset& operator=(const HDF5Dataset&) = delete;

  int64_t size() const override { return rows_; }
  Example get(int64_t index, SampleRng& rng) const override;  // {name: row `index` of that array}
  std::string describe() const override;

  // The arrays read, in field order (every top-level dataset when none were named).
  const std::vector<std::string>& names() const { return names_; }
  // The rows read per HDF5 call, after the max_chunk_bytes bound.
  int64_t chunk_rows() const { return chunk_rows_; }  // after the max_chunk_bytes bound
  int64_t reads() const;                              // HDF5 reads done so far (for tests and tuning)

 private:
  struct State;  // the HDF5 handles and the chunk cache (hdf5_dataset.cpp)
  std::filesystem::path path_;
  std::vector<std::string> names_;
  HDF5Options options_;
  int64_t rows_ = 0;
  int64_t chunk_rows_ = 1;
  std::unique_ptr<State> state_;
};

// Writes each tensor (any device, any layout; Bool stored as uint8) as a contiguous dataset of its dtype
// and shape; names may be paths ("train/images"), whose groups are created. Replaces an existing file.
void write_hdf5_arrays(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& arrays);

// Held around every HDF5 library call in kiln (the serial library is not thread-safe).
std::mutex& hdf5_mutex();

}  // namespace kiln::data
