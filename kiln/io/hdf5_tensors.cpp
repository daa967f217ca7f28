// kiln/io/hdf5_tensors.cpp — H5File: checksummed tensors and typed attributes in an HDF5 file. Every HDF5 call
// runs under data::hdf5_mutex() with HDF5's error printing silenced; failures become kiln::Errors that quote
// the innermost message of HDF5's error stack.
#include "kiln/io/hdf5_tensors.h"

#include <hdf5.h>  // the HDF5 C API
#include <zlib.h>  // crc32

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <type_traits>
#include <utility>

#include "kiln/data/datasets/hdf5_dataset.h"  // data::hdf5_mutex
#include "kiln/data/hdf5/hdf5_util.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::io {

static_assert(std::is_same_v<hid_t, int64_t>, "kiln stores hid_t as int64_t (HDF5 >= 1.10)");

namespace {

using data::hdf5::half_type;
using data::hdf5::Handle;
using data::hdf5::QuietErrors;

// The lock and the silence every public method takes, in this order.
struct Guard {
  std::lock_guard<std::mutex> lock{data::hdf5_mutex()};
  QuietErrors quiet;
};

// The innermost (first) description of the current HDF5 error stack: the most specific reason.
std::string hdf5_reason() {
  std::string reason;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
        if (n == 0 && e->desc != nullptr) *static_cast<std::string*>(out) = e->desc;
        return 0;
      },
      &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? "no reason given" : reason;
}

// Throws naming the file, the action and HDF5's reason when `ok` is false.
void check(bool ok, const std::string& path, const std::string& what) {
  if (!ok) KILN_FAIL(path, ": HDF5 could not ", what, " (", hdf5_reason(), ")");
}

Handle checked(hid_t id, herr_t (*close)(hid_t), const std::string& path, const std::string& what) {
  check(id >= 0, path, what);
  return Handle(id, close);
}

// bool as h5py's enum (int8 base; FALSE = 0, TRUE = 1).
Handle bool_type() {
  Handle t(H5Tenum_create(H5T_NATIVE_INT8), H5Tclose);
  int8_t no = 0, yes = 1;
  H5Tenum_insert(t.get(), "FALSE", &no);
  H5Tenum_insert(t.get(), "TRUE", &yes);
  return t;
}

// The little-endian type a dtype is stored as (also the memory type: kiln runs on little-endian hosts).
Handle stored_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return Handle(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    case DType::Float64: return Handle(H5Tcopy(H5T_IEEE_F64LE), H5Tclose);
    case DType::Float16: return half_type();
    case DType::BFloat16: return Handle(H5Tcopy(H5T_STD_U16LE), H5Tclose);
    case DType::Int64: return Handle(H5Tcopy(H5T_STD_I64LE), H5Tclose);
    case DType::Int32: return Handle(H5Tcopy(H5T_STD_I32LE), H5Tclose);
    case DType::UInt8: return Handle(H5Tcopy(H5T_STD_U8LE), H5Tclose);
    case DType::Bool: return bool_type();
    case DType::Float8_e4m3fn:
    case DType::Float8_e5m2: return Handle(H5Tcopy(H5T_STD_U8LE), H5Tclose);  // the raw codes, + a dtype attribute
  }
  KILN_FAIL("H5File: unsupported dtype ", dtype_name(dtype));
}

// The dtypes stored as raw unsigned codes with a dataset attribute dtype="<name>" (h5py has no type for them).
bool stored_with_dtype_attr(DType t) { return t == DType::BFloat16 || is_float8(t); }

