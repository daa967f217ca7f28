// kiln/data/datasets/hdf5_dataset.cpp — HDF5Dataset (rows of arrays, read a chunk of rows at a time into an
// LRU cache) and write_hdf5_arrays. Every HDF5 call runs under hdf5_mutex().
#include "kiln/data/datasets/hdf5_dataset.h"

#include <hdf5.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <future>
#include <unordered_map>

#include "kiln/data/hdf5/hdf5_util.h"
#include "kiln/tensor/checked_size.h"  // checked_nbytes: a row's size from the file
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::data {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

namespace {

using hdf5::half_type;
using hdf5::Handle;
using hdf5::QuietErrors;

// The memory type kiln reads `dtype` as (an owned copy, so every case closes the same way).
Handle memory_type(DType dtype) {
  switch (dtype) {
    case DType::Bool:
    case DType::UInt8: return Handle(H5Tcopy(H5T_NATIVE_UINT8), H5Tclose);
    case DType::Int32: return Handle(H5Tcopy(H5T_NATIVE_INT32), H5Tclose);
    case DType::Int64: return Handle(H5Tcopy(H5T_NATIVE_INT64), H5Tclose);
    case DType::Float32: return Handle(H5Tcopy(H5T_NATIVE_FLOAT), H5Tclose);
    case DType::Float64: return Handle(H5Tcopy(H5T_NATIVE_DOUBLE), H5Tclose);
    case DType::Float16: return half_type(false);
    case DType::BFloat16: return half_type(true);
    case DType::Float8_e4m3fn:
    case DType::Float8_e5m2: break;  // dtype_for never reads an array as float8
  }
  return {};
}

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "variable-length";
    case H5T_ARRAY: return "array";
    default: return "unknown";
  }
}

// The kiln dtype an array's file type is read as.
DType dtype_for(hid_t file_type, const std::string& where, bool float16_as_float32) {
  const H5T_class_t cls = H5Tget_class(file_type);
  const size_t size = H5Tget_size(file_type);
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(file_type) == H5T_SGN_2;
    if (size == 1) return is_signed ? DType::Int32 : DType::UInt8;
    if (size == 2 || (size == 4 && is_signed)) return DType::Int32;
    if (size == 4 || size == 8) return DType::Int64;
  } else if (cls == H5T_FLOAT) {
    if (size == 2) {
      if (float16_as_float32) return DType::Float32;
      return H5Tget_ebias(file_type) == 127 ? DType::BFloat16 : DType::Float16;
    }
    if (size == 4) return DType::Float32;
    if (size == 8) return DType::Float64;
  }
  KILN_CHECK(false, where, " has elements of an unsupported type (", class_name(cls), ", ", size,
             " bytes); HDF5Dataset reads integer and floating-point arrays only");
  return DType::UInt8;
}

// Every dataset path under `group` ("a/b/c"), depth-first, at most `limit` of them (for error messages).
void list_datasets(hid_t group, const std::string& prefix, int depth, std::vector<std::string>& out, size_t limit) {
  H5G_info_t info;
  if (depth > 8 || H5Gget_info(group, &info) < 0) return;
  for (hsize_t k = 0; k < info.nlinks && out.size() < limit; ++k) {
    char name[1024];
    if (H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, k, name, sizeof(name), H5P_DEFAULT) < 0) continue;
    Handle obj(H5Oopen(group, name, H5P_DEFAULT), H5Oclose);
    if (!obj.ok()) continue;
    const std::string path = prefix.empty() ? name : prefix + "/" + name;
    const H5I_type_t type = H5Iget_type(obj.get());
    if (type == H5I_DATASET) out.push_back(path);
    if (type == H5I_GROUP) list_datasets(obj.get(), path, depth + 1, out, limit);
  }
}

std::string join(const std::vector<std::string>& xs) {
  std::string s;
  for (const auto& x : xs) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "(none)" : s;
}

