// The autocast policy table and the thread-local autocast state.
#include "kiln/autograd/autocast.h"

#include <atomic>
#include <deque>
#include <iterator>  // std::next
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/stacked_cast.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::autocast {
namespace {

// The enum's ops, then room for the registered ones: the array never moves, so policy() reads it without a lock.
using PolicyTable = std::array<Policy, static_cast<size_t>(Op::kCount) + kMaxRegisteredOps>;

// The classes follow the usual mixed-precision practice: tensor-core ops run low, ops whose range or
// accumulated error suffers in 16 bits run in float32, multi-input ops that must agree promote.
PolicyTable make_default_table() {
  PolicyTable t;
  t.fill(Policy::Keep);
  for (Op op : {Op::Matmul, Op::Mm, Op::Bmm, Op::Addmm, Op::Dot, Op::Outer}) {
    t[static_cast<size_t>(op)] = Policy::LowerPrecision;
  }
#define KILN_X(Enum, name, result, policy_, ...) t[static_cast<size_t>(Op::Enum)] = Policy::policy_;
  KILN_UNARY_OPS(KILN_X)
  KILN_BINARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Enum, name, forms, policy_, ...) t[static_cast<size_t>(Op::Enum)] = Policy::policy_;
  KILN_BINARY_PREDICATES(KILN_X)
#undef KILN_X
  for (Op op : {Op::Sum, Op::Prod, Op::Var, Op::Std, Op::Norm, Op::LogSumExp, Op::Softmax, Op::LogSoftmax}) {
    t[static_cast<size_t>(op)] = Policy::Float32;
  }
  for (Op op : {Op::Cat, Op::Stack, Op::Where, Op::Lerp, Op::IndexAdd, Op::Scatter, Op::ScatterAdd}) {
    t[static_cast<size_t>(op)] = Policy::Promote;
  }
  return t;
}

PolicyTable& table() {
  static PolicyTable t = make_default_table();
  return t;
}

// The weight-cast cache (see CacheRegion in the header). `source` keeps the parameter alive while its entry
// exists, so its TensorImpl address cannot be reused by another tensor within the region.
struct CacheEntry {
  Tensor source;
  uint64_t version = 0;
  const void* storage = nullptr;  // Module::to() may swap a parameter's data without an in-place write
  Tensor cast;
};
// A cast an op offered for its output (offer_cast): the output is held weakly (an activation is not kept alive by
// the cache), the cast strongly.
struct OfferedCast {
  std::weak_ptr<TensorImpl> source;
  uint64_t version = 0;
  const void* storage = nullptr;
  Tensor cast;
};
// An FP8 quantisation an op offered for its output (offer_fp8): the output held weakly, the payload strongly.
struct OfferedFp8 {
  std::weak_ptr<TensorImpl> source;
  uint64_t version = 0;
  const void* storage = nullptr;
  std::shared_ptr<const void> payload;
};
struct WeightCache {
  int depth = 0;
  std::map<std::pair<const TensorImpl*, DType>, CacheEntry> entries;
  std::map<std::pair<const TensorImpl*, DType>, OfferedCast> offered;
  std::map<std::pair<const TensorImpl*, const void*>, OfferedFp8> offered_fp8;
};
thread_local WeightCache weight_cache;

// The 16-bit shadows (shadow:: in the header), process-wide: the optimizer may step on another thread.
struct Shadow {
  std::weak_ptr<TensorImpl> param;  // the entry's key is its address while it lives
  DType dtype = DType::BFloat16;    // what the last region cast the parameter to
  Tensor values;                    // undefined until the optimizer asks for it (buffer())
  const void* storage = nullptr;    // the parameter's storage and version when values were written
  uint64_t version = 0;
  bool current = false;
  std::shared_ptr<struct ShadowStack> stack;  // the stack `values` is rows of (stacked_shadow), or null
  int64_t stack_row = 0;                      // where in it they start
};
// The shadows of parameters a region casts as one stack: one buffer, made when the optimizer first asks for one of
// them (shadow::buffer), each member's shadow a view of its rows.
struct ShadowStack {
  std::vector<const TensorImpl*> members;  // the parameters, in order (their entries' keys)
  std::vector<int64_t> rows;               // each one's rows
  Shape shape;                             // the whole stack's
  DType dtype = DType::BFloat16;
  Device device = Device::cpu();
  Tensor values;  // undefined until an optimizer asks
};
struct Shadows {
  std::mutex mutex;
  std::unordered_map<const TensorImpl*, Shadow> entries;
  size_t pruned_size = 0;  // entries after the last sweep of freed parameters
};
Shadows& shadows() {
  static Shadows s;
  return s;
}

// The entry of a live parameter, or nullptr (the caller holds the lock).
Shadow* live_shadow(Shadows& s, const Tensor& param) {
  auto it = s.entries.find(&param.impl());
  if (it == s.entries.end()) return nullptr;
  if (it->second.param.lock().get() != &param.impl()) {  // freed; the address now belongs to another tensor
    s.entries.erase(it);
    return nullptr;
  }
  return &it->second;
}

// The entry of `param` for shadows in `dtype`, made (or remade, for another dtype) as needed; the caller holds the
// lock.
Shadow& shadow_entry(Shadows& s, const Tensor& param, DType dtype) {
  Shadow* e = live_shadow(s, param);
  if (e != nullptr && e->dtype == dtype) return *e;
  if (e == nullptr && s.entries.size() >= 2 * s.pruned_size + 64) {  // drop the entries of freed parameters
    std::erase_if(s.entries, [](const auto& kv) { return kv.second.param.expired(); });
    s.pruned_size = s.entries.size();
  }
  Shadow& fresh = s.entries[&param.impl()];
  fresh = Shadow{};
  fresh.param = param.impl_ptr();
  fresh.dtype = dtype;
  return fresh;
}

// The current shadow of `param` cast to `dtype`, or undefined; remembers that a region casts param to dtype.
Tensor current_shadow(const Tensor& param, DType dtype) {
  Shadows& s = shadows();
  std::lock_guard<std::mutex> lock(s.mutex);
  Shadow* e = live_shadow(s, param);
  if (e != nullptr && e->dtype == dtype) {
    if (e->current && e->storage == param.impl().storage().get() && e->version == param.version()) {
      return e->values;
    }
    e->current = false;
    return {};
  }
  shadow_entry(s, param, dtype);
  return {};
}

bool cacheable(const Tensor& t, DType dtype) {
  return weight_cache.depth > 0 && t.dtype() == DType::Float32 &&
         (dtype == DType::Float16 || dtype == DType::BFloat16) && GradMode::is_enabled() && t.requires_grad() &&
         t.is_leaf();
}

void refresh_any(detail::State& s) {
  s.any_enabled = false;
  for (bool e : s.enabled) s.any_enabled = s.any_enabled || e;
}

// The registered ops, in the order of their ids after Op::kCount.
struct Registered {
  std::string name;
  Policy default_policy;
};
struct Registry {
  std::mutex mutex;
  std::deque<Registered> ops;  // a deque: registered_name()'s views stay valid as ops are added
  std::atomic<size_t> count{0};
};
Registry& registry() {
  static Registry r;
  return r;
}

size_t index_of(Op op) {
  const auto i = static_cast<size_t>(op);
  KILN_CHECK(i < static_cast<size_t>(Op::kCount) + registry().count.load(std::memory_order_acquire), "autocast: op id ",
             i, " is neither a value of autocast::Op nor a registered op; get one from autocast::register_op()");
  return i;
}

}  // namespace

