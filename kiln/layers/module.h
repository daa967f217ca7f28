// kiln/layers/module.h — nn::Module: the base of every layer and model, and nn::Handle, what holds one.
//
//   struct Mlp : nn::Module {
//     nn::Handle<nn::Linear> fc1, fc2;
//     Mlp() : Module("Mlp") {                      // the type name: profiler ranges, summaries, errors
//       fc1 = register_module("fc1", nn::Linear(784, 256));   // a module value, or a std::shared_ptr to one
//       fc2 = register_module("fc2", nn::Linear(256, 10));
//     }
//     Tensor forward(const Tensor& x) override { return fc2(relu(fc1(x))); }
//   };
//   auto model = nn::make<Mlp>();                 // nn::Handle<Mlp>; std::make_shared<Mlp>() works too
//   model->to(Device::cuda(0));
//   Tensor logits = model(x);                     // Mlp::forward inside a profiler range "Mlp"
//   for (auto& [name, p] : model->named_parameters()) ...;   // "fc1.weight", "fc1.bias", "fc2.weight", ...
//
//   class Block : public nn::Module {             // a forward of several inputs, returning anything
//     using nn::Module::forward;                  // private: no one-tensor forward (and no -Woverloaded-virtual)
//    public:
//     Block() : Module("Block") {}
//     std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& mask);
//   };
//   auto block = nn::make<Block>();
//   auto [y, weights] = block(x, mask);           // Block::forward(x, mask), chosen on the static type
//
// A module owns its parameters (tensors that require grad and that optimizers update), buffers (state
// such as BatchNorm's running statistics) and children, each under a name, in registration order.
// Modules are shared: an nn::Handle<M> (a std::shared_ptr<M> that can be called) holds one, and copying
// it shares the module. Modules cannot be copied, but they can be moved while nothing holds them yet:
// that is how a module value (nn::Linear(4, 2)) enters a container or register_module, which move it
// into a new handle. Nothing in a module points at the module itself (its parameters, buffers and
// children are shared handles; a child's pointer back to its parent follows the move), so the moved module is
// the same module under a new address.
// A module knows where it sits in a model: the first parent that registers it (a module shared by several keeps
// the first), so path() is "tables.17" or "encoder.layer.3.attention.self", which errors name (nn::Embedding's
// bad ids: `Embedding "tables.17" (1000 x 16 table): index 1000 is out of range ...`).
// Parameters are Tensor handles: to() changes their device or dtype in place, so handles held elsewhere
// (an optimizer, a data-parallel wrapper) stay valid.
#pragma once

#include <concepts>  // std::derived_from, for what a Handle may hold
#include <cstddef>   // std::nullptr_t
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>  // typeid, to refuse moving a module seen through a base-class reference (slicing)
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/tensor/tensor.h"
#include "kiln/tensor/trace.h"  // a range per module call

namespace kiln::nn {

class Module;

namespace module_detail {
// Where a module call runs, for its profiler range: the device of its first defined Tensor argument, else the CPU.
template <typename... Args>
Device call_device(const Args&... args) {
  Device device = Device::cpu();
  bool found = false;
  auto visit = [&](const auto& arg) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(arg)>, Tensor>) {
      if (!found && arg.defined()) {
        device = arg.device();
        found = true;
      }
    }
  };
  (visit(args), ...);
  return device;
}
[[noreturn]] void throw_empty_handle_call();
[[noreturn]] void throw_sliced_module(const Module& module);
}  // namespace module_detail

// A shared module that can be called: model(x) runs model->forward(x) inside a profiler range named after the
// module's type (trace::Kind::Module), as (*model)(x) does. It is a std::shared_ptr<M>, so ->, *, get(),
// comparisons, conversion to std::shared_ptr<Base> / Handle<Base> and assignment from std::make_shared<M>(...)
// work as on one. The call takes any arguments: block(x, mask) calls the forward(x, mask) that overload
// resolution picks on M (the static type), and returns what that forward returns (a Tensor, a tuple, a
// struct); arguments that no forward of M accepts do not compile. The arguments are forwarded, so a braced list
// cannot be one: spell its type (Tensor() rather than {}, Options{.p = 0.1} rather than {.p = 0.1}).
template <typename M>
class Handle : public std::shared_ptr<M> {
 public:
  Handle() noexcept = default;
  // An empty handle, as std::shared_ptr's from nullptr.
  Handle(std::nullptr_t) noexcept {}  // NOLINT(google-explicit-constructor): as std::shared_ptr
  // From a std::shared_ptr (or Handle) to M or to a class derived from it.
  template <typename U>
  requires std::convertible_to<U*, M*> Handle(std::shared_ptr<U> module)
  noexcept  // NOLINT(google-explicit-constructor)
      : std::shared_ptr<M>(std::move(module)) {}
  // Takes ownership of `module`, deleted by `deleter` (a non-owning handle: a deleter that does nothing).
  template <typename U, typename D>
  requires std::convertible_to<U*, M*> Handle(U* module, D deleter) : std::shared_ptr<M>(module, std::move(deleter)) {}

