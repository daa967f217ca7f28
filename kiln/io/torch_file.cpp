// kiln/io/torch_file.cpp — torch.save's zip layout (<archive>/data.pkl, <archive>/data/<key>,
// <archive>/byteorder) and the allow-list of globals the pickle may name.
#include "kiln/io/torch_file.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <new>  // std::bad_alloc

#include "kiln/io/pickle_reader.h"
#include "kiln/io/zip_reader.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"  // internal::empty

namespace kiln::io {
namespace {

using Kind = PyObj::Kind;

// torch.<X>Storage and the dtype objects torch.float32 ... as kiln dtypes.
const std::map<std::string, DType>& storage_types() {
  static const std::map<std::string, DType> m = {
      {"FloatStorage", DType::Float32},     {"DoubleStorage", DType::Float64}, {"HalfStorage", DType::Float16},
      {"BFloat16Storage", DType::BFloat16}, {"LongStorage", DType::Int64},     {"IntStorage", DType::Int32},
      {"ByteStorage", DType::UInt8},        {"BoolStorage", DType::Bool},      {"UntypedStorage", DType::UInt8}};
  return m;
}
const std::map<std::string, DType>& dtype_globals() {
  static const std::map<std::string, DType> m = {
      {"float32", DType::Float32}, {"float", DType::Float32}, {"float64", DType::Float64},   {"double", DType::Float64},
      {"float16", DType::Float16}, {"half", DType::Float16},  {"bfloat16", DType::BFloat16}, {"int64", DType::Int64},
      {"long", DType::Int64},      {"int32", DType::Int32},   {"int", DType::Int32},         {"uint8", DType::UInt8},
      {"bool", DType::Bool}};
  return m;
}

class Loader {
 public:
  explicit Loader(const std::string& path) : path_(path) { check_not_legacy(); }