Policy policy(Op op) { return table()[index_of(op)]; }
void set_policy(Op op, Policy p) { table()[index_of(op)] = p; }

Op register_op(std::string_view name, Policy default_policy) {
  KILN_CHECK(!name.empty(), "autocast::register_op: the op needs a name");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (size_t i = 0; i < r.ops.size(); ++i) {
    if (r.ops[i].name != name) continue;
    KILN_CHECK(r.ops[i].default_policy == default_policy, "autocast::register_op: \"", name,
               "\" is registered already, with another default policy; give the op another name");
    return static_cast<Op>(static_cast<size_t>(Op::kCount) + i);
  }
  KILN_CHECK(r.ops.size() < kMaxRegisteredOps, "autocast::register_op: cannot register \"", name,
             "\": ", kMaxRegisteredOps, " ops are registered already (kMaxRegisteredOps)");
  const size_t i = static_cast<size_t>(Op::kCount) + r.ops.size();
  table()[i] = default_policy;
  r.ops.push_back({std::string(name), default_policy});
  r.count.store(r.ops.size(), std::memory_order_release);
  return static_cast<Op>(i);
}

std::string_view registered_name(Op op) {
  const size_t i = index_of(op);
  if (i < static_cast<size_t>(Op::kCount)) return {};
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.ops[i - static_cast<size_t>(Op::kCount)].name;
}