// The dtype of a stored type (and the dataset's dtype attribute, "" when it has none), or throws naming the dataset.
DType dtype_of_type(hid_t type, const std::string& dtype_attr, const std::string& where) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    for (DType t : {DType::BFloat16, DType::Float8_e4m3fn, DType::Float8_e5m2}) {
      if (dtype_attr == dtype_name(t) && size == element_size(t) && !is_signed) return t;
    }
    KILN_CHECK(dtype_attr.empty() || dtype_attr == "uint8" || dtype_attr == "int32" || dtype_attr == "int64", where,
               ": the dtype attribute says '", dtype_attr, "' but the data is stored as ", size, "-byte ",
               is_signed ? "signed" : "unsigned",
               " integers; the file was not written by kiln or is damaged (kiln stores bfloat16 as uint16, float8 "
               "as uint8)");
    if (size == 8 && is_signed) return DType::Int64;
    if (size == 4 && is_signed) return DType::Int32;
    if (size == 1 && !is_signed) return DType::UInt8;
  } else if (cls == H5T_FLOAT) {
    if (size == 4) return DType::Float32;
    if (size == 8) return DType::Float64;
    if (size == 2 && H5Tget_ebias(type) == 15) return DType::Float16;
  } else if (cls == H5T_ENUM && size == 1) {
    return DType::Bool;
  }
  KILN_FAIL(where, ": stored type (HDF5 class ", static_cast<int>(cls), ", ", size,
            " bytes) is not one kiln reads (float16/32/64, bfloat16, float8_e4m3fn/e5m2, int32/64, uint8, bool)");
}

std::string join(const std::string& group, const std::string& name) {
  return group == "/" ? "/" + name : group + "/" + name;
}

// Opens a group or dataset by absolute path.
Handle open_object(hid_t file, const std::string& path, const std::string& file_path) {
  return checked(H5Oopen(file, path.c_str(), H5P_DEFAULT), H5Oclose, file_path, "open " + path);
}

