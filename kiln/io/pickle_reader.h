// kiln/io/pickle_reader.h — a restricted unpickler: Python's pickle protocol 2 (and the protocol-4 opcodes
// FRAME, MEMOIZE, SHORT_BINUNICODE, STACK_GLOBAL), building plain values only. It never runs code: globals
// and REDUCE are answered by the caller's hooks (torch_file.cpp allows a handful of torch rebuild functions
// and refuses everything else).
//
//   io::PickleHooks hooks{.find_global = ..., .reduce = ..., .persistent_load = ...};
//   io::PyRef root = io::unpickle(bytes, hooks, "model.pth: archive/data.pkl");
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::io {

struct PyObj;
// A shared reference to an unpickled object, as Python's references are.
using PyRef = std::shared_ptr<PyObj>;

// One Python object built by the unpickler: `kind` says which of the fields below hold its value.
struct PyObj {
  // The object's type; Global: a class or function named by module and name; Storage, Tensor, DType: torch's.
  enum class Kind { None, Bool, Int, Float, Str, Bytes, List, Tuple, Dict, Global, Storage, Tensor, DType };
  Kind kind = Kind::None;                     // which fields hold the value
  bool b = false;                             // Bool
  int64_t i = 0;                              // Int; Storage: numel
  double f = 0;                               // Float
  std::string s;                              // Str, Bytes; Global: "module.name"; Storage: its key
  std::vector<PyRef> items;                   // List, Tuple
  std::vector<std::pair<PyRef, PyRef>> dict;  // Dict, in insertion order
  Tensor tensor;                              // Tensor
  kiln::DType dtype = kiln::DType::Float32;   // Storage, DType

  // A new object of kind k, its fields at their defaults.
  static PyRef make(Kind k) {
    auto o = std::make_shared<PyObj>();
    o->kind = k;
    return o;
  }
  // A short description for error messages and skipped leaves: "3", "'abc'", "list of 2", ...
  std::string repr() const;
};

// What the unpickler asks its caller for: the opcodes that name code or outside data (torch_file.h fills them in).
struct PickleHooks {
  // A GLOBAL / STACK_GLOBAL: return the object it names (usually a Kind::Global), or throw.
  std::function<PyRef(const std::string& module, const std::string& name)> find_global;
  // REDUCE: call `callable` (what find_global returned) with the tuple `args`.
  std::function<PyRef(const PyRef& callable, const PyRef& args)> reduce;
  // BINPERSID: the object a persistent id stands for.
  std::function<PyRef(const PyRef& pid)> persistent_load;
};

// Every list, tuple and dict an unpickling made. Its destructor empties them one by one, so that the deeply
// nested or cyclic (through the memo) structures a hostile pickle can build are freed without deep recursion
// and without leaking.
struct PyArena {
  std::vector<PyRef> containers;          // the lists, tuples and dicts, each once
  std::unordered_set<const PyObj*> seen;  // those in containers
  // Records o if it is a list, tuple or dict not recorded yet; other objects are ignored.
  void add(const PyRef& o);
  PyArena() = default;
  PyArena(PyArena&&) = default;             // takes over the containers
  PyArena& operator=(PyArena&&) = default;  // takes over the containers
  ~PyArena();
};

// What unpickle returns: the pickle's top object and the arena that frees what it holds.
struct Unpickled {
  PyRef root;     // the object the pickle's STOP returned
  PyArena arena;  // declared after root: destroyed first, unlinking what root holds
};

// Memory budget of one unpickling (DESIGN.md rule 11). A pickle is a program: a few KB of opcodes (or a few
// KB of deflated data.pkl) can ask for gigabytes of objects. The unpickler charges what it builds — every
// object (~200 bytes), every string's bytes, every stack, memo and container slot — against this budget and
// refuses, naming the data, past it. A state dict's pickle takes a few KB per tensor, so the default (2 GiB)
// is far above any real checkpoint; io::set_max_unpickle_bytes raises it (process-wide).
inline constexpr uint64_t kDefaultMaxUnpickleBytes = uint64_t{2} << 30;
uint64_t max_unpickle_bytes();                // the current budget, process-wide
void set_max_unpickle_bytes(uint64_t bytes);  // sets the budget, process-wide; kiln::Error if bytes is 0

// what: names the data in error messages ("model.pth: archive/data.pkl"). max_bytes: the memory budget above.
Unpickled unpickle(const std::string& data, const PickleHooks& hooks, const std::string& what,
                   uint64_t max_bytes = max_unpickle_bytes());

}  // namespace kiln::io