bool is_enabled(DeviceType type) { return detail::state.enabled[static_cast<size_t>(type)]; }
DType get_dtype(DeviceType type) { return detail::state.dtype[static_cast<size_t>(type)]; }

void set_enabled(DeviceType type, bool enabled, DType dtype) {
  KILN_CHECK(dtype == DType::Float16 || dtype == DType::BFloat16, "autocast: the lower-precision dtype must be ",
             "Float16 or BFloat16, got ", dtype);
  auto& s = detail::state;
  s.enabled[static_cast<size_t>(type)] = enabled;
  s.dtype[static_cast<size_t>(type)] = dtype;
  refresh_any(s);
}

const amp::Fp8Recipe* fp8_recipe(DeviceType type) {
  const size_t i = static_cast<size_t>(type);
  return detail::state.enabled[i] ? detail::state.fp8[i].get() : nullptr;
}
void set_fp8_recipe(DeviceType type, std::shared_ptr<const amp::Fp8Recipe> recipe) {
  detail::state.fp8[static_cast<size_t>(type)] = std::move(recipe);
}

Guard::Guard(DeviceType type, DType dtype, bool enabled) : previous_(detail::state) {
  set_enabled(type, enabled, dtype);
  detail::state.fp8[static_cast<size_t>(type)] = nullptr;  // the innermost region decides
}
Guard::~Guard() { detail::state = previous_; }

DisableGuard::DisableGuard() : previous_(detail::state) {
  detail::state.enabled.fill(false);
  detail::state.any_enabled = false;
}
DisableGuard::~DisableGuard() { detail::state = previous_; }

std::optional<DType> target_dtype(Op op, Device device, DType widest) {
  const size_t type = static_cast<size_t>(device.type());
  if (!detail::state.enabled[type]) return std::nullopt;
  switch (policy(op)) {
    case Policy::Keep: return std::nullopt;
    case Policy::LowerPrecision: return detail::state.dtype[type];
    case Policy::Float32: return DType::Float32;
    case Policy::Promote: return widest;
  }
  return std::nullopt;
}

CacheRegion::CacheRegion() { ++weight_cache.depth; }
CacheRegion::~CacheRegion() {
  if (--weight_cache.depth == 0) {
    weight_cache.entries.clear();
    weight_cache.offered.clear();
    weight_cache.offered_fp8.clear();
  }
}

void offer_cast(const Tensor& t, const Tensor& values) {
  if (weight_cache.depth == 0 || !t.defined() || !values.defined()) return;
  KILN_CHECK(values.shape() == t.shape() && values.device() == t.device() && is_floating_point(values.dtype()) &&
                 is_floating_point(t.dtype()),
             "autocast::offer_cast: the cast (", values.dtype(), " of shape ", values.shape(), " on ", values.device(),
             ") must be a floating tensor of the shape and device of its source (", t.dtype(), " of shape ", t.shape(),
             " on ", t.device(), ")");
  weight_cache.offered[{&t.impl(), values.dtype()}] =
      OfferedCast{t.impl_ptr(), t.version(), t.impl().storage().get(), detail::with_cast_history(values, t)};
}

