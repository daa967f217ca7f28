// kiln/autograd/autocast.h — the per-op dtype policy of automatic mixed precision, and the hook every
// differentiable op calls.
//
//   {
//     autocast::Guard cast(DeviceType::CUDA, DType::BFloat16);
//     Tensor y = matmul(x, w);          // computed in bfloat16 (policy LowerPrecision)
//     Tensor p = softmax(y, -1);        // computed in float32 (policy Float32)
//   }
//
// Each differentiable op passes its inputs through autocast::inputs(Op::X, ...), which looks the op up
// in one table (policy()) keyed by the Op enum, never by name, and casts floating-point inputs on an
// autocast-enabled device. Outside autocast regions this costs one thread-local check. The enum holds the tensor
// ops; other modules (kiln/layers) register theirs with register_op() and get ids of the same table.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>  // std::shared_ptr: the FP8 recipe of a region
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "kiln/tensor/binary_ops.h"
#include "kiln/tensor/tensor.h"
#include "kiln/tensor/unary_ops.h"

namespace kiln::amp {
struct Fp8Recipe;  // kiln/autograd/fp8.h
}  // namespace kiln::amp

namespace kiln::autocast {

// Every op that has an autocast policy.
enum class Op : uint16_t {
// the unary table's ops (kiln/tensor/unary_ops.h), whose policies it gives
#define KILN_X(Enum, ...) Enum,
  KILN_UNARY_OPS(KILN_X)
  // the binary table's ops and predicates (kiln/tensor/binary_ops.h), whose policies it gives
  KILN_BINARY_OPS(KILN_X) KILN_BINARY_PREDICATES(KILN_X)
#undef KILN_X
  // elementwise
  Gelu,
  Square,
  Clamp,
  Where,
  MaskedFill,
  Lerp,
  Cast,
  // reductions
  Sum,
  Mean,
  Prod,
  Amax,
  Amin,
  MaxMin,
  Var,
  Std,
  Norm,
  LogSumExp,
  Softmax,
  LogSoftmax,
  // linear algebra
  Matmul,
  Mm,
  Bmm,
  Addmm,
  Dot,
  Outer,
  // shape and indexing
  View,
  Cat,
  Stack,
  IndexSelect,
  Gather,
  Scatter,
  ScatterAdd,
  IndexAdd,
  Embedding,
  MaskedSelect,
  Sort,
  Topk,
  Tril,
  Triu,
  kCount  // the ops other modules register (register_op) come after these
};

// What autocast does to an op's floating inputs.
enum class Policy : uint8_t {
  Keep,            // run in the inputs' dtypes
  LowerPrecision,  // cast floating inputs to the autocast dtype (float16 / bfloat16): matmuls, convolutions
  Float32,         // cast floating inputs to float32: ops that lose accuracy or overflow in 16 bits
  Promote,         // cast floating inputs to their promoted dtype (promote_types: float16 + bfloat16 -> float32)
};

Policy policy(Op op);              // op's policy now; throws for an unknown op id
void set_policy(Op op, Policy p);  // changes op's policy, process-wide

// An op that another module declares (kiln/layers: linear, conv, the norms, attention, the losses, ...), so that
// autograd names none of them: its id, to pass to inputs() and target_dtype(), and to policy() and set_policy() like
// any other. Registering a name again returns the same id (with a different default policy it is an error). At most
// kMaxRegisteredOps; registration is thread-safe, and a module registers each op once, on first use:
//   autocast::Op linear_op() {
//     static const autocast::Op op = autocast::register_op("linear", autocast::Policy::LowerPrecision);
//     return op;
//   }
inline constexpr size_t kMaxRegisteredOps = 256;
// A new op id after kCount for an op of another module; the same name again gives the same id (with the same
// policy, else it throws).
Op register_op(std::string_view name, Policy default_policy);
// A registered op's name ("linear"); empty for the ops of the enum above.
std::string_view registered_name(Op op);

namespace detail {
struct State {
  std::array<bool, kNumDeviceTypes> enabled{};
  std::array<DType, kNumDeviceTypes> dtype{DType::BFloat16, DType::Float16};
  bool any_enabled = false;
  // The FP8 recipe of the innermost amp::Autocast region that asked for one, per device type. Shared: a copy of the
  // state (the one a checkpoint keeps for its recomputation in backward) keeps the recipe alive after the region.
  std::array<std::shared_ptr<const amp::Fp8Recipe>, kNumDeviceTypes> fp8{};
};
inline thread_local State state;
// `values` with the autograd history of casting `source` to values' dtype (gradients reach `source`).
Tensor with_cast_history(Tensor values, const Tensor& source);
}  // namespace detail

bool is_enabled(DeviceType type);  // autocast on for type, on this thread
DType get_dtype(DeviceType type);  // its lower-precision dtype on this thread
// Turns autocast on (or off) for one device type on this thread, with the lower-precision dtype to use.
void set_enabled(DeviceType type, bool enabled, DType dtype);

// The FP8 recipe in force for `type` on this thread: the one of the innermost amp::Autocast region for that device
// type, when that region asked for FP8 and autocast is on for the type; nullptr otherwise (also inside a Guard or
// DisableGuard opened within the region). nn::Linear reads it to decide whether to compute in FP8.
const amp::Fp8Recipe* fp8_recipe(DeviceType type);
// Sets (or clears, with nullptr) the FP8 recipe of `type` on this thread. amp::Autocast does this for its region; a
// Guard's exit restores the previous one.
void set_fp8_recipe(DeviceType type, std::shared_ptr<const amp::Fp8Recipe> recipe);

// Autocast on for one device type during the guard's scope (float16 or bfloat16), with no FP8 recipe for that type.
class Guard {
 public:
  Guard(DeviceType type, DType dtype, bool enabled = true);  // sets type's state; restores all on exit
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  detail::State previous_;
};

// Autocast off for every device during the guard's scope (the backward engine uses it).
class DisableGuard {
 public:
  DisableGuard();
  ~DisableGuard();
  DisableGuard(const DisableGuard&) = delete;
  DisableGuard& operator=(const DisableGuard&) = delete;