  // Only arguments that one of M's forward functions accepts (the compiler names the forward it tried); a forward
  // that only a class derived from M declares needs a handle of that class, nn::Handle<Derived>.
  // (Self is M, named so that the check waits for the call, when M is complete: Handle<Module> is instantiated
  // inside Module's own definition.)
  template <typename... Args, typename Self = M>
  requires requires(Self& m, Args&&... a) { m.forward(std::forward<Args>(a)...); }
  decltype(auto) operator()(Args&&... args) const {
    M* module = this->get();
    if (module == nullptr) module_detail::throw_empty_handle_call();
    trace::Scope range(trace::Kind::Module, module->type_name(), module_detail::call_device(args...), {}, module);
    return module->forward(std::forward<Args>(args)...);
  }
};

// A handle to any module, as containers and named_children() hold them.
using ModulePtr = Handle<Module>;

// std::make_shared<M>(args...) as a Handle<M>: auto model = nn::make<Mlp>(); Tensor y = model(x);
template <typename M, typename... Args>
Handle<M> make(Args&&... args) {
  static_assert(std::derived_from<M, Module>, "nn::make<M>: M must be a module (a class derived from nn::Module)");
  return Handle<M>(std::make_shared<M>(std::forward<Args>(args)...));
}

namespace module_detail {
// A std::shared_ptr to a module, or a class derived from one (a Handle).
template <typename T>
concept SharedModule = requires {
  typename T::element_type;
}
&&std::derived_from<typename T::element_type, Module>&& std::derived_from<T, std::shared_ptr<typename T::element_type>>;

template <typename T>
constexpr bool kNotAModule = false;  // for static_assert in the branches that refuse T

// What containers and register_module accept as a module: a module value, moved into a new handle (a temporary
// such as nn::ReLU(), or std::move(m)); a std::shared_ptr / Handle to a module, shared as it is; or nullptr,
// which registration then refuses with a clear error.
template <typename T>
auto to_handle(T&& module) {
  using V = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<V, std::nullptr_t>) {
    return Handle<Module>();
  } else if constexpr (SharedModule<V>) {
    return Handle<typename V::element_type>(std::forward<T>(module));
  } else if constexpr (!std::derived_from<V, Module>) {
    static_assert(kNotAModule<T>,
                  "kiln::nn: this argument is not a module. Containers (nn::Sequential, nn::ModuleList, "
                  "nn::ModuleDict) and register_module take module values (nn::Linear(4, 2), nn::ReLU()), or a "
                  "std::shared_ptr / nn::Handle to a module");
    return Handle<Module>();
  } else if constexpr (std::is_lvalue_reference_v<T> || std::is_const_v<std::remove_reference_t<T>>) {
    static_assert(kNotAModule<T>,
                  "kiln::nn: a module cannot be copied; pass a temporary (nn::ReLU()), std::move(module), or share "
                  "it through a std::shared_ptr / nn::Handle (nn::make<M>(...))");
    return Handle<V>();
  } else {
    if (typeid(module) != typeid(V)) throw_sliced_module(module);
    return Handle<V>(std::make_shared<V>(std::move(module)));
  }
}
}  // namespace module_detail

// name -> tensor, in registration order (parameters first, then buffers, recursively), as PyTorch's.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

// The base of every layer and model: named parameters, buffers and child modules, train()/eval(), to(), state_dict()
// and load_state_dict(), as torch.nn.Module.
class Module : public std::enable_shared_from_this<Module> {
 public:
  // A module with no parameters, buffers or children, in training mode; type_name names it in profiler ranges,
  // summaries and errors.
  explicit Module(std::string type_name = "Module");
  // Children that live on (shared elsewhere) forget this module as their parent: their path() loses it.
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  // Moving is how a module value enters a handle (containers, register_module, nn::make): the new module
  // takes over the parameters, buffers and children (the same tensors and modules; the children's parent is now
  // the new module), and the moved-from one is left empty. The new module has no parent: a parent holds the
  // moved-from one. Move a module only before anything holds it or its tensors by reference.
  Module(Module&& other) noexcept;
  Module& operator=(Module&&) = delete;

