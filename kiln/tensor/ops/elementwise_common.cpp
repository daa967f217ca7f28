// What the elementwise frontends share: promotion, devices, broadcasting, in-place checks, and the generic
// unary and binary op drivers that end in the backend.
#include "kiln/tensor/ops/elementwise_common.h"

#include <cstring>
#include <unordered_map>

#include "kiln/tensor/cuda.h"

namespace kiln::internal::detail {
namespace {

// A number written beside tensors (x * 0.5) becomes a 0-d tensor of the op's dtype on the op's device.
// On a GPU, making one costs a kernel launch, as much as the op itself; so each thread keeps the
// constants it used recently, per device and stream (stream order makes the fill complete before any
// later read on that stream). They are internal: only ever read, as broadcast operands.
struct ConstantKey {
  Device device;
  DType dtype;
  Scalar::Kind kind;
  uint64_t bits;
  void* stream;
  bool operator==(const ConstantKey& o) const {
    return device == o.device && dtype == o.dtype && kind == o.kind && bits == o.bits && stream == o.stream;
  }
};
struct ConstantKeyHash {
  size_t operator()(const ConstantKey& k) const {
    return std::hash<uint64_t>()(k.bits) ^ (std::hash<void*>()(k.stream) << 1) ^ (static_cast<size_t>(k.dtype) << 8) ^
           (std::hash<Device>()(k.device) << 16);
  }
};

using ConstantCache = std::unordered_map<ConstantKey, Tensor, ConstantKeyHash>;
ConstantCache& constant_cache() {
  thread_local ConstantCache cache;
  return cache;
}

Tensor constant_tensor(Scalar value, DType dtype, Device device) {
  constexpr size_t kMaxConstants = 256;
  ConstantCache& cache = constant_cache();
  ConstantKey key{device, dtype, value.kind(), 0, nullptr};
  if (value.is_floating_point()) {
    const double d = value.to_double();
    std::memcpy(&key.bits, &d, sizeof d);
  } else {
    key.bits = static_cast<uint64_t>(value.to_int64());
  }
  if (device.is_cuda()) key.stream = cuda::current_stream(device.index()).handle();
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  Tensor t = scalar_tensor(value, {.dtype = dtype, .device = device});
  // During a CUDA graph capture the fill is recorded, not run (and the memory is the graph's): not for later.
  if (device.is_cuda() && cuda::Graph::capturing()) return t;
  if (cache.size() >= kMaxConstants) cache.clear();
  cache.emplace(key, t);
  return t;
}

// PyTorch's combine_categories: `higher` comes from higher-priority operands; `lower` only wins when it
// is of a higher category (an integer tensor with a float scalar), and a bool `higher` always promotes.
std::optional<DType> combine(std::optional<DType> higher, std::optional<DType> lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (is_floating_point(*higher)) return higher;
  if (*higher == DType::Bool || is_floating_point(*lower)) return promote_types(*higher, *lower);
  return higher;
}

void promote_into(std::optional<DType>& slot, DType t) { slot = slot ? promote_types(*slot, t) : t; }

const char* ordinal(size_t i) {
  static const char* const kNames[] = {"first", "second", "third", "fourth"};
  return i < 4 ? kNames[i] : "an";
}

}  // namespace

void release_cached_constants() { constant_cache().clear(); }

DType result_type_of(std::initializer_list<const Operand*> operands) {
  std::optional<DType> dimensioned, zero_dim, scalar;
  for (const Operand* o : operands) {
    if (o->is_scalar()) promote_into(scalar, o->scalar->natural_dtype());
    else if (o->tensor.dim() == 0) promote_into(zero_dim, o->tensor.dtype());
    else promote_into(dimensioned, o->tensor.dtype());
  }
  return combine(dimensioned, combine(zero_dim, scalar)).value_or(kDefaultFloat);
}

void check_defined(std::string_view op, std::initializer_list<const Operand*> operands) {
  size_t i = 0;
  for (const Operand* o : operands) {
    KILN_CHECK(o->is_scalar() || o->tensor.defined(), op, ": the ", ordinal(i), " argument is an undefined tensor",
               " (a default-constructed Tensor); pass the result of an op or a factory");
    ++i;
  }
  // Every elementwise op computes: none takes a float8 operand (storage only).
  for (const Operand* o : operands) {
    if (!o->is_scalar()) check_not_float8(op, o->tensor.dtype());
  }
}

Device common_device(std::string_view op, std::initializer_list<const Operand*> operands) {
  // A 0-d CPU tensor is a number in a box: it may join tensors of another device.
  auto is_cpu_number = [](const Operand* o) { return o->tensor.dim() == 0 && o->tensor.is_cpu(); };
  const Operand* first = nullptr;
  for (const Operand* o : operands) {
    if (o->is_scalar()) continue;
    if (first == nullptr || (is_cpu_number(first) && !is_cpu_number(o))) first = o;
  }
  if (first == nullptr) return Device::cpu();
  const Device device = first->tensor.device();
  for (const Operand* o : operands) {
    if (o->is_scalar() || o->tensor.device() == device || is_cpu_number(o)) continue;
    KILN_FAIL(op, ": expected all tensors on one device, but found ", device, " (shape ", first->tensor.shape(), ", ",
              first->tensor.dtype(), ") and ", o->tensor.device(), " (shape ", o->tensor.shape(), ", ",
              o->tensor.dtype(), "); move them to one device with .to(device) first");
  }
  return device;
}

MemoryFormat output_format(const Shape& shape, std::initializer_list<const Operand*> operands) {
  for (const Operand* o : operands) {
    if (!o->is_scalar() && o->tensor.shape() == shape &&
        o->tensor.suggest_memory_format() == MemoryFormat::ChannelsLast)
      return MemoryFormat::ChannelsLast;
  }
  return MemoryFormat::Contiguous;
}

Tensor prepare(const Operand& operand, DType dtype, Device device, const Shape& shape) {
  if (!operand.is_scalar() && operand.tensor.dtype() == dtype && operand.tensor.device() == device) {
    return operand.tensor.shape() == shape ? operand.tensor : expand(operand.tensor, shape);
  }
  Tensor t = operand.is_scalar() ? constant_tensor(*operand.scalar, dtype, device) : to(operand.tensor, device, dtype);
  return t.shape() == shape ? t : expand(t, shape);
}

void check_can_cast(std::string_view op, DType result, DType destination) {
  const bool ok = !(is_floating_point(result) && !is_floating_point(destination)) &&
                  !(result != DType::Bool && destination == DType::Bool);
  KILN_CHECK(ok, op, ": result type ", result, " can't be cast to the desired output type ", destination,
             " (in-place ops keep the destination's dtype); use the out-of-place op, or convert the destination "
             "first, e.g. with .to(DType::",
             result == DType::Bool ? "Bool" : "Float32", ")");
}

void check_inplace_destination(std::string_view op, const Tensor& self, const Shape& broadcast_shape) {
  KILN_CHECK(broadcast_shape == self.shape(), op, ": the in-place destination has shape ", self.shape(),
             ", which doesn't match the broadcast shape ", broadcast_shape,
             "; an in-place op cannot grow its destination, use the out-of-place op instead");
  for (int64_t d = 0; d < self.dim(); ++d) {
    KILN_CHECK(self.stride(d) != 0 || self.size(d) <= 1, op, ": the in-place destination (shape ", self.shape(),
               ", strides ", self.strides(), ") has several elements at one memory location (e.g. from expand()); ",
               "write into a contiguous tensor instead (call .contiguous() or .clone() first)");
  }
}

void bump_version(const Tensor& t) { t.impl().storage()->bump_version(); }

namespace {
DType compute_dtype(DType promoted, ResultKind kind) {
  return kind == ResultKind::Float && !is_floating_point(promoted) ? kDefaultFloat : promoted;
}
}  // namespace

Tensor binary(std::string_view name, BinaryOp op, const Operand& a, const Operand& b, ResultKind kind) {
  check_defined(name, {&a, &b});
  const Device device = common_device(name, {&a, &b});
  const DType compute = compute_dtype(result_type_of({&a, &b}), kind);
  KILN_CHECK(!(op == BinaryOp::Sub && compute == DType::Bool), name,
             ": subtraction, the - operator, with two bool tensors is not supported; use logical_xor() or the ^ "
             "operator instead");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, {.dtype = kind == ResultKind::Bool ? DType::Bool : compute,
                             .device = device,
                             .memory_format = output_format(shape, {&a, &b})});
  if (out.numel() == 0) return out;
  backend(device).binary(op, out, prepare(a, compute, device, shape), prepare(b, compute, device, shape));
  return out;
}

