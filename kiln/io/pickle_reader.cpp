// kiln/io/pickle_reader.cpp — the opcode loop of the restricted unpickler. Every read is bounds-checked;
// stack and memo misuse give a kiln::Error naming the data and the byte offset.
#include "kiln/io/pickle_reader.h"

#include <atomic>
#include <cstring>
#include <map>
#include <new>  // std::bad_alloc
#include <sstream>

#include "kiln/tensor/error.h"

namespace kiln::io {

std::string PyObj::repr() const {
  std::ostringstream os;
  switch (kind) {
    case Kind::None: return "None";
    case Kind::Bool: return b ? "True" : "False";
    case Kind::Int: os << i; return os.str();
    case Kind::Float: os << f; return os.str();
    case Kind::Str: return "'" + (s.size() > 40 ? s.substr(0, 40) + "..." : s) + "'";
    case Kind::Bytes: os << "bytes of " << s.size(); return os.str();
    case Kind::List: os << "list of " << items.size(); return os.str();
    case Kind::Tuple: os << "tuple of " << items.size(); return os.str();
    case Kind::Dict: os << "dict of " << dict.size(); return os.str();
    case Kind::Global: return s;
    case Kind::Storage: return "storage '" + s + "'";
    case Kind::Tensor: return "tensor";
    case Kind::DType: return "dtype";
  }
  return "?";
}

void PyArena::add(const PyRef& o) {
  if (o->kind == PyObj::Kind::List || o->kind == PyObj::Kind::Tuple || o->kind == PyObj::Kind::Dict) {
    if (seen.insert(o.get()).second) containers.push_back(o);
  }
}

PyArena::~PyArena() {
  for (auto& o : containers) {
    o->items.clear();
    o->dict.clear();
  }
}

namespace {

std::atomic<uint64_t> g_max_unpickle_bytes{kDefaultMaxUnpickleBytes};

// What the budget charges: a PyObj with its shared_ptr control block and allocator overhead, and one slot
// (a PyRef) of the stack, the memo (a map node) or a container.
constexpr uint64_t kObjectCost = sizeof(PyObj) + 64;
constexpr uint64_t kSlotCost = sizeof(PyRef);
constexpr uint64_t kMemoCost = sizeof(PyRef) + 64;

class Unpickler {
 public:
  Unpickler(const std::string& data, const PickleHooks& hooks, const std::string& what, uint64_t max_bytes)
      : data_(data), hooks_(hooks), what_(what), max_bytes_(max_bytes) {}

  Unpickled run() {
    Unpickled out;
    out.root = loop();
    out.arena = std::move(arena_);
    return out;
  }