bool link_exists(hid_t file, const std::string& path) {
  if (path == "/") return true;
  // Each prefix must exist before H5Lexists may be asked about the next one.
  size_t pos = 0;
  while ((pos = path.find('/', pos + 1)) != std::string::npos) {
    if (H5Lexists(file, path.substr(0, pos).c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0;
}

// H5I_GROUP, H5I_DATASET, or H5I_BADID when there is no such object.
H5I_type_t object_type(hid_t file, const std::string& path) {
  if (!link_exists(file, path)) return H5I_BADID;
  Handle obj(H5Oopen(file, path.c_str(), H5P_DEFAULT), H5Oclose);
  return obj.ok() ? H5Iget_type(obj.get()) : H5I_BADID;
}

Handle open_attr(hid_t file, const std::string& object, const std::string& name, const std::string& file_path) {
  Handle obj = open_object(file, object, file_path);
  check(H5Aexists(obj.get(), name.c_str()) > 0, file_path, "find attribute " + name + " of " + object);
  return checked(H5Aopen(obj.get(), name.c_str(), H5P_DEFAULT), H5Aclose, file_path,
                 "open attribute " + name + " of " + object);
}

template <typename T>
void write_scalar_attr(hid_t file, const std::string& object, const std::string& name, hid_t type, const T* value,
                       const std::string& file_path) {
  const std::string what = "write attribute " + name + " of " + object;
  Handle obj = open_object(file, object, file_path);
  if (H5Aexists(obj.get(), name.c_str()) > 0) check(H5Adelete(obj.get(), name.c_str()) >= 0, file_path, what);
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr = checked(H5Acreate2(obj.get(), name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                        file_path, what);
  check(H5Awrite(attr.get(), type, value) >= 0, file_path, what);
}

// Strings are stored fixed-length (UTF-8, null-padded): variable-length strings live in HDF5's global heap,
// whose reader (H5HG_read in HDF5 1.10) hangs or overruns on forged files (fuzz/README.md), so kiln neither
// writes nor reads them.
Handle string_type(size_t size) {
  Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), std::max<size_t>(size, 1));
  H5Tset_strpad(t.get(), H5T_STR_NULLPAD);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}
// The longest string attribute kiln reads (configuration text included).
constexpr size_t kMaxStringAttr = size_t{16} << 20;

// Reads a 1-element numeric attribute converted to `mem_type`.
template <typename T>
T read_numeric_attr(hid_t file, const std::string& object, const std::string& name, hid_t mem_type, bool integers_only,
                    const std::string& file_path) {
  Handle attr = open_attr(file, object, name, file_path);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  Handle space(H5Aget_space(attr.get()), H5Sclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  KILN_CHECK(
      (cls == H5T_INTEGER || (!integers_only && cls == H5T_FLOAT)) && H5Sget_simple_extent_npoints(space.get()) == 1,
      file_path, ": attribute ", name, " of ", object, " is not ", integers_only ? "an integer" : "a number",
      "; the file is not a kiln checkpoint or is damaged");
  T value{};
  check(H5Aread(attr.get(), mem_type, &value) >= 0, file_path, "read attribute " + name + " of " + object);
  return value;
}

}  // namespace

uint32_t crc32_bytes(const void* data, size_t size, uint32_t start) {
  uLong crc = start;  // crc32(0L, Z_NULL, 0) is 0
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {  // zlib takes uInt lengths
    const uInt n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = crc32(crc, p, n);
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(crc);
}

H5File::H5File(std::string path, Mode mode, uint64_t user_block)
    : path_(std::move(path)), writable_(mode != Mode::Read) {
  Guard guard;
  if (mode == Mode::Create) {
    Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
    Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    check(H5Pset_userblock(fcpl.get(), user_block) >= 0, path_,
          "set a user block of " + std::to_string(user_block) + " bytes (0 or a power of 2 from 512)");
    file_ = H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
    check(file_ >= 0, path_, "create the file (is the folder there and writable?)");
    return;
  }
  std::error_code ec;
  KILN_CHECK(std::filesystem::exists(path_, ec), path_, ": no such file");
  KILN_CHECK(std::filesystem::file_size(path_, ec) > 0 && !ec, path_, ": the file is empty (not an HDF5 file)");
  KILN_CHECK(H5Fis_hdf5(path_.c_str()) > 0, path_,
             ": not an HDF5 file (no HDF5 signature; the file is damaged, truncated, or of another format)");
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
  file_ = H5Fopen(path_.c_str(), mode == Mode::Read ? H5F_ACC_RDONLY : H5F_ACC_RDWR, fapl.get());
  check(file_ >= 0, path_, "open the file (truncated or damaged?)");
}

H5File::~H5File() {
  if (file_ < 0) return;
  Guard guard;
  H5Fclose(file_);
}

void H5File::close() {
  if (file_ < 0) return;
  Guard guard;
  const hid_t f = std::exchange(file_, -1);
  const bool flushed = !writable_ || H5Fflush(f, H5F_SCOPE_GLOBAL) >= 0;
  const std::string reason = flushed ? "" : hdf5_reason();
  const bool closed = H5Fclose(f) >= 0;
  KILN_CHECK(flushed, path_, ": HDF5 could not flush the file (", reason, "); is the disk full?");
  check(closed, path_, "close the file");
}

void H5File::create_group(const std::string& group) {
  Guard guard;
  if (link_exists(file_, group)) return;
  Handle props(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(props.get(), 1);
  checked(H5Gcreate2(file_, group.c_str(), props.get(), H5P_DEFAULT, H5P_DEFAULT), H5Gclose, path_,
          "create group " + group);
}

bool H5File::has_group(const std::string& group) const {
  Guard guard;
  return object_type(file_, group) == H5I_GROUP;
}

bool H5File::has_dataset(const std::string& group, const std::string& name) const {
  Guard guard;
  return object_type(file_, join(group, name)) == H5I_DATASET;
}

std::vector<std::string> H5File::children(const std::string& group) const {
  Guard guard;
  Handle g = checked(H5Gopen2(file_, group.c_str(), H5P_DEFAULT), H5Gclose, path_, "open group " + group);
  H5G_info_t info;
  check(H5Gget_info(g.get(), &info) >= 0, path_, "list group " + group);
  std::vector<std::string> names;
  for (hsize_t k = 0; k < info.nlinks; ++k) {
    const ssize_t n = H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, k, nullptr, 0, H5P_DEFAULT);
    check(n >= 0, path_, "list group " + group);
    std::string name(static_cast<size_t>(n), '\0');
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, k, name.data(), name.size() + 1, H5P_DEFAULT);
    names.push_back(std::move(name));
  }
  return names;
}

void H5File::write_tensor(const std::string& group, const std::string& name, const Tensor& tensor) {
  const std::string where = path_ + ": tensor " + join(group, name);
  KILN_CHECK(tensor.defined(), where, " is undefined; only defined tensors can be saved");
  KILN_CHECK(name.find('/') == std::string::npos && !name.empty(), where,
             ": a dataset name must be non-empty and hold no '/'");
  // (...) any device and layout -> contiguous host bytes, copied before the lock (a GPU copy may take a while).
  Tensor host = tensor.detach().to(Device::cpu()).contiguous();
  const size_t nbytes = host.nbytes();
  const uint32_t crc = crc32_bytes(host.data_ptr(), nbytes);
  Guard guard;
  std::vector<hsize_t> dims(host.sizes().begin(), host.sizes().end());
  Handle space(
      dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
      H5Sclose);
  check(space.ok(), path_, "describe the shape of " + join(group, name));
  Handle type = stored_type(host.dtype());
  Handle g = checked(H5Gopen2(file_, group.c_str(), H5P_DEFAULT), H5Gclose, path_, "open group " + group);
  Handle ds = checked(H5Dcreate2(g.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      H5Dclose, path_, "create dataset " + join(group, name));
  if (nbytes > 0) {
    check(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data_ptr()) >= 0, path_,
          "write dataset " + join(group, name) + " (is the disk full?)");
  }
  Handle scalar(H5Screate(H5S_SCALAR), H5Sclose);
  Handle crc_attr = checked(H5Acreate2(ds.get(), "crc32", H5T_STD_U32LE, scalar.get(), H5P_DEFAULT, H5P_DEFAULT),
                            H5Aclose, path_, "write the crc32 of " + join(group, name));
  check(H5Awrite(crc_attr.get(), H5T_NATIVE_UINT32, &crc) >= 0, path_, "write the crc32 of " + join(group, name));
  if (stored_with_dtype_attr(host.dtype())) {
    const std::string value(dtype_name(host.dtype()));
    Handle st = string_type(value.size());
    Handle a = checked(H5Acreate2(ds.get(), "dtype", st.get(), scalar.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose, path_,
                       "write the dtype of " + join(group, name));
    check(H5Awrite(a.get(), st.get(), value.data()) >= 0, path_, "write the dtype of " + join(group, name));
  }
}

TensorInfo H5File::tensor_info(const std::string& group, const std::string& name) const {
  const std::string p = join(group, name);
  const std::string dtype_attr =
      has_attr(p, "dtype") && attr_is_string(p, "dtype") ? attr_string(p, "dtype") : std::string();
  Guard guard;
  Handle ds = checked(H5Dopen2(file_, p.c_str(), H5P_DEFAULT), H5Dclose, path_, "open dataset " + p);
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  check(rank >= 0, path_, "read the shape of " + p);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  Handle type(H5Dget_type(ds.get()), H5Tclose);
  TensorInfo info{dtype_of_type(type.get(), dtype_attr, path_ + ": tensor " + p), {}};
  for (hsize_t d : dims) info.shape.push_back(static_cast<int64_t>(d));
  return info;
}

Tensor H5File::read_tensor(const std::string& group, const std::string& name) const {
  const std::string p = join(group, name);
  const TensorInfo info = tensor_info(group, name);
  KILN_CHECK(has_attr(p, "crc32"), path_, ": tensor ", p, " has no crc32 attribute; not written by kiln");
  const auto expected = static_cast<uint32_t>(attr_uint(p, "crc32"));
  // kiln stores tensors contiguous and uncompressed: a shape whose bytes exceed the file's is a damaged or
  // hostile file, refused before allocating (a forged shape could ask for terabytes).
  uint64_t nbytes = element_size(info.dtype);
  bool overflow = false;
  for (int64_t d : info.shape) {
    overflow = overflow || d < 0 || __builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes);
  }
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path_, ec);
  KILN_CHECK(!overflow && !ec && nbytes <= file_bytes, path_, ": tensor ", p, " has shape ", info.shape,
             ", more bytes than the whole file holds (", file_bytes, "); the file is damaged");
  Tensor out = internal::empty(info.shape, {.dtype = info.dtype});
  {
    Guard guard;
    Handle ds = checked(H5Dopen2(file_, p.c_str(), H5P_DEFAULT), H5Dclose, path_, "open dataset " + p);
    Handle type = stored_type(info.dtype);
    if (out.nbytes() > 0) {
      check(H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data_ptr()) >= 0, path_,
            "read dataset " + p + " (truncated or damaged file?)");
    }
  }
  const uint32_t actual = crc32_bytes(out.data_ptr(), out.nbytes());
  KILN_CHECK(actual == expected, path_, ": tensor ", p, " fails its checksum (crc32 ", actual, ", stored ", expected,
             "): the file is corrupted; use another checkpoint");
  return out;
}