  // The type shown in summaries and error messages ("Linear", "Conv2d", ...).
  const std::string& type_name() const { return type_name_; }
  // Where the module sits in its model: the dotted names from the outermost parent that is still alive down to this
  // module, as named_modules() of that parent lists it ("tables.17", "encoder.layer.3.attention.self"); "" for a
  // module that no module registered. The parent is the first module that registered this one (register_module
  // or a container); a module shared by several parents keeps that first one, and loses it when it is destroyed.
  std::string path() const;

  // The computation of modules that map one tensor to one tensor (every layer in a Sequential).
  // Modules with other inputs define their own forward (of any arguments and result), called through a
  // Handle: block(x, mask). This one then throws a clear error if it is called anyway (through a ModulePtr).
  // Such a module should say `using nn::Module::forward;` in a private section: declaring another forward
  // hides this one, which compilers warn about (-Woverloaded-virtual, in -Wall of GCC 13 and clang); made
  // private, it is hidden on purpose and block(x) does not compile.
  virtual Tensor forward(const Tensor& input);
  // forward(input) inside the module's profiler range; model(x) on a Handle does the same.
  Tensor operator()(const Tensor& input) {
    trace::Scope range(trace::Kind::Module, type_name_, module_detail::call_device(input), {}, this);
    return forward(input);
  }

