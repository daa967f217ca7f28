// nn::Module: registration, traversal, modes, placement, state and summary (module.h).
#include "kiln/layers/module.h"

#include <algorithm>      // std::max
#include <array>          // std::array, the summary's cells
#include <cstdio>         // std::snprintf, megabytes in the summary
#include <set>            // std::set, to list each tensor and module once
#include <sstream>        // std::ostringstream, to build summaries and error messages
#include <unordered_map>  // std::unordered_map, state keys by name in load_state_dict

#include "kiln/autograd/grad_mode.h"    // NoGradGuard: moves, resets and loads are not recorded
#include "kiln/autograd/sparse_grad.h"  // clear_sparse_grad in zero_grad

namespace kiln::nn {

namespace {

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string shape_str(const Shape& shape) { return detail::str_cat(shape); }

}  // namespace

namespace module_detail {

void throw_empty_handle_call() {
  KILN_FAIL(
      "nn::Handle: called while it holds no module (a null handle); assign it one first, e.g. "
      "fc = register_module(\"fc\", nn::Linear(4, 2)) or model = nn::make<Model>()");
}

void throw_sliced_module(const Module& module) {
  KILN_FAIL("kiln::nn: cannot move this ", module.type_name(),
            " into a container or register_module: it is seen through a reference to one of its base classes, so "
            "moving it would keep only the base part; pass it with its own type, or share it through a "
            "std::shared_ptr / nn::Handle");
}

}  // namespace module_detail

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

Module::~Module() {
  // A child shared elsewhere lives on: it must not point at this module any more.
  for (const auto& [name, child] : children_) {
    if (child->parent_ == this) {
      child->parent_ = nullptr;
      child->name_in_parent_.clear();
    }
  }
}

Module::Module(Module&& other) noexcept
    : std::enable_shared_from_this<Module>(),
      type_name_(std::move(other.type_name_)),
      training_(other.training_),
      parameters_(std::move(other.parameters_)),
      buffers_(std::move(other.buffers_)),
      children_(std::move(other.children_)) {
  // The children's parent is now this module (other is left without children). This one has no parent: one that
  // registered `other` holds `other`, not this.
  for (const auto& [name, child] : children_)
    if (child->parent_ == &other) child->parent_ = this;
}

std::string Module::path() const {
  std::vector<const std::string*> names;  // this module's name first, the outermost parent's child's last
  for (const Module* m = this; m->parent_ != nullptr; m = m->parent_) names.push_back(&m->name_in_parent_);
  std::string out;
  for (auto it = names.rbegin(); it != names.rend(); ++it) out = join_name(out, **it);
  return out;
}

std::string Module::display_name() const {
  const std::string where = path();
  return where.empty() ? type_name_ : detail::str_cat(type_name_, " \"", where, "\"");
}

Tensor Module::forward(const Tensor&) {
  throw NotImplementedError(detail::str_cat(type_name_, " has no forward(const Tensor&): it takes other inputs; call ",
                                            "it with them through a handle of its own type (block(x, mask) on an ",
                                            "nn::Handle<", type_name_, ">), not through an nn::ModulePtr"));
}

// ---------------------------------------------------------------------------------------------------
// registration
// ---------------------------------------------------------------------------------------------------

void Module::check_new_name(const std::string& name, const char* what) const {
  KILN_CHECK(!name.empty(), type_name_, ": cannot register a ", what, " with an empty name; give it a name such as \"",
             "weight\"");
  KILN_CHECK(name.find('.') == std::string::npos, type_name_, ": cannot register ", what, " \"", name,
             "\": names must not contain '.', which separates the levels of dotted names (\"layer1.0.weight\"); "
             "register a child module instead, or use '_'");
  auto taken = [&](const char* kind) {
    KILN_FAIL(type_name_, ": cannot register ", what, " \"", name, "\": this module already has a ", kind,
              " of that name; names are unique across a module's parameters, buffers and children");
  };
  for (const auto& [n, t] : parameters_)
    if (n == name) taken("parameter");
  for (const auto& b : buffers_)
    if (b.name == name) taken("buffer");
  for (const auto& [n, c] : children_)
    if (n == name) taken("child module");
}

Tensor& Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "parameter");
  if (tensor.defined()) {
    KILN_CHECK(tensor.is_floating_point(), type_name_, ": parameter \"", name, "\" must be floating point, got ",
               tensor.dtype(), " of shape ", tensor.shape(),
               "; convert it first (.to(DType::Float32)) or register it as a buffer");
    KILN_CHECK(
        tensor.is_leaf(), type_name_, ": parameter \"", name, "\" of shape ", tensor.shape(),
        " is the result of a recorded op, not a leaf; register tensor.detach() (or create it under NoGradGuard)");
    tensor.requires_grad_(requires_grad);
  }
  parameters_.emplace_back(name, std::move(tensor));
  return parameters_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor tensor, bool persistent) {
  check_new_name(name, "buffer");
  buffers_.push_back({name, std::move(tensor), persistent});
  return buffers_.back().tensor;
}