 private:
  PyRef loop() {
    while (true) {
      op_pos_ = pos_;
      const uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;      // PROTO
        case 0x95: bytes(8); break;  // FRAME: the frame's length; frames need no special handling
        case '.': {                  // STOP
          check(stack_.size() == 1 && marks_.empty(), "STOP with ", stack_.size(), " values on the stack");
          return stack_.back();
        }
        case '}': push(PyObj::make(PyObj::Kind::Dict)); break;
        case ']': push(PyObj::make(PyObj::Kind::List)); break;
        case ')': push(PyObj::make(PyObj::Kind::Tuple)); break;
        case '(':  // MARK
          charge(sizeof(size_t));
          marks_.push_back(stack_.size());
          break;
        case 't': {  // TUPLE
          auto t = PyObj::make(PyObj::Kind::Tuple);
          t->items = pop_mark();
          charge(t->items.size() * kSlotCost);
          push(std::move(t));
          break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {  // TUPLE1..3
          const size_t n = op - 0x84u;
          check(stack_.size() >= n + top_mark(), "TUPLE", n, " on a stack of ", stack_.size());
          auto t = PyObj::make(PyObj::Kind::Tuple);
          t->items.assign(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
          stack_.resize(stack_.size() - n);
          charge(n * kSlotCost);
          push(std::move(t));
          break;
        }
        case 'X': push_str(u32()); break;                        // BINUNICODE
        case 0x8c: push_str(u8()); break;                        // SHORT_BINUNICODE
        case 0x8d: push_str(u64()); break;                       // BINUNICODE8
        case 'B': push_bytes(u32()); break;                      // BINBYTES
        case 'C': push_bytes(u8()); break;                       // SHORT_BINBYTES
        case 'J': push_int(static_cast<int32_t>(u32())); break;  // BININT
        case 'K': push_int(u8()); break;                         // BININT1
        case 'M': push_int(u16()); break;                        // BININT2
        case 0x8a: {                                             // LONG1: little-endian two's complement
          const size_t n = u8();
          check(n <= 8, "LONG1 of ", n, " bytes (integers beyond 64 bits are not supported)");
          const std::string b = bytes(n);
          uint64_t v = 0;
          for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[k])) << (8 * k);
          if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
          push_int(static_cast<int64_t>(v));
          break;
        }
        case 0x88:
        case 0x89: {  // NEWTRUE, NEWFALSE
          auto o = PyObj::make(PyObj::Kind::Bool);
          o->b = op == 0x88;
          push(std::move(o));
          break;
        }
        case 'N': push(PyObj::make(PyObj::Kind::None)); break;
        case 'G': {  // BINFLOAT: big-endian IEEE double
          const std::string b = bytes(8);
          uint64_t v = 0;
          for (int k = 0; k < 8; ++k) v = (v << 8) | static_cast<uint8_t>(b[k]);
          auto o = PyObj::make(PyObj::Kind::Float);
          std::memcpy(&o->f, &v, 8);
          push(std::move(o));
          break;
        }
        case 'c': {  // GLOBAL: "module\nname\n"
          const std::string module = line(), name = line();
          push(hooks_.find_global(module, name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          PyRef name = pop(), module = pop();
          check(name->kind == PyObj::Kind::Str && module->kind == PyObj::Kind::Str, "STACK_GLOBAL of non-strings");
          push(hooks_.find_global(module->s, name->s));
          break;
        }
        case 'R': {  // REDUCE
          PyRef args = pop(), callable = pop();
          check(args->kind == PyObj::Kind::Tuple, "REDUCE with arguments that are not a tuple");
          push(hooks_.reduce(callable, args));
          break;
        }
        case 'b': {  // BUILD: set state. Tensors and dicts keep no state kiln needs (e.g. a state dict's _metadata)
          pop();
          check(!stack_.empty(), "BUILD on an empty stack");
          break;
        }
        case 's': {  // SETITEM
          PyRef v = pop(), k = pop();
          charge(2 * kSlotCost);
          dict_at_top("SETITEM")->dict.emplace_back(k, v);
          break;
        }
        case 'u': {  // SETITEMS
          auto kv = pop_mark();
          check(kv.size() % 2 == 0, "SETITEMS with an odd number of values");
          charge(kv.size() * kSlotCost);
          PyRef d = dict_at_top("SETITEMS");
          for (size_t k = 0; k < kv.size(); k += 2) d->dict.emplace_back(kv[k], kv[k + 1]);
          break;
        }
        case 'a': {  // APPEND
          PyRef v = pop();
          charge(kSlotCost);
          list_at_top("APPEND")->items.push_back(v);
          break;
        }
        case 'e': {  // APPENDS
          auto vs = pop_mark();
          charge(vs.size() * kSlotCost);
          PyRef l = list_at_top("APPENDS");
          l->items.insert(l->items.end(), vs.begin(), vs.end());
          break;
        }
        case 'q': memo_put(u8()); break;           // BINPUT
        case 'r': memo_put(u32()); break;          // LONG_BINPUT
        case 0x94: memo_put(memo_.size()); break;  // MEMOIZE
        case 'h': memo_get(u8()); break;           // BINGET
        case 'j': memo_get(u32()); break;          // LONG_BINGET
        case 'Q': {                                // BINPERSID
          PyRef pid = pop();
          push(hooks_.persistent_load(pid));
          break;
        }
        default:
          fail("unsupported pickle opcode 0x", hex(op),
               "; kiln reads the pickles torch.save writes for tensors and dicts of tensors (protocol 2)");
      }
    }
  }

  template <typename... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    KILN_FAIL(what_, ": bad pickle at byte ", op_pos_, ": ", parts...);
  }
  template <typename... Parts>
  void check(bool cond, const Parts&... parts) const {
    if (!cond) fail(parts...);
  }
  static std::string hex(uint8_t v) {
    const char* d = "0123456789abcdef";
    return {d[v >> 4], d[v & 15]};
  }
  std::string bytes(uint64_t n) {
    check(n <= data_.size() - pos_, "the data ends early (truncated pickle)");
    std::string out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint64_t le(int n) {
    const std::string b = bytes(static_cast<uint64_t>(n));
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(b[k]);
    return v;
  }
  uint8_t u8() { return static_cast<uint8_t>(le(1)); }
  uint16_t u16() { return static_cast<uint16_t>(le(2)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  std::string line() {
    const size_t nl = data_.find('\n', pos_);
    check(nl != std::string::npos, "GLOBAL without its newline (truncated pickle)");
    std::string out = data_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    return out;
  }
  size_t top_mark() const { return marks_.empty() ? 0 : marks_.back(); }
  // Charges `bytes` against the budget; past it, refuses naming the data and how to raise the budget.
  void charge(uint64_t bytes) {
    if (bytes <= max_bytes_ - used_) {  // used_ <= max_bytes_ always: no overflow
      used_ += bytes;
      return;
    }
    KILN_FAIL(what_, ": the pickle builds more than ", max_bytes_, " bytes of values (refused at byte ", op_pos_,
              " of ", data_.size(),
              "); a state dict's pickle takes a few KB per tensor, so this one is corrupt or "
              "hostile. If the file is genuine, raise the budget with kiln::io::set_max_unpickle_bytes(n)");
  }
  void push(PyRef o) {
    check(o != nullptr, "internal: null value");
    // A new object (use_count 1: only `o` holds it) costs an object; every push costs a stack slot.
    charge(o.use_count() == 1 ? kObjectCost + kSlotCost : kSlotCost);
    arena_.add(o);
    stack_.push_back(std::move(o));
  }
  PyRef pop() {
    check(stack_.size() > top_mark(), "pop from an empty stack (or past a MARK)");
    PyRef o = std::move(stack_.back());
    stack_.pop_back();
    return o;
  }
  std::vector<PyRef> pop_mark() {
    check(!marks_.empty(), "no MARK on the stack");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyRef> out(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return out;
  }
  void push_str(uint64_t n) {
    charge(n);
    auto o = PyObj::make(PyObj::Kind::Str);
    o->s = bytes(n);
    push(std::move(o));
  }
  void push_bytes(uint64_t n) {
    charge(n);
    auto o = PyObj::make(PyObj::Kind::Bytes);
    o->s = bytes(n);
    push(std::move(o));
  }
  void push_int(int64_t v) {
    auto o = PyObj::make(PyObj::Kind::Int);
    o->i = v;
    push(std::move(o));
  }
  PyRef dict_at_top(const char* op) {
    check(stack_.size() > top_mark() && stack_.back()->kind == PyObj::Kind::Dict, op, " on something not a dict");
    return stack_.back();
  }
  PyRef list_at_top(const char* op) {
    check(stack_.size() > top_mark() && stack_.back()->kind == PyObj::Kind::List, op, " on something not a list");
    return stack_.back();
  }
  void memo_put(uint64_t k) {
    check(stack_.size() > top_mark(), "memo store from an empty stack");
    charge(kMemoCost);
    memo_[k] = stack_.back();
  }
  void memo_get(uint64_t k) {
    auto it = memo_.find(k);
    check(it != memo_.end(), "memo key ", k, " read before it was stored");
    push(it->second);
  }

  PyArena arena_;  // first member: destroyed last, after the stack and memo let go
  const std::string& data_;
  const PickleHooks& hooks_;
  const std::string& what_;
  const uint64_t max_bytes_;
  uint64_t used_ = 0;  // bytes charged so far (never given back: a bound on the peak)
  size_t pos_ = 0, op_pos_ = 0;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, PyRef> memo_;
};

}  // namespace

uint64_t max_unpickle_bytes() { return g_max_unpickle_bytes.load(std::memory_order_relaxed); }

void set_max_unpickle_bytes(uint64_t bytes) {
  KILN_CHECK(bytes > 0, "set_max_unpickle_bytes: the budget must be positive");
  g_max_unpickle_bytes.store(bytes, std::memory_order_relaxed);
}

Unpickled unpickle(const std::string& data, const PickleHooks& hooks, const std::string& what, uint64_t max_bytes) {
  try {
    return Unpickler(data, hooks, what, max_bytes).run();
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError(detail::str_cat(what, ": out of host memory while unpickling (", data.size(),
                                           " bytes of pickle); free memory or lower io::set_max_unpickle_bytes"));
  }
}

}  // namespace kiln::io