void H5File::set_attr(const std::string& object, const std::string& name, double value) {
  Guard guard;
  write_scalar_attr(file_, object, name, H5T_IEEE_F64LE, &value, path_);
}
void H5File::set_attr(const std::string& object, const std::string& name, int64_t value) {
  Guard guard;
  write_scalar_attr(file_, object, name, H5T_STD_I64LE, &value, path_);
}
void H5File::set_attr(const std::string& object, const std::string& name, uint64_t value) {
  Guard guard;
  write_scalar_attr(file_, object, name, H5T_STD_U64LE, &value, path_);
}
void H5File::set_attr(const std::string& object, const std::string& name, const std::string& value) {
  Guard guard;
  Handle type = string_type(value.size());
  write_scalar_attr(file_, object, name, type.get(), value.data(), path_);
}

bool H5File::has_attr(const std::string& object, const std::string& name) const {
  Guard guard;
  if (!link_exists(file_, object)) return false;
  return H5Aexists_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT) > 0;
}

std::vector<std::string> H5File::attr_names(const std::string& object) const {
  Guard guard;
  Handle obj = open_object(file_, object, path_);
  std::vector<std::string> names;
  hsize_t index = 0;
  check(H5Aiterate2(
            obj.get(), H5_INDEX_NAME, H5_ITER_INC, &index,
            [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
              static_cast<std::vector<std::string>*>(out)->push_back(name);
              return 0;
            },
            &names) >= 0,
        path_, "list the attributes of " + object);
  return names;
}