// True when every component of "a/b/c" exists as a link (H5Lexists fails on a missing parent).
bool path_exists(hid_t file, const std::string& path) {
  size_t pos = 0;
  while (true) {
    pos = path.find('/', pos + 1);
    const std::string part = path.substr(0, pos);
    if (!part.empty() && part != "/" && H5Lexists(file, part.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

struct Chunk {
  std::vector<std::vector<uint8_t>> fields;  // per array: (rows, row...) in the field's dtype
};

}  // namespace

struct HDF5Dataset::State {
  struct Field {
    Handle dataset, memory_type;
    DType dtype = DType::UInt8;
    std::vector<hsize_t> dims;  // the whole array's
    Shape row_shape;
    size_t row_bytes = 0;
  };
  struct Entry {
    std::shared_future<std::shared_ptr<const Chunk>> chunk;
    uint64_t last_use = 0;
    uint64_t id = 0;
  };
  Handle file;
  std::vector<Field> fields;
  std::mutex cache_mutex;  // guards cache and tick (never held during a read)
  std::unordered_map<int64_t, Entry> cache;
  uint64_t tick = 0;
  std::atomic<int64_t> reads{0};
};

HDF5Dataset::HDF5Dataset(const std::filesystem::path& path, std::vector<std::string> names, HDF5Options options)
    : path_(path), names_(std::move(names)), options_(options), state_(std::make_unique<State>()) {
  const std::string file = path_.string();
  KILN_CHECK(options_.chunk_rows > 0, "HDF5Dataset(", file, "): chunk_rows must be positive, got ",
             options_.chunk_rows);
  KILN_CHECK(options_.cache_chunks > 0, "HDF5Dataset(", file, "): cache_chunks must be positive, got ",
             options_.cache_chunks);
  std::error_code ec;
  KILN_CHECK(std::filesystem::is_regular_file(path_, ec), "HDF5Dataset: cannot read ", file, ": no such file");
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  QuietErrors quiet;
  KILN_CHECK(H5Fis_hdf5(file.c_str()) > 0, "HDF5Dataset: ", file,
             " is not an HDF5 file (no HDF5 signature found); is it truncated or another format?");
  state_->file = Handle(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  KILN_CHECK(state_->file.ok(), "HDF5Dataset: cannot open ", file, " (a damaged HDF5 file?)");
  const hid_t f = state_->file.get();

  if (names_.empty()) {
    H5G_info_t info;
    KILN_CHECK(H5Gget_info(f, &info) >= 0, "HDF5Dataset: cannot list the root group of ", file);
    for (hsize_t k = 0; k < info.nlinks; ++k) {
      char name[1024];
      if (H5Lget_name_by_idx(f, ".", H5_INDEX_NAME, H5_ITER_INC, k, name, sizeof(name), H5P_DEFAULT) < 0) continue;
      Handle obj(H5Oopen(f, name, H5P_DEFAULT), H5Oclose);
      if (obj.ok() && H5Iget_type(obj.get()) == H5I_DATASET) names_.push_back(name);
    }
    KILN_CHECK(!names_.empty(), "HDF5Dataset: ", file, " has no datasets at its top level; name the arrays to read");
  }

  std::vector<std::string> shapes;  // "name (d0, d1, ...)" for the mismatch message
  for (const std::string& name : names_) {
    const std::string where = file + ": dataset '" + name + "'";
    if (!path_exists(f, name)) {
      std::vector<std::string> there;
      list_datasets(f, "", 0, there, 50);
      KILN_CHECK(false, "HDF5Dataset: ", file, " has no dataset '", name, "'; its datasets are: ", join(there));
    }
    State::Field field;
    field.dataset = Handle(H5Dopen2(f, name.c_str(), H5P_DEFAULT), H5Dclose);
    KILN_CHECK(field.dataset.ok(), where, " is not a dataset (a group?)");
    Handle space(H5Dget_space(field.dataset.get()), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    KILN_CHECK(rank >= 1, where, " is a scalar (or not a simple array); samples are rows along a first dim");
    field.dims.resize(rank);
    H5Sget_simple_extent_dims(space.get(), field.dims.data(), nullptr);
    Handle type(H5Dget_type(field.dataset.get()), H5Tclose);
    field.dtype = dtype_for(type.get(), where, options_.float16_as_float32);
    field.memory_type = memory_type(field.dtype);
    // The dims come from the file: each must fit in int64 and a row's byte count must not wrap.
    for (hsize_t d : field.dims) {
      KILN_CHECK(d <= static_cast<hsize_t>(INT64_MAX), where, " has a dim of ", d,
                 " in its shape, more than 2^63-1; the file is damaged");
    }
    field.row_shape.assign(field.dims.begin() + 1, field.dims.end());
    field.row_bytes = static_cast<size_t>(
        checked_nbytes(field.row_shape, static_cast<int64_t>(element_size(field.dtype)), where + ": one row"));
    std::string shape = name + " (";
    for (int d = 0; d < rank; ++d) shape += (d ? ", " : "") + std::to_string(field.dims[d]);
    shapes.push_back(shape + ")");
    state_->fields.push_back(std::move(field));
  }
  rows_ = static_cast<int64_t>(state_->fields[0].dims[0]);
  for (const auto& field : state_->fields)
    KILN_CHECK(static_cast<int64_t>(field.dims[0]) == rows_, "HDF5Dataset: the datasets of ", file,
               " have different first dims, so their rows cannot be samples: ", join(shapes),
               "; name the arrays that belong together");

  size_t bytes_per_row = 0;
  for (const auto& field : state_->fields) bytes_per_row += field.row_bytes;
  const int64_t fit =
      bytes_per_row == 0 ? options_.chunk_rows : static_cast<int64_t>(options_.max_chunk_bytes / bytes_per_row);
  chunk_rows_ = std::max<int64_t>(1, std::min(options_.chunk_rows, fit));
}

HDF5Dataset::~HDF5Dataset() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  state_.reset();  // closes the datasets and the file
}

int64_t HDF5Dataset::reads() const { return state_->reads.load(); }

std::string HDF5Dataset::describe() const {
  return "HDF5Dataset(" + path_.string() + ", " + join(names_) + ", " + std::to_string(rows_) + " rows)";
}

Example HDF5Dataset::get(int64_t index, SampleRng& rng) const {
  KILN_CHECK(index >= 0 && index < rows_, describe(), ": index ", index, " is out of range [0, ", rows_, ")");
  State& s = *state_;
  const int64_t c = index / chunk_rows_;
  std::shared_future<std::shared_ptr<const Chunk>> future;
  std::promise<std::shared_ptr<const Chunk>> promise;
  uint64_t my_id = 0;
  {
    std::lock_guard<std::mutex> lock(s.cache_mutex);
    auto it = s.cache.find(c);
    if (it != s.cache.end()) {
      it->second.last_use = ++s.tick;
      future = it->second.chunk;
    } else {
      // This thread reads the chunk; others asking for it meanwhile wait on the same future.
      future = promise.get_future().share();
      my_id = ++s.tick;
      s.cache[c] = {future, my_id, my_id};
      while (static_cast<int64_t>(s.cache.size()) > options_.cache_chunks) {
        auto oldest = s.cache.end();
        for (auto e = s.cache.begin(); e != s.cache.end(); ++e)
          if (e->first != c && (oldest == s.cache.end() || e->second.last_use < oldest->second.last_use)) oldest = e;
        s.cache.erase(oldest);
      }
    }
  }
  if (my_id != 0) {
    try {
      auto chunk = std::make_shared<Chunk>();
      const int64_t begin = c * chunk_rows_, rows = std::min(chunk_rows_, rows_ - begin);
      std::lock_guard<std::mutex> lock(hdf5_mutex());
      QuietErrors quiet;
      for (const auto& field : s.fields) {
        chunk->fields.emplace_back(field.row_bytes * rows);
        if (field.row_bytes == 0) continue;
        std::vector<hsize_t> start(field.dims.size(), 0), count = field.dims;
        start[0] = static_cast<hsize_t>(begin);
        count[0] = static_cast<hsize_t>(rows);
        Handle file_space(H5Dget_space(field.dataset.get()), H5Sclose);
        Handle memory_space(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
        const bool ok =
            file_space.ok() && memory_space.ok() &&
            H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) >= 0 &&
            H5Dread(field.dataset.get(), field.memory_type.get(), memory_space.get(), file_space.get(), H5P_DEFAULT,
                    chunk->fields.back().data()) >= 0;
        const size_t k = chunk->fields.size() - 1;
        KILN_CHECK(ok, "HDF5Dataset: reading rows [", begin, ", ", begin + rows, ") of dataset '", names_[k], "' of ",
                   path_.string(), " failed (a damaged file, or a compression filter this HDF5 lacks?)");
      }
      s.reads.fetch_add(1);
      promise.set_value(std::move(chunk));
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(s.cache_mutex);
        auto it = s.cache.find(c);
        if (it != s.cache.end() && it->second.id == my_id) s.cache.erase(it);  // let a later call retry
      }
      promise.set_exception(std::current_exception());
    }
  }
  const std::shared_ptr<const Chunk> chunk = future.get();  // rethrows the reader's error
  const int64_t row = index - c * chunk_rows_;
  Example ex;
  for (size_t k = 0; k < s.fields.size(); ++k) {
    const auto& field = s.fields[k];
    ex.add(names_[k],
           internal::from_blob(chunk->fields[k].data() + row * field.row_bytes, field.row_shape, field.dtype));
  }
  return ex;
}

void write_hdf5_arrays(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& arrays) {
  const std::string file = path.string();
  std::vector<Tensor> hosts;  // contiguous host copies, made before taking the HDF5 lock
  for (const auto& [name, t] : arrays) {
    KILN_CHECK(t.defined(), "write_hdf5_arrays(", file, "): the tensor for '", name, "' is undefined");
    hosts.push_back(internal::contiguous(internal::to(t, Device::cpu())));
  }
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  QuietErrors quiet;
  Handle f(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  KILN_CHECK(f.ok(), "write_hdf5_arrays: cannot create ", file, " (does its folder exist, and may we write there?)");
  Handle link_props(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(link_props.get(), 1);
  for (size_t k = 0; k < arrays.size(); ++k) {
    const std::string& name = arrays[k].first;
    const Tensor& t = hosts[k];
    std::vector<hsize_t> dims(t.shape().begin(), t.shape().end());
    Handle space(
        dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
        H5Sclose);
    Handle type = memory_type(t.dtype());
    Handle dataset(
        H5Dcreate2(f.get(), name.c_str(), type.get(), space.get(), link_props.get(), H5P_DEFAULT, H5P_DEFAULT),
        H5Dclose);
    KILN_CHECK(dataset.ok(), "write_hdf5_arrays: cannot create dataset '", name, "' in ", file,
               " (a duplicate or invalid name?)");
    KILN_CHECK(
        t.numel() == 0 || H5Dwrite(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr<void>()) >= 0,
        "write_hdf5_arrays: writing dataset '", name, "' to ", file, " failed (disk full?)");
  }
  KILN_CHECK(H5Fflush(f.get(), H5F_SCOPE_GLOBAL) >= 0, "write_hdf5_arrays: flushing ", file, " failed (disk full?)");
}

}  // namespace kiln::data