Tensor& binary_(std::string_view name, BinaryOp op, Tensor& self, const Operand& b, ResultKind kind) {
  const Operand a(self);
  check_defined(name, {&a, &b});
  const Device device = common_device(name, {&a, &b});
  KILN_CHECK(self.device() == device, name, ": the in-place destination is on ", self.device(),
             " but the other operand is on ", device, "; move them to one device with .to(device) first");
  const DType compute = compute_dtype(result_type_of({&a, &b}), kind);
  check_can_cast(name, compute, self.dtype());
  KILN_CHECK(!(op == BinaryOp::Sub && compute == DType::Bool), name,
             ": subtraction, the - operator, with two bool tensors is not supported; use logical_xor() or the ^ "
             "operator instead");
  check_inplace_destination(name, self, broadcast_shapes(self.shape(), b.shape(), name));
  if (self.numel() == 0) return self;
  const Shape& shape = self.shape();
  Tensor other = prepare(b, compute, device, shape);
  if (compute == self.dtype()) {
    backend(device).binary(op, self, self, other);
  } else {  // e.g. a float16 tensor += a float32 tensor: compute in float32, round once into float16
    Tensor result = empty(shape, {.dtype = compute, .device = device, .memory_format = self.suggest_memory_format()});
    backend(device).binary(op, result, prepare(a, compute, device, shape), other);
    copy_(self, result);
  }
  bump_version(self);
  return self;
}

Tensor unary(std::string_view name, UnaryOp op, const Tensor& a, ResultKind kind, const UnaryParams& params) {
  KILN_CHECK(a.defined(), name, ": the argument is an undefined tensor (a default-constructed Tensor); pass the ",
             "result of an op or a factory");
  check_not_float8(name, a.dtype());
  const DType compute = compute_dtype(a.dtype(), kind);
  Tensor out = empty(a.shape(), {.dtype = kind == ResultKind::Bool ? DType::Bool : compute,
                                 .device = a.device(),
                                 .memory_format = a.suggest_memory_format()});
  if (out.numel() == 0) return out;
  backend(a.device()).unary(op, out, to(a, a.device(), compute), params);
  return out;
}

Tensor& unary_(std::string_view name, UnaryOp op, Tensor& self, ResultKind kind, const UnaryParams& params) {
  KILN_CHECK(self.defined(), name, ": the argument is an undefined tensor (a default-constructed Tensor)");
  check_not_float8(name, self.dtype());
  KILN_CHECK(kind != ResultKind::Bool, name, ": an op with a Bool result has no in-place form");
  check_can_cast(name, compute_dtype(self.dtype(), kind), self.dtype());
  check_inplace_destination(name, self, self.shape());
  if (self.numel() == 0) return self;
  backend(self.device()).unary(op, self, self, params);
  bump_version(self);
  return self;
}

}  // namespace kiln::internal::detail