void Module::add_child(const std::string& name, ModulePtr module) {
  check_new_name(name, "child module");
  KILN_CHECK(module != nullptr, type_name_, ": cannot register child module \"", name,
             "\": the pointer is null; create it with std::make_shared first");
  KILN_CHECK(module.get() != this, type_name_, ": cannot register child module \"", name,
             "\": it is this module itself");
  Module* child = module.get();
  children_.emplace_back(name, std::move(module));
  // The first parent names the child (path()); one registered elsewhere already keeps that parent, and an ancestor
  // of this module registered under it keeps none (a parent chain never loops).
  if (child->parent_ != nullptr) return;
  for (const Module* m = this; m != nullptr; m = m->parent_)
    if (m == child) return;
  child->parent_ = this;
  child->name_in_parent_ = name;
}

// ---------------------------------------------------------------------------------------------------
// traversal
// ---------------------------------------------------------------------------------------------------

namespace {

// Depth first, this module's own entries first, then each child's, skipping undefined tensors and
// tensors already listed (tied weights) and modules already visited (a child shared by two parents).
template <typename Own>
void collect_named(const Module& m, const std::string& prefix, bool recurse, const Own& own,
                   std::set<const TensorImpl*>& seen_tensors, std::set<const Module*>& seen_modules,
                   std::vector<std::pair<std::string, Tensor>>& out) {
  if (!seen_modules.insert(&m).second) return;
  for (const auto& [name, t] : own(m)) {
    if (!t.defined() || !seen_tensors.insert(t.impl_ptr().get()).second) continue;
    out.emplace_back(join_name(prefix, name), t);
  }
  if (!recurse) return;
  for (const auto& [name, child] : m.named_children())
    collect_named(*child, join_name(prefix, name), recurse, own, seen_tensors, seen_modules, out);
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<const TensorImpl*> seen_tensors;
  std::set<const Module*> seen_modules;
  collect_named(
      *this, "", recurse, [](const Module& m) -> const auto& { return m.parameters_; }, seen_tensors, seen_modules,
      out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<const TensorImpl*> seen_tensors;
  std::set<const Module*> seen_modules;
  auto own = [](const Module& m) {
    std::vector<std::pair<std::string, Tensor>> list;
    for (const auto& b : m.buffers_) list.emplace_back(b.name, b.tensor);
    return list;
  };
  collect_named(*this, "", recurse, own, seen_tensors, seen_modules, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(std::move(t));
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(std::move(t));
  return out;
}

std::vector<std::pair<std::string, ModulePtr>> Module::named_children() const { return children_; }

std::vector<ModulePtr> Module::children() const {
  std::vector<ModulePtr> out;
  for (const auto& [name, child] : children_) out.push_back(child);
  return out;
}

std::vector<std::pair<std::string, ModulePtr>> Module::named_modules() {
  std::vector<std::pair<std::string, ModulePtr>> out;
  std::set<const Module*> seen;
  // A module not held by a shared_ptr (one on the stack) is listed through a non-owning handle.
  ModulePtr self = weak_from_this().lock();
  if (self == nullptr) self = ModulePtr(this, [](Module*) {});
  std::function<void(const std::string&, const ModulePtr&)> visit = [&](const std::string& prefix, const ModulePtr& m) {
    if (!seen.insert(m.get()).second) return;
    out.emplace_back(prefix, m);
    for (const auto& [name, child] : m->children_) visit(join_name(prefix, name), child);
  };
  visit("", self);
  return out;
}

std::vector<ModulePtr> Module::modules() {
  std::vector<ModulePtr> out;
  for (auto& [name, m] : named_modules()) out.push_back(std::move(m));
  return out;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [name, child] : children_) child->apply(fn);
  fn(*this);
  return *this;
}

// ---------------------------------------------------------------------------------------------------
// modes and placement
// ---------------------------------------------------------------------------------------------------

Module& Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
  return *this;
}

Tensor Module::MoveRequest::moved(const Tensor& t) const {
  Tensor out = t.detach();  // a detached alias, so that nothing is recorded
  const bool cast = dtype.has_value() && t.is_floating_point() && *dtype != t.dtype();
  if (device.has_value() && cast) {
    out = out.to(*device, *dtype, non_blocking);
  } else if (device.has_value()) {
    out = out.to(*device, non_blocking);
  } else if (cast) {
    out = out.to(*dtype);
  }
  if (format.has_value() && out.dim() == 4) out = out.contiguous(*format);
  return out;
}

// Swaps the data under the handle: copies of it (in optimizers, in user code) see the move.
void Module::set_data_in_place(const Tensor& t, const Tensor& value) {
  const TensorImpl &a = value.impl(), &b = t.impl();
  const bool unchanged = a.storage() == b.storage() && a.dtype() == b.dtype() && a.sizes() == b.sizes() &&
                         a.strides() == b.strides() && a.offset() == b.offset();
  if (!unchanged) t.impl().set_data(a);
}

void Module::to_own(const MoveRequest& request) {
  for (const auto& [name, p] : parameters_) {
    if (!p.defined()) continue;
    set_data_in_place(p, request.moved(p));
    if (p.grad().defined()) set_data_in_place(p.grad(), request.moved(p.grad()));
  }
  for (const auto& b : buffers_)
    if (b.tensor.defined()) set_data_in_place(b.tensor, request.moved(b.tensor));
}

void Module::to_impl(std::optional<Device> device, std::optional<DType> dtype, std::optional<MemoryFormat> format,
                     bool non_blocking) {
  NoGradGuard no_grad;
  const MoveRequest request{device, dtype, format, non_blocking};
  // Each module moves its own tensors; a tensor shared by several modules moves once (the later ones find it moved).
  apply([&](Module& m) { m.to_own(request); });
}

Module& Module::to(Device device, bool non_blocking) {
  to_impl(device, std::nullopt, std::nullopt, non_blocking);
  return *this;
}

Module& Module::to(DType dtype) {
  KILN_CHECK(is_floating_point(dtype), type_name_, ".to(", dtype,
             "): modules can only be cast to a floating-point dtype (parameters must be floating point); use ",
             "Float32, Float64, Float16 or BFloat16");
  to_impl(std::nullopt, dtype, std::nullopt, false);
  return *this;
}

Module& Module::to(Device device, DType dtype, bool non_blocking) {
  KILN_CHECK(is_floating_point(dtype), type_name_, ".to(", device, ", ", dtype,
             "): modules can only be cast to a floating-point dtype (parameters must be floating point); use ",
             "Float32, Float64, Float16 or BFloat16");
  to_impl(device, dtype, std::nullopt, non_blocking);
  return *this;
}

Module& Module::to(MemoryFormat format) {
  to_impl(std::nullopt, std::nullopt, format, false);
  return *this;
}

Module& Module::to(Device device, MemoryFormat format) {
  to_impl(device, std::nullopt, format, false);
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (auto& p : parameters()) {
    autograd::clear_sparse_grad(p);  // a sparse gradient is dropped either way: it has no rows to keep at zero
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.mutable_grad() = Tensor();
    } else {
      p.mutable_grad().zero_();
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// state
// ---------------------------------------------------------------------------------------------------

namespace {

// As PyTorch: every module's own parameters, then its persistent buffers, then its children's, with no
// de-duplication, so tied weights appear under each of their names. M: Module or const Module (children are
// reached through handles, which are not const).
template <typename M>
void collect_state(M& m, const std::string& prefix, StateDict& out,
                   const std::function<void(M&, const std::string&, StateDict&)>& own) {
  own(m, prefix, out);
  for (const auto& [name, child] : m.named_children()) collect_state<M>(*child, join_name(prefix, name), out, own);
}

}  // namespace

StateDict Module::own_state() const {
  StateDict out;
  for (const auto& [name, p] : parameters_)
    if (p.defined()) out.emplace_back(name, p.detach());
  for (const auto& b : buffers_)
    if (b.persistent && b.tensor.defined()) out.emplace_back(b.name, b.tensor.detach());
  return out;
}

StateDict Module::own_load_targets(const std::function<const Tensor*(const std::string&)>& /*given*/) {
  StateDict out;
  for (const auto& [name, p] : parameters_)
    if (p.defined()) out.emplace_back(name, p);
  for (const auto& b : buffers_)
    if (b.persistent && b.tensor.defined()) out.emplace_back(b.name, b.tensor);
  return out;
}

StateDict Module::state_dict() const {
  StateDict out;
  collect_state<const Module>(*this, "", out, [](const Module& m, const std::string& prefix, StateDict& o) {
    for (auto& [name, t] : m.own_state()) o.emplace_back(join_name(prefix, name), std::move(t));
  });
  return out;
}

Module::LoadResult Module::load_state_dict(const StateDict& state, bool strict) {
  std::unordered_map<std::string, const Tensor*> given;
  for (const auto& [key, value] : state) {
    KILN_CHECK(given.emplace(key, &value).second, type_name_, ".load_state_dict: key \"", key,
               "\" appears twice in the given state; each key must appear once");
    KILN_CHECK(value.defined(), type_name_, ".load_state_dict: the value of \"", key,
               "\" is an undefined tensor; remove the key or give it a value");
  }
  try {
    return load_targets(given, state, strict);
  } catch (...) {
    apply([](Module& m) { m.abandon_load_state(); });  // staging made for the load goes with it
    throw;
  }
}

Module::LoadResult Module::load_targets(const std::unordered_map<std::string, const Tensor*>& given,
                                        const StateDict& state, bool strict) {
  // The module's own tensors under their state-dict names (handles, not detached: values are copied in).
  StateDict targets;
  collect_state<Module>(*this, "", targets, [&](Module& m, const std::string& prefix, StateDict& o) {
    auto find = [&](const std::string& name) -> const Tensor* {
      auto it = given.find(join_name(prefix, name));
      return it == given.end() ? nullptr : it->second;
    };
    for (auto& [name, t] : m.own_load_targets(find)) o.emplace_back(join_name(prefix, name), std::move(t));
  });

  LoadResult result;
  std::vector<std::string> mismatched;
  std::vector<std::pair<Tensor, const Tensor*>> to_copy;  // (destination, source)
  std::set<std::string> expected;
  // A tied tensor (one tensor under several names, e.g. BERT's decoder weight and word embeddings) is
  // loaded once, from the first of its names given in the module's order, and needs only one of them:
  // Hugging Face's save_pretrained() writes a single copy of each tied tensor.
  std::set<const TensorImpl*> loaded;
  for (const auto& [key, target] : targets) {
    expected.insert(key);
    auto it = given.find(key);
    if (it == given.end()) continue;
    if (it->second->shape() != target.shape()) {
      mismatched.push_back(detail::str_cat(key, ": expected shape ", shape_str(target.shape()), " vs given shape ",
                                           shape_str(it->second->shape())));
    } else if (loaded.insert(target.impl_ptr().get()).second && target.impl_ptr() != it->second->impl_ptr()) {
      to_copy.emplace_back(target, it->second);  // (a target that is the given tensor itself is read by its module)
    }
  }
  for (const auto& [key, target] : targets)
    if (given.count(key) == 0 && loaded.count(target.impl_ptr().get()) == 0) result.missing_keys.push_back(key);
  for (const auto& [key, value] : state)
    if (expected.count(key) == 0) result.unexpected_keys.push_back(key);

  const bool failed =
      !mismatched.empty() || (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty()));
  if (failed) {
    std::ostringstream msg;
    msg << type_name_ << ".load_state_dict: the state does not match the module; nothing was loaded.";
    auto list = [&](const char* title, const std::vector<std::string>& items) {
      if (items.empty()) return;
      msg << "\n  " << title << " (" << items.size() << "):";
      for (const auto& s : items) msg << "\n    " << s;
    };
    if (strict) {
      list("missing keys", result.missing_keys);
      list("unexpected keys", result.unexpected_keys);
    }
    list("shape mismatches", mismatched);
    msg << "\n  Check that the state comes from the same architecture"
        << (strict ? ", or pass strict = false to load only the keys that match." : ".");
    // FP8 state (nn::Linear's fp8_* buffers) exists only in Linears that amp::prepare_fp8 (or an FP8 forward) set up.
    auto is_fp8_key = [](const std::string& key) {
      for (const char* b : {"fp8_amax_history", "fp8_scale", "fp8_scale_inv"}) {
        const std::string tail = b;
        if (key == tail || (key.size() > tail.size() && key.ends_with("." + tail))) return true;
      }
      return false;
    };
    auto any_fp8 = [&](const std::vector<std::string>& keys) {
      for (const auto& k : keys)
        if (is_fp8_key(k)) return true;
      return false;
    };
    if (any_fp8(result.unexpected_keys)) {
      msg << "\n  The state holds FP8 scaling state (the fp8_amax_history / fp8_scale / fp8_scale_inv buffers of "
             "FP8 Linear layers): call amp::prepare_fp8(model, recipe, device) (kiln/layers/fp8_linear.h) on this "
             "model, with the recipe of the run that saved it, before loading.";
    } else if (any_fp8(result.missing_keys)) {
      msg << "\n  This model has FP8 scaling state (fp8_* buffers) that the given state lacks (saved by a run without "
             "FP8?): pass strict = false to keep the fresh FP8 state.";
    }
    throw Error(msg.str());
  }

  NoGradGuard no_grad;
  for (auto& [dst, src] : to_copy) dst.copy_(*src);
  apply([](Module& m) { m.finish_load_state(); });
  return result;
}

// ---------------------------------------------------------------------------------------------------
// summary
// ---------------------------------------------------------------------------------------------------

int64_t Module::num_parameters(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& p : parameters())
    if (!trainable_only || p.requires_grad()) n += p.numel();
  return n;
}

std::string Module::summary() {
  auto rows = named_modules();
  std::vector<std::array<std::string, 3>> cells;
  cells.push_back({"name", "type", "parameters"});
  for (const auto& [name, m] : rows) {
    int64_t own = 0;
    for (const auto& [pname, p] : m->parameters_)
      if (p.defined()) own += p.numel();
    cells.push_back({name.empty() ? "(root)" : name, m->type_name(), std::to_string(own)});
  }
  size_t width[3] = {0, 0, 0};
  for (const auto& row : cells)
    for (size_t c = 0; c < 3; ++c) width[c] = std::max(width[c], row[c].size());

  std::ostringstream out;
  for (const auto& row : cells) {
    out << row[0] << std::string(width[0] - row[0].size() + 2, ' ') << row[1]
        << std::string(width[1] - row[1].size() + 2, ' ') << std::string(width[2] - row[2].size(), ' ') << row[2]
        << "\n";
  }
  int64_t trainable = 0, total = 0;
  size_t trainable_bytes = 0, total_bytes = 0;
  for (const auto& p : parameters()) {
    total += p.numel();
    total_bytes += p.nbytes();
    if (p.requires_grad()) {
      trainable += p.numel();
      trainable_bytes += p.nbytes();
    }
  }
  auto mb = [](size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / 1e6);
    return std::string(buf);
  };
  out << "trainable parameters: " << trainable << " (" << mb(trainable_bytes) << " MB)\n";
  out << "total parameters: " << total << " (" << mb(total_bytes) << " MB)\n";
  return out.str();
}

}  // namespace kiln::nn