void offer_fp8(const Tensor& t, const void* consumer, std::shared_ptr<const void> payload) {
  if (weight_cache.depth == 0 || !t.defined() || payload == nullptr) return;
  // Offers whose output has gone (never taken) are dropped as new ones come.
  for (auto it = weight_cache.offered_fp8.begin(); it != weight_cache.offered_fp8.end();) {
    it = it->second.source.expired() ? weight_cache.offered_fp8.erase(it) : std::next(it);
  }
  weight_cache.offered_fp8[{&t.impl(), consumer}] =
      OfferedFp8{t.impl_ptr(), t.version(), t.impl().storage().get(), std::move(payload)};
}

std::shared_ptr<const void> take_fp8_offer(const Tensor& t, const void* consumer) {
  if (weight_cache.offered_fp8.empty() || !t.defined()) return nullptr;
  auto it = weight_cache.offered_fp8.find({&t.impl(), consumer});
  if (it == weight_cache.offered_fp8.end()) return nullptr;
  const OfferedFp8 o = std::move(it->second);
  weight_cache.offered_fp8.erase(it);
  if (o.source.lock().get() != &t.impl() || o.version != t.version() || o.storage != t.impl().storage().get()) {
    return nullptr;  // t changed since, or its address now belongs to another tensor
  }
  return o.payload;
}

std::optional<DType> cast_worth_offering(Device device) {
  const DeviceType type = device.type();
  if (weight_cache.depth == 0 || !GradMode::is_enabled() || !is_enabled(type) || fp8_recipe(type) != nullptr) {
    return std::nullopt;
  }
  const DType dtype = get_dtype(type);
  if (dtype != DType::BFloat16 && dtype != DType::Float16) return std::nullopt;
  return dtype;
}
size_t cache_size() { return weight_cache.entries.size(); }

Tensor cast_to(const Tensor& t, DType dtype) {
  // float8 tensors are left as they are: the op then refuses them, rather than autocast computing them silently.
  if (!t.defined() || !is_floating_point(t.dtype()) || is_float8(t.dtype()) || t.dtype() == dtype) return t;
  if (!weight_cache.offered.empty()) {  // the cast the op that made t wrote (offer_cast)
    auto it = weight_cache.offered.find({&t.impl(), dtype});
    if (it != weight_cache.offered.end()) {
      const OfferedCast& o = it->second;
      if (o.source.lock().get() == &t.impl() && o.version == t.version() && o.storage == t.impl().storage().get()) {
        return o.cast;
      }
      weight_cache.offered.erase(it);  // t changed since, or its address now belongs to another tensor
    }
  }
  if (!cacheable(t, dtype)) return t.to(dtype);  // differentiable: the gradient flows back to t in its own dtype
  const void* storage = t.impl().storage().get();
  CacheEntry& e = weight_cache.entries[{&t.impl(), dtype}];
  if (!e.cast.defined() || e.version != t.version() || e.storage != storage) {
    Tensor shadow = current_shadow(t, dtype);
    // A new alias of the shadow carries this region's history; the shadow itself stays a plain tensor.
    e = CacheEntry{t, t.version(), storage,
                   shadow.defined() ? detail::with_cast_history(shadow.detach(), t) : t.to(dtype)};
  }
  return e.cast;
}

