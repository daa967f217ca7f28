// kiln/io/hdf5_tensors.h — one HDF5 file seen as groups of checksummed tensors and typed attributes: what
// checkpoints are written with (checkpoint.cpp), usable for any tensor file h5py should read.
//
//   io::H5File f("out.h5", io::H5File::Mode::Create);
//   f.create_group("/model");
//   f.write_tensor("/model", "fc1.weight", w);          // any device and layout; stored contiguous, with crc32
//   f.set_attr("/", "step", int64_t{1000});
//   f.close();                                          // flushes; throws when the file could not be written
//   io::H5File g("out.h5", io::H5File::Mode::Read);
//   Tensor w2 = g.read_tensor("/model", "fc1.weight");  // a CPU tensor; checksum verified
//
// Tensors keep their dtype and shape: float32/float64/int64/int32/uint8 natively, bool as h5py's enum
// (int8 FALSE=0/TRUE=1), float16 as the IEEE half type h5py reads as numpy float16, bfloat16 as uint16 with a
// dataset attribute dtype="bfloat16" (h5py shows uint16; view as bfloat16 with torch's .view(torch.bfloat16)),
// float8_e4m3fn and float8_e5m2 as their raw uint8 codes with an attribute dtype="float8_e4m3fn" / "float8_e5m2"
// (view them with torch's .view(torch.float8_e4m3fn)); reading gives back the same bits and dtype.
// Each dataset has an attribute crc32 (zlib's crc32 of its contiguous little-endian bytes) checked on read.
//
// Every call holds data::hdf5_mutex() (the serial HDF5 library is not thread-safe), silences HDF5's own error
// printing and turns HDF5's errors into a kiln::Error naming the file, the object and HDF5's reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::io {

// A stored tensor's dtype and shape (H5File::tensor_info).
struct TensorInfo {
  DType dtype{};  // the dtype read_tensor returns
  Shape shape{};  // the dataset's dims; empty for a 0-d tensor
};

// One open HDF5 file: groups, checksummed tensors (datasets) and scalar attributes (see the top of this file).
class H5File {
 public:
  // How the constructor opens the file.
  enum class Mode {
    Create,     // a new file (an existing one is truncated)
    Read,       // an existing file, read only
    ReadWrite,  // an existing file
  };
  // user_block (Create only): bytes HDF5 leaves free at the file's start for the caller (0, or a power of 2
  // from 512); checkpoints keep their kiln header there.
  H5File(std::string path, Mode mode, uint64_t user_block = 0);
  ~H5File();  // closes, ignoring errors (call close() to see them)
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  // The path given at construction.
  const std::string& path() const { return path_; }
  // Flushes everything to the operating system and closes the file; throws on failure. Idempotent.
  void close();

  // Groups are absolute paths ("/", "/model", "/rng/cpu"); create_group makes missing parents.
  void create_group(const std::string& group);
  bool has_group(const std::string& group) const;                             // whether `group` is a group
  bool has_dataset(const std::string& group, const std::string& name) const;  // whether group/name is a dataset
  // The names of the links (datasets and groups) in `group`, in name order.
  std::vector<std::string> children(const std::string& group) const;

  // Stores `tensor` (any device and layout, copied to contiguous host memory) as dataset `name` of the existing
  // `group`, with its crc32. kiln::Error for an undefined tensor, a name empty or with '/', or a name already used.
  void write_tensor(const std::string& group, const std::string& name, const Tensor& tensor);
  TensorInfo tensor_info(const std::string& group, const std::string& name) const;  // reads no data
  Tensor read_tensor(const std::string& group, const std::string& name) const;      // CPU; crc32 checked

  // Attributes of a group or dataset ("/model/fc1.weight"). Numbers are stored as float64, integers as
  // int64/uint64 (exact: generator offsets need all 64 bits), strings as variable-length UTF-8.
  void set_attr(const std::string& object, const std::string& name, double value);
  // Writing an attribute that exists replaces it.
  void set_attr(const std::string& object, const std::string& name, int64_t value);             // as int64
  void set_attr(const std::string& object, const std::string& name, uint64_t value);            // as uint64
  void set_attr(const std::string& object, const std::string& name, const std::string& value);  // as a string
  // Whether `object` exists and has the attribute.
  bool has_attr(const std::string& object, const std::string& name) const;
  std::vector<std::string> attr_names(const std::string& object) const;           // in name order
  bool attr_is_string(const std::string& object, const std::string& name) const;  // kiln::Error if it is missing
  double attr_double(const std::string& object, const std::string& name) const;   // any numeric attribute
  int64_t attr_int(const std::string& object, const std::string& name) const;     // integer attributes only
  uint64_t attr_uint(const std::string& object, const std::string& name) const;   // integer attributes only
  // kiln::Error unless the attribute is a fixed-length string (as kiln writes them).
  std::string attr_string(const std::string& object, const std::string& name) const;

 private:
  std::string path_;
  int64_t file_ = -1;  // hid_t
  bool writable_ = false;
};

// zlib's crc32 of `size` bytes (what the crc32 attributes hold); `crc` continues an earlier crc32 (of the bytes
// before these).
uint32_t crc32_bytes(const void* data, size_t size, uint32_t crc = 0);

}  // namespace kiln::io