  TorchFile load() {
    zip_ = std::make_unique<ZipReader>(path_);
    std::string pkl_name;
    for (const auto& e : zip_->entries()) {
      const std::string suffix = "data.pkl";
      if (e.name.size() >= suffix.size() && e.name.compare(e.name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
          (e.name.size() == suffix.size() || e.name[e.name.size() - suffix.size() - 1] == '/')) {
        pkl_name = e.name;
        break;
      }
    }
    if (pkl_name.empty()) {
      bool torchscript = false;
      for (const auto& e : zip_->entries())
        torchscript |= e.name.find("constants.pkl") != std::string::npos || e.name.find("/code/") != std::string::npos;
      KILN_CHECK(!torchscript, path_,
                 ": a TorchScript archive (torch.jit.save), not a torch.save file; in Python, save the weights with "
                 "torch.save(model.state_dict(), path)");
      KILN_FAIL(path_, ": a zip archive without data.pkl, so not a torch.save file");
    }
    prefix_ = pkl_name.substr(0, pkl_name.size() - 8);
    if (zip_->contains(prefix_ + "byteorder")) {
      const std::string order = zip_->read(prefix_ + "byteorder");
      KILN_CHECK(order == "little", path_, ": the tensors are stored ", order,
                 "-endian; kiln reads little-endian files only (save the file on a little-endian machine, e.g. "
                 "x86-64 or ARM)");
    }
    PickleHooks hooks;
    hooks.find_global = [this](const std::string& m, const std::string& n) { return find_global(m, n); };
    hooks.reduce = [this](const PyRef& c, const PyRef& a) { return reduce(c, a); };
    hooks.persistent_load = [this](const PyRef& pid) { return persistent_load(pid); };
    // The pickle itself counts against the unpickler's budget: refused before it is inflated.
    const uint64_t budget = max_unpickle_bytes();
    KILN_CHECK(zip_->entry(pkl_name).size <= budget, path_, ": ", pkl_name, " is ", zip_->entry(pkl_name).size,
               " bytes uncompressed, more than the unpickler's budget of ", budget,
               " bytes; a state dict's pickle takes a few KB per tensor, so the file is corrupt or hostile. If it is "
               "genuine, raise the budget with kiln::io::set_max_unpickle_bytes(n)");
    Unpickled pickled = unpickle(zip_->read(pkl_name), hooks, path_ + ": " + pkl_name, budget);
    TorchFile out;
    flatten(pickled.root, "", out, 0);
    return out;
  }

 private:
  void check_not_legacy() {
    std::error_code ec;
    KILN_CHECK(std::filesystem::is_regular_file(path_, ec), path_, ": no such file");
    std::ifstream in(path_, std::ios::binary);
    KILN_CHECK(in.is_open(), path_, ": cannot open the file (missing, or not readable)");
    unsigned char head[4] = {0, 0, 0, 0};
    in.read(reinterpret_cast<char*>(head), 4);
    // The legacy format starts with a pickled magic number: PROTO 2, LONG1 of 10 bytes.
    KILN_CHECK(!(head[0] == 0x80 && head[1] == 0x02 && head[2] == 0x8a && head[3] == 0x0a), path_,
               ": saved in PyTorch's legacy format (before 1.6), which kiln does not read; in Python, load it and "
               "save it again with torch.save(obj, path) (the zip format is the default since PyTorch 1.6)");
  }

  [[noreturn]] void refuse(const std::string& what) const {
    KILN_FAIL(path_, ": unsupported pickled object ", what,
              ": kiln reads tensors and (nested) dicts of tensors only; it never runs pickled code");
  }

  PyRef global(const std::string& name, DType dtype = DType::Float32) {
    auto g = PyObj::make(Kind::Global);
    g->s = name;
    g->dtype = dtype;
    return g;
  }

  PyRef find_global(const std::string& module, const std::string& name) {
    const std::string full = module + "." + name;
    if (full == "collections.OrderedDict" || full == "torch._utils._rebuild_tensor_v2" ||
        full == "torch._utils._rebuild_tensor_v3" || full == "torch._utils._rebuild_parameter" ||
        full == "torch._utils._rebuild_parameter_with_state")
      return global(full);
    if (module == "torch" || module == "torch.storage") {
      if (auto it = storage_types().find(name); it != storage_types().end()) return global("torch." + name, it->second);
      if (auto it = dtype_globals().find(name); it != dtype_globals().end() && module == "torch") {
        auto d = PyObj::make(Kind::DType);
        d->dtype = it->second;
        d->s = full;
        return d;
      }
    }
    refuse(full);
  }

  PyRef persistent_load(const PyRef& pid) {
    KILN_CHECK(pid->kind == Kind::Tuple && pid->items.size() == 5 && pid->items[0]->kind == Kind::Str &&
                   pid->items[0]->s == "storage" && pid->items[1]->kind == Kind::Global &&
                   pid->items[1]->s.find("Storage") != std::string::npos && pid->items[2]->kind == Kind::Str &&
                   pid->items[4]->kind == Kind::Int,
               path_, ": unsupported persistent id in data.pkl (expected ('storage', type, key, location, numel))");
    const DType dtype = pid->items[1]->dtype;
    const std::string& key = pid->items[2]->s;
    const int64_t numel = pid->items[4]->i;
    const std::string entry_name = prefix_ + "data/" + key;
    KILN_CHECK(zip_->contains(entry_name), path_, ": storage '", key, "' is missing from the archive (no entry '",
               entry_name, "'); the file is incomplete or corrupt");
    const ZipEntry& e = zip_->entry(entry_name);
    KILN_CHECK(numel >= 0 && static_cast<uint64_t>(numel) <= e.size / element_size(dtype) &&
                   static_cast<uint64_t>(numel) * element_size(dtype) == e.size,
               path_, ": storage '", key, "' should hold ", numel, " elements of ", element_size(dtype),
               " bytes, but its entry has ", e.size, " bytes; the file is corrupt");
    auto it = storages_.find(key);
    if (it == storages_.end()) {
      Tensor bytes = internal::empty({static_cast<int64_t>(e.size)}, {.dtype = DType::UInt8});  // (nbytes) uint8
      zip_->read_into(e, bytes.data_ptr(), e.size);
      it = storages_.emplace(key, bytes).first;
    }
    auto s = PyObj::make(Kind::Storage);
    s->s = key;
    s->dtype = dtype;
    s->i = numel;
    s->tensor = it->second;
    return s;
  }

  std::vector<int64_t> int_tuple(const PyRef& o, const char* what) const {
    KILN_CHECK(o->kind == Kind::Tuple || o->kind == Kind::List, path_, ": bad tensor ", what, " in data.pkl");
    std::vector<int64_t> v;
    for (const auto& x : o->items) {
      KILN_CHECK(x->kind == Kind::Int && x->i >= 0, path_, ": bad tensor ", what, " in data.pkl");
      v.push_back(x->i);
    }
    return v;
  }

  // A view with the file's size, stride and offset over the storage's bytes, reinterpreted as dtype.
  PyRef rebuild_tensor(const std::vector<PyRef>& a, std::optional<DType> v3_dtype) {
    KILN_CHECK(a.size() >= 4 && a[0]->kind == Kind::Storage && a[1]->kind == Kind::Int, path_,
               ": bad arguments to torch._utils._rebuild_tensor in data.pkl");
    const PyRef& storage = a[0];
    const DType dtype = v3_dtype.value_or(storage->dtype);
    const int64_t offset = a[1]->i;
    const Shape sizes = int_tuple(a[2], "size");
    const Strides strides = int_tuple(a[3], "stride");
    KILN_CHECK(sizes.size() == strides.size() && offset >= 0, path_, ": bad tensor geometry in data.pkl (",
               sizes.size(), " sizes, ", strides.size(), " strides, offset ", offset, ")");
    const uint64_t storage_bytes = static_cast<uint64_t>(storage->tensor.numel());
    KILN_CHECK(storage_bytes % element_size(dtype) == 0, path_, ": storage '", storage->s, "' (", storage_bytes,
               " bytes) does not hold whole elements of ", element_size(dtype), " bytes");
    const int64_t available = static_cast<int64_t>(storage_bytes / element_size(dtype));
    // The last element reached: offset + sum (size - 1) * stride, with overflow checks.
    int64_t last = offset, count = 1;
    bool overflow = false;
    for (size_t d = 0; d < sizes.size(); ++d) {
      int64_t step = 0;
      overflow |= __builtin_mul_overflow(count, sizes[d], &count);
      if (sizes[d] > 0) overflow |= __builtin_mul_overflow(sizes[d] - 1, strides[d], &step);
      overflow |= __builtin_add_overflow(last, step, &last);
    }
    KILN_CHECK(!overflow && (count == 0 || last < available), path_, ": a tensor of size ", sizes, ", stride ", strides,
               " and offset ", offset, " reaches past its storage '", storage->s, "' (", available,
               " elements); the file is corrupt");
    auto t = PyObj::make(Kind::Tensor);
    t->tensor = Tensor(std::make_shared<TensorImpl>(storage->tensor.impl().storage(), dtype, sizes, strides, offset));
    return t;
  }

  PyRef reduce(const PyRef& callable, const PyRef& args) {
    const auto& a = args->items;
    if (callable->kind != Kind::Global) refuse("call of " + callable->repr());
    const std::string& f = callable->s;
    if (f == "collections.OrderedDict") {
      KILN_CHECK(a.empty(), path_, ": OrderedDict with constructor arguments is not supported");
      return PyObj::make(Kind::Dict);
    }
    if (f == "torch._utils._rebuild_tensor_v2") return rebuild_tensor(a, std::nullopt);
    if (f == "torch._utils._rebuild_tensor_v3") {
      KILN_CHECK(a.size() >= 7 && a[6]->kind == Kind::DType, path_, ": bad arguments to _rebuild_tensor_v3");
      return rebuild_tensor(a, a[6]->dtype);
    }
    if (f == "torch._utils._rebuild_parameter" || f == "torch._utils._rebuild_parameter_with_state") {
      KILN_CHECK(!a.empty() && a[0]->kind == Kind::Tensor, path_, ": bad arguments to ", f);
      return a[0];
    }
    refuse(f + " (called)");
  }

  void flatten(const PyRef& o, const std::string& name, TorchFile& out, int depth) const {
    // State dicts nest a few levels; a self-referencing (memo) or absurdly deep structure is refused.
    KILN_CHECK(depth <= 100, path_, ": data.pkl nests dicts and lists more than 100 levels deep (at '",
               name.substr(0, 200), "...'); not a state dict or checkpoint kiln reads");
    auto join = [&](const std::string& k) { return name.empty() ? k : name + "." + k; };
    switch (o->kind) {
      case Kind::Tensor: out.tensors.emplace_back(name, o->tensor); return;
      case Kind::Dict:
        for (const auto& [k, v] : o->dict) {
          KILN_CHECK(k->kind == Kind::Str || k->kind == Kind::Int, path_, ": a dict key of type ", k->repr(),
                     " under '", name, "'; kiln reads string and integer keys");
          flatten(v, join(k->kind == Kind::Str ? k->s : std::to_string(k->i)), out, depth + 1);
        }
        return;
      case Kind::List:
      case Kind::Tuple:
        for (size_t i = 0; i < o->items.size(); ++i) flatten(o->items[i], join(std::to_string(i)), out, depth + 1);
        return;
      default: out.other.emplace_back(name, o->repr());
    }
  }

  std::string path_;
  std::unique_ptr<ZipReader> zip_;
  std::string prefix_;
  std::map<std::string, Tensor> storages_;  // key -> (nbytes) uint8, shared by every tensor over it
};

}  // namespace

TorchFile read_torch_file(const std::string& path) {
  try {
    return Loader(path).load();
  } catch (const std::bad_alloc&) {  // anything not already a kiln error names the file here
    throw OutOfMemoryError(path +
                           ": out of host memory while reading the file; free memory, or check that the "
                           "file is a genuine torch.save file");
  }
}

NamedTensors load_torch_file(const std::string& path) { return read_torch_file(path).tensors; }

}  // namespace kiln::io