 private:
  detail::State previous_;
};

// The weight-cast cache of autocast regions (amp::Autocast opens one; DESIGN.md decision 6). While at least
// one CacheRegion is open on this thread, cast_to() of a float32 leaf that requires grad (a parameter) to
// float16 / bfloat16 with grad mode on returns the same cast tensor each time, with its autograd history, so
// a weight used by several ops is cast once and its gradient still reaches the float32 parameter. An entry
// is keyed by the parameter's TensorImpl and the target dtype, and is recomputed when the parameter's version
// changes (an in-place update). Activations (non-leaves) and tensors that do not require grad are never
// cached. The outermost region's exit empties the cache (the cast tensors are freed unless still referenced).
class CacheRegion {
 public:
  CacheRegion();
  ~CacheRegion();
  CacheRegion(const CacheRegion&) = delete;
  CacheRegion& operator=(const CacheRegion&) = delete;
};
size_t cache_size();  // entries in this thread's weight-cast cache (for tests and diagnostics)

// Casts made by the op that made the tensor. An op whose float32 output the next op will cast (a layer norm's,
// which a Linear takes in bfloat16) can write that cast in its own pass and offer it: while the region lasts,
// cast_to(t, values.dtype()) then returns `values`, with the cast's autograd history (the gradient reaches t in
// float32), instead of casting t again, as long as t keeps its storage and version. An offer is kept for as long as
// the outermost CacheRegion and holds `values` (not t). Nothing is kept outside a region.
void offer_cast(const Tensor& t, const Tensor& values);
// FP8 codes made by the op that made the tensor, for one FP8 product that reads it next (nn::fp8_linear's input,
// quantised in a layer norm's own pass): `consumer` names that product (its scaling state), `payload` is what the
// product takes (its type is the FP8 layer's business). Kept like an offered cast: while the outermost CacheRegion
// lasts and t keeps its storage and version; nothing is kept outside a region. take_fp8_offer returns the payload
// once (and forgets it), or null when there is none for (t, consumer) or t has changed.
void offer_fp8(const Tensor& t, const void* consumer, std::shared_ptr<const void> payload);
// The payload offer_fp8 left for (t, consumer), once; null when there is none or t has changed since.
std::shared_ptr<const void> take_fp8_offer(const Tensor& t, const void* consumer);
// The dtype an op on `device` should offer its float32 output in (offer_cast), or nullopt: autocast casts to a
// 16-bit dtype on that device, a CacheRegion is open, grad mode is on (training: the product that takes the cast
// saves it anyway), and no FP8 recipe is active there (an FP8 product reads the float32 values itself).
std::optional<DType> cast_worth_offering(Device device);

// 16-bit shadows: the cast a region needs, written by the optimizer step. When a region casts a parameter
// (as above), autocast remembers which dtype it was cast to. The fused CUDA optimizers (kiln/optim) then ask for
// a shadow of each parameter they update, write the updated parameter's cast into it in the kernel that writes
// the parameter (no extra pass, no extra launch), and mark it written. The next region's cast_to() of that
// parameter returns the shadow (with the cast's autograd history) instead of casting again, as long as it is
// current: the parameter has the storage and the version it had when the shadow was marked written. Any other
// in-place write to the parameter bumps its version, so the next region casts it again; its values are always
// those of casting the parameter. A shadow costs 2 bytes per element of memory for as long as the parameter
// lives; it stops being written when no region casts the parameter any more (after one step).
namespace shadow {
// The shadow the optimizer should write for `param` in this step: a float16/bfloat16 tensor with param's shape
// and strides on its device, made on the first call. Undefined when the last region that used `param` did not
// cast it (or none did), or when param is not a dense float32 tensor. Marks the shadow not current until
// mark_written().
Tensor buffer(const Tensor& param);
// The shadow of `param` holds param's values cast, for param's version now (call after bumping it).
void mark_written(const Tensor& param);
// Shadows kept (for tests and diagnostics); shadows of freed parameters are dropped when new ones are added.
size_t count();
}  // namespace shadow

// The dtype `op` computes in for floating inputs on `device`, or nothing (keep the inputs' dtypes).
// `widest` is the promoted dtype of the floating inputs, for Policy::Promote.
std::optional<DType> target_dtype(Op op, Device device, DType widest);
Tensor cast_to(const Tensor& t, DType dtype);  // floating tensors only; others unchanged; cached (CacheRegion)

// The inputs of `op`, cast as the policy says when autocast is on for their device.
template <typename... Ts>
std::tuple<Ts...> inputs(Op op, const Ts&... ts) {
  if (!detail::state.any_enabled) return {ts...};
  Device device = Device::cpu();
  bool found = false;
  DType widest = DType::Float32;
  auto scan = [&](const Tensor& t) {
    if (!t.defined() || !is_floating_point(t.dtype())) return;
    widest = found ? promote_types(widest, t.dtype()) : t.dtype();
    if (!found) device = t.device();
    found = true;
  };
  (scan(ts), ...);
  if (!found) return {ts...};
  const std::optional<DType> target = target_dtype(op, device, widest);
  if (!target) return {ts...};
  return {cast_to(ts, *target)...};
}

// The same for a list of inputs (cat, stack).
std::vector<Tensor> inputs_list(Op op, const std::vector<Tensor>& ts);

}  // namespace kiln::autocast