Tensor detail::stacked_shadow(const std::vector<Tensor>& params, DType dtype) {
  if (params.empty()) return {};
  const Tensor& first = params[0];
  int64_t rows = 0;
  for (const Tensor& p : params) {
    if (!p.defined() || !cacheable(p, dtype) || !p.is_contiguous() || p.dim() == 0 || p.dim() != first.dim() ||
        p.device() != first.device()) {
      return {};
    }
    for (int64_t d = 1; d < p.dim(); ++d) {
      if (p.size(d) != first.size(d)) return {};
    }
    rows += p.size(0);
  }
  Shadows& s = shadows();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<Shadow*> entries;
  entries.reserve(params.size());
  for (const Tensor& p : params) entries.push_back(&shadow_entry(s, p, dtype));
  // Whether the shadows are planned as consecutive rows of one stack, in params' order; whether that stack is made and
  // each holds its parameter's values now.
  const std::shared_ptr<ShadowStack> stack = entries[0]->stack;
  bool planned = stack != nullptr && stack->members.size() == params.size() && stack->dtype == dtype, current = true;
  int64_t at = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Shadow& e = *entries[i];
    planned = planned && e.stack == stack && e.stack_row == at && stack->members[i] == &params[i].impl();
    current = current && e.current && e.values.defined() && e.storage == params[i].impl().storage().get() &&
              e.version == params[i].version();
    at += params[i].size(0);
  }
  if (planned && current && stack->values.defined()) return stack->values;
  if (planned) return {};  // the optimizer makes and writes them next
  // From the next step on: one buffer (made by shadow::buffer), each parameter's shadow a view of its rows.
  auto plan = std::make_shared<ShadowStack>();
  plan->shape = first.shape();
  plan->shape[0] = rows;
  plan->dtype = dtype;
  plan->device = first.device();
  at = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    Shadow& e = *entries[i];
    plan->members.push_back(&params[i].impl());
    plan->rows.push_back(params[i].size(0));
    e.values = Tensor();
    e.stack = plan;
    e.stack_row = at;
    e.current = false;
    at += params[i].size(0);
  }
  return {};
}

namespace {
// Makes `stack`'s buffer and points each member's shadow at its rows (the caller holds the lock).
void make_stack(Shadows& s, ShadowStack& stack) {
  stack.values = internal::empty(stack.shape, {.dtype = stack.dtype, .device = stack.device});
  int64_t at = 0;
  for (size_t i = 0; i < stack.members.size(); ++i) {
    auto it = s.entries.find(stack.members[i]);
    if (it != s.entries.end() && it->second.stack.get() == &stack) {
      it->second.values = internal::narrow(stack.values, 0, at, stack.rows[i]);
    }
    at += stack.rows[i];
  }
}
}  // namespace

namespace shadow {

Tensor buffer(const Tensor& param) {
  if (!param.defined() || param.dtype() != DType::Float32 ||
      !(param.is_contiguous() || param.is_contiguous(MemoryFormat::ChannelsLast))) {
    return {};
  }
  Shadows& s = shadows();
  std::lock_guard<std::mutex> lock(s.mutex);
  Shadow* e = live_shadow(s, param);
  if (e == nullptr) return {};
  e->current = false;
  if (e->stack != nullptr && !e->stack->values.defined()) make_stack(s, *e->stack);
  if (!e->values.defined() || e->values.dtype() != e->dtype || e->values.device() != param.device() ||
      e->values.shape() != param.shape() || e->values.strides() != param.strides()) {
    e->values = internal::empty_strided(param.shape(), param.strides(), {.dtype = e->dtype, .device = param.device()});
    e->stack = nullptr;  // a shadow of its own from now on
  }
  return e->values;
}

void mark_written(const Tensor& param) {
  Shadows& s = shadows();
  std::lock_guard<std::mutex> lock(s.mutex);
  Shadow* e = live_shadow(s, param);
  KILN_CHECK(e != nullptr && e->values.defined(), "autocast::shadow::mark_written: no shadow of this parameter (shape ",
             param.shape(), ") was asked for with shadow::buffer()");
  e->storage = param.impl().storage().get();
  e->version = param.version();
  e->current = true;
  e->values.impl().storage()->bump_version();  // new values: a graph that saved the old ones must not use them
}

size_t count() {
  Shadows& s = shadows();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.entries.size();
}

}  // namespace shadow

std::vector<Tensor> inputs_list(Op op, const std::vector<Tensor>& ts) {
  if (!detail::state.any_enabled) return ts;
  const Tensor* first = nullptr;
  DType widest = DType::Float32;
  for (const Tensor& t : ts) {
    if (!t.defined() || !is_floating_point(t.dtype()) || is_float8(t.dtype())) continue;
    widest = first != nullptr ? promote_types(widest, t.dtype()) : t.dtype();
    if (first == nullptr) first = &t;
  }
  if (first == nullptr) return ts;
  const std::optional<DType> target = target_dtype(op, first->device(), widest);
  if (!target) return ts;
  std::vector<Tensor> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) out.push_back(cast_to(t, *target));
  return out;
}

}  // namespace kiln::autocast