bool H5File::attr_is_string(const std::string& object, const std::string& name) const {
  Guard guard;
  Handle attr = open_attr(file_, object, name, path_);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  return H5Tget_class(type.get()) == H5T_STRING;
}

double H5File::attr_double(const std::string& object, const std::string& name) const {
  Guard guard;
  return read_numeric_attr<double>(file_, object, name, H5T_NATIVE_DOUBLE, false, path_);
}
int64_t H5File::attr_int(const std::string& object, const std::string& name) const {
  Guard guard;
  return read_numeric_attr<int64_t>(file_, object, name, H5T_NATIVE_INT64, true, path_);
}
uint64_t H5File::attr_uint(const std::string& object, const std::string& name) const {
  Guard guard;
  return read_numeric_attr<uint64_t>(file_, object, name, H5T_NATIVE_UINT64, true, path_);
}

std::string H5File::attr_string(const std::string& object, const std::string& name) const {
  Guard guard;
  Handle attr = open_attr(file_, object, name, path_);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  Handle space(H5Aget_space(attr.get()), H5Sclose);
  KILN_CHECK(H5Tget_class(type.get()) == H5T_STRING && H5Sget_simple_extent_npoints(space.get()) == 1, path_,
             ": attribute ", name, " of ", object, " is not a string");
  KILN_CHECK(H5Tis_variable_str(type.get()) == 0, path_, ": attribute ", name, " of ", object,
             " is a variable-length string, which kiln does not write: the file was not written by kiln or is damaged");
  const size_t size = H5Tget_size(type.get());
  KILN_CHECK(size > 0 && size <= kMaxStringAttr, path_, ": attribute ", name, " of ", object, " claims ", size,
             " bytes: the file is damaged");
  std::string out(size, '\0');
  check(H5Aread(attr.get(), type.get(), out.data()) >= 0, path_, "read attribute " + name + " of " + object);
  out.resize(out.find('\0') == std::string::npos ? out.size() : out.find('\0'));
  return out;
}

}  // namespace kiln::io