  // ---- registration (names: non-empty, no '.', unique within this module) ----
  // Stores the tensor under `name`, with requires_grad set as asked, and returns the stored handle.
  Tensor& register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  // Buffers are moved by to() and saved in state_dict() (unless not persistent), but never trained.
  Tensor& register_buffer(const std::string& name, Tensor tensor, bool persistent = true);
  // Registers a child and returns a handle to it: a std::shared_ptr / Handle is shared as it is; a module value
  // (register_module("fc", nn::Linear(4, 2))) is moved into a new handle.
  template <typename M>
  Handle<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return Handle<M>(std::move(module));
  }
  // A module value (register_module("fc", nn::Linear(4, 2))) moved into a new handle, or a Handle shared as it is.
  template <typename M>
  requires std::derived_from<std::remove_cvref_t<M>, Module>
  auto register_module(const std::string& name, M&& module) {
    return register_module(name, module_detail::to_handle(std::forward<M>(module)));
  }

  // ---- traversal (recursive ones in registration order, depth first, this module's own first) ----
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;  // "layer1.0.conv1.weight"
  std::vector<Tensor> buffers(bool recurse = true) const;  // persistent or not; a shared tensor once
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;  // "bn1.running_mean"
  std::vector<ModulePtr> children() const;                                               // direct children only
  std::vector<std::pair<std::string, ModulePtr>> named_children() const;                 // direct children only
  std::vector<ModulePtr> modules();                                // this module and every descendant
  std::vector<std::pair<std::string, ModulePtr>> named_modules();  // "" for this module
  // fn(module) on every module, children first then this one (as PyTorch's apply).
  Module& apply(const std::function<void(Module&)>& fn);

  // ---- modes and placement ----
  virtual Module& train(bool on = true);  // recursive
  // train(false), as torch.nn.Module.eval.
  Module& eval() { return train(false); }
  // Whether the module is in training mode (the default), as torch.nn.Module.training.
  bool is_training() const { return training_; }
  // Moves parameters and buffers (recursively) in place: gradients move with them. dtype applies to
  // floating-point tensors only; a memory format applies to 4-d tensors only.
  Module& to(Device device, bool non_blocking = false);
  Module& to(DType dtype);                                            // kiln::Error unless dtype is floating point
  Module& to(Device device, DType dtype, bool non_blocking = false);  // kiln::Error unless dtype is floating point
  Module& to(MemoryFormat format);                                    // e.g. MemoryFormat::ChannelsLast
  Module& to(Device device, MemoryFormat format);                     // both at once
  // Resets every parameter's gradient: to undefined (set_to_none, the default), or to zeros.
  void zero_grad(bool set_to_none = true);

  // ---- state ----
  StateDict state_dict() const;  // parameters and persistent buffers, detached, sharing memory
  // What a non-strict load_state_dict() did not load.
  struct LoadResult {
    // missing_keys: the module's names absent from the state (a tied tensor loaded under another name is not).
    std::vector<std::string> missing_keys{}, unexpected_keys{};  // unexpected_keys: the state's names not in the module
  };
  // Copies values into the module's tensors (converting dtype and device). strict: every key must match
  // and every shape agree, else kiln::Error listing the missing, unexpected and mismatched keys and
  // nothing is changed. Not strict: loads the keys that match and reports the missing and unexpected ones; a shape
  // mismatch is still a kiln::Error with nothing changed (as in PyTorch): io::load_weights(model, tensors,
  // {.strict = false}) skips mismatched tensors and reports them instead.
  // A tied tensor (registered under several names) needs one of its names and is copied once, from the
  // first given in state_dict() order: state dicts that keep one copy of a tied weight (Hugging Face's
  // save_pretrained) load strictly.
  LoadResult load_state_dict(const StateDict& state, bool strict = true);

  // ---- summary ----
  // One line per module (dotted name, type, own parameter count), then the trainable and total
  // parameter counts and their bytes.
  std::string summary();
  // The number of parameter elements (a tied tensor counted once); trainable_only: those that require grad.
  int64_t num_parameters(bool trainable_only = false) const;

 protected:
  // For containers that hold children by index ("0", "1", ...).
  void add_child(const std::string& name, ModulePtr module);
  // Renames the module's type (what type_name() returns).
  void set_type_name(std::string name) { type_name_ = std::move(name); }
  // How errors name this module: the type and, inside a model, the path: `Embedding "tables.17"`, or `Embedding`.
  std::string display_name() const;

  // ---- hooks for a module whose stored tensors differ from what it presents (nn::HybridEmbedding keeps its
  // table in two parameters on two devices but presents one "weight"). Names are relative to the module. ----
  // This module's own entries of state_dict() (not its children's). The default: its parameters, then its persistent
  // buffers, detached (sharing memory).
  virtual StateDict own_state() const;
  // The tensors load_state_dict() copies this module's own entries into: the names and shapes of own_state(). `given`
  // finds a given value by own name (null when absent); an override may refuse a value here (kiln::Error), which is
  // before anything in the model changed. An override may also return a given value itself (*given(name), the same
  // tensor) as the target: nothing is copied for it, and the module reads it in finish_load_state, before
  // load_state_dict returns (a table too large for a second copy in memory is taken that way). The default: its
  // parameters and persistent buffers themselves.
  virtual StateDict own_load_targets(const std::function<const Tensor*(const std::string&)>& given);
  // Runs on every module, children first, after a load_state_dict() that copied values in. The default does nothing.
  virtual void finish_load_state() {}
  // Runs on every module, children first, when a load_state_dict() fails after asking for targets (a refused value, a
  // shape mismatch, missing keys): the place to drop what own_load_targets staged. The default does nothing.
  virtual void abandon_load_state() {}
  // What to() asked for; moved(t) is t moved so (a detached alias, or t itself when nothing changes).
  struct MoveRequest {
    std::optional<Device> device;        // where to, if anywhere
    std::optional<DType> dtype;          // applies to floating-point tensors only
    std::optional<MemoryFormat> format;  // applies to 4-d tensors only
    bool non_blocking = false;           // asynchronous copies where possible
    // `t` as the request moves it: a detached alias, or t itself when nothing changes.
    Tensor moved(const Tensor& t) const;
  };
  // Moves this module's own tensors for to(). The default: each parameter (and its gradient) and buffer, in place.
  virtual void to_own(const MoveRequest& request);
  // Makes `t` (and every handle sharing it) hold `value`'s data, unless it already does.
  static void set_data_in_place(const Tensor& t, const Tensor& value);

 private:
  struct BufferSlot {
    std::string name;
    Tensor tensor;
    bool persistent;
  };
  void check_new_name(const std::string& name, const char* what) const;
  // load_state_dict after its checks of the given keys: the targets, the checks against them, the copies.
  LoadResult load_targets(const std::unordered_map<std::string, const Tensor*>& given, const StateDict& state,
                          bool strict);
  void to_impl(std::optional<Device> device, std::optional<DType> dtype, std::optional<MemoryFormat> format,
               bool non_blocking);

  std::string type_name_;
  bool training_ = true;
  // The module that registered this one first, and this one's name there (see path()). Not owning: a parent
  // clears it in its destructor, and a moved parent points its children at the new module.
  Module* parent_ = nullptr;
  std::string name_in_parent_;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<BufferSlot> buffers_;
  std::vector<std::pair<std::string, ModulePtr>> children_;
};

}  // namespace kiln::nn

// Handles hash as the std::shared_ptr they are (unordered containers keyed by module).
template <typename M>
struct std::hash<kiln::nn::Handle<M>> : std::hash<std::shared_ptr<M>> {};
