// kiln/layers/containers.h — modules that hold other modules: Sequential, ModuleList, ModuleDict.
//
//   nn::Sequential mlp{nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 10)};   // module values, moved in
//   Tensor logits = mlp(x);                    // (N, 784) -> (N, 10); parameters "0.weight", "0.bias", "2.weight", ...
//
//   auto net = nn::make<nn::Sequential>(nn::Conv2d(1, 16, 3, {.padding = 1}), nn::ReLU(), nn::Flatten(),
//                                       nn::Linear(16 * 28 * 28, 10));   // held by a handle: net(x)
//   nn::Sequential both{shared_linear /* a std::shared_ptr or nn::Handle, shared */, nn::ReLU()};
//
//   nn::ModuleList blocks;                     // children "0", "1", ...; iterate and call them yourself
//   blocks.push_back(Block());                 // a value (moved in), or a handle
//   for (const auto& b : blocks) h = b(h);     // each element is an nn::ModulePtr (a Handle<Module>)
//
//   nn::ModuleDict heads;                      // children under their keys, in insertion order
//   heads.insert("cls", nn::Linear(768, 2));
//   Tensor y = heads["cls"](h);
//
// Children are registered under "0", "1", ... (Sequential, ModuleList) or their keys (ModuleDict), so
// parameter names match PyTorch's and state dicts can be exchanged with it. Each element is a module value
// (moved into a new handle: a temporary, or std::move(m)), or a std::shared_ptr / nn::Handle to a module
// (shared); anything else does not compile. The older forms (a std::vector<ModulePtr>, append) work as well.
// As for any C++ type, a single Sequential in braces is moved, not nested: nest it among others, or append it.
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/layers/module.h"

namespace kiln::nn {

namespace module_detail {
template <typename T>
constexpr bool kIsVector = false;
template <typename T>
constexpr bool kIsVector<std::vector<T>> = true;
}  // namespace module_detail

// What Sequential and ModuleList share: children held by index, registered under "0", "1", ... (or a
// name of the caller's choice), as PyTorch names them.
class IndexedModules : public Module {
 public:
  // The i-th module (negative i counts from the end); at<T>(i) casts it to its concrete type.
  const ModulePtr& operator[](int64_t index) const;
  // The i-th module as a Handle<M>; kiln::Error if it is not an M.
  template <typename M>
  Handle<M> at(int64_t index) const {
    auto out = std::dynamic_pointer_cast<M>((*this)[index]);
    if (out == nullptr) throw_bad_cast(index);
    return Handle<M>(std::move(out));
  }
  // The number of modules held.
  int64_t size() const { return static_cast<int64_t>(modules_.size()); }
  // Whether no module is held.
  bool empty() const { return modules_.empty(); }
  // Iteration over the modules in order, each an nn::ModulePtr.
  std::vector<ModulePtr>::const_iterator begin() const { return modules_.begin(); }
  // The end of the iteration that begin() starts.
  std::vector<ModulePtr>::const_iterator end() const { return modules_.end(); }

 protected:
  // An empty container whose type name is type_name.
  explicit IndexedModules(std::string type_name) : Module(std::move(type_name)) {}
  void add_indexed(const std::string& name, ModulePtr module);  // registers and appends
  // The name the next appended module gets: its index, "0", "1", ...
  std::string next_index() const { return std::to_string(modules_.size()); }
  // The variadic constructors take module values and handles; one argument that is a vector or the container
  // itself goes to the constructors of those.
  template <typename Self, typename... Ms>
  static constexpr bool kModuleArgs = sizeof...(Ms) != 1 || ((!module_detail::kIsVector<std::remove_cvref_t<Ms>> &&
                                                              !std::is_same_v<std::remove_cvref_t<Ms>, Self>)&&...);

 private:
  [[noreturn]] void throw_bad_cast(int64_t index) const;
  std::vector<ModulePtr> modules_;
};

// The constructors Sequential and ModuleList share (each inherits them): empty, a vector of handles (of
// ModulePtr, or of std::shared_ptr to modules of one type), an initializer list of handles, or module values
// and handles mixed. Self is the container, whose kTypeName names it.
template <typename Self>
class IndexedModulesOf : public IndexedModules {
 public:
  // An empty container.
  IndexedModulesOf() : IndexedModules(Self::kTypeName) {}
  // The modules in order, each shared as it is, under "0", "1", ...
  explicit IndexedModulesOf(const std::vector<ModulePtr>& modules) : IndexedModulesOf() {
    for (const auto& m : modules) add_indexed(next_index(), m);
  }
  // A vector of std::shared_ptr to modules of one type, shared as they are.
  template <typename M>  // a vector of std::shared_ptr to modules of one type
  requires std::derived_from<M, Module>
  explicit IndexedModulesOf(const std::vector<std::shared_ptr<M>>& modules)
      : IndexedModulesOf(std::vector<ModulePtr>(modules.begin(), modules.end())) {}
  // Handles in braces, shared as they are.
  IndexedModulesOf(std::initializer_list<ModulePtr> modules) : IndexedModulesOf(std::vector<ModulePtr>(modules)) {}
  // Self{nn::Linear(4, 8), nn::ReLU(), shared_head}: module values (moved in) and handles, mixed. Explicit
  // with one module, so that a lone module never converts to a container unasked. (Two constructors rather than
  // one with explicit(sizeof...(Ms) == 1): GCC 12 drops a conditional explicit from inherited constructors.)
  template <typename M>
  requires kModuleArgs<Self, M>
  explicit IndexedModulesOf(M&& module) : IndexedModulesOf() {
    add_indexed(next_index(), module_detail::to_handle(std::forward<M>(module)));
  }
  // Two or more modules: values (moved in) and handles, mixed, under "0", "1", ...
  template <typename... Ms>
  requires(sizeof...(Ms) > 1) IndexedModulesOf(Ms&&... modules) : IndexedModulesOf() {
    (add_indexed(next_index(), module_detail::to_handle(std::forward<Ms>(modules))), ...);
  }
};

// Chains modules that each map one tensor to one tensor: forward(x) = m_n(... m_1(m_0(x))).
class Sequential : public IndexedModulesOf<Sequential> {
 public:
  static constexpr const char* kTypeName = "Sequential";  // its type_name()
  using IndexedModulesOf::IndexedModulesOf;  // Sequential{nn::Linear(4, 8), nn::ReLU()}, and the forms above

  // Appends under the next index ("0", "1", ...), or under a name of your choice: a handle, or a module value.
  Sequential& append(ModulePtr module);
  Sequential& append(const std::string& name, ModulePtr module);  // under `name` rather than the next index
  // A module value (moved in) or a handle, under the next index.
  template <typename M>
  Sequential& append(M&& module) {
    return append(ModulePtr(module_detail::to_handle(std::forward<M>(module))));
  }
  // A module value (moved in) or a handle, under `name`.
  template <typename M>
  Sequential& append(const std::string& name, M&& module) {
    return append(name, ModulePtr(module_detail::to_handle(std::forward<M>(module))));
  }

  // An empty Sequential returns its input unchanged, as PyTorch's.
  Tensor forward(const Tensor& input) override;
};

// Holds modules by index for code that calls them itself (a stack of transformer blocks). No forward.
class ModuleList : public IndexedModulesOf<ModuleList> {
 public:
  static constexpr const char* kTypeName = "ModuleList";  // its type_name()
  using IndexedModulesOf::IndexedModulesOf;  // nn::ModuleList{Block(), Block(), shared_block}, and the forms above

  ModuleList& push_back(ModulePtr module);  // registered under the next index
  template <typename M>
  ModuleList& push_back(M&& module) {  // a module value (moved in) or a handle
    return push_back(ModulePtr(module_detail::to_handle(std::forward<M>(module))));
  }
  Tensor forward(const Tensor& input) override;  // throws: a ModuleList does not know how to chain its modules
};

// Holds modules by name, in insertion order (task heads, per-language embeddings). No forward.
class ModuleDict : public Module {
 public:
  ModuleDict();

  // Registers the module under `key`; a key already present is an error (keys are unique).
  ModuleDict& insert(const std::string& key, ModulePtr module);
  template <typename M>
  ModuleDict& insert(const std::string& key, M&& module) {  // a module value (moved in) or a handle
    return insert(key, ModulePtr(module_detail::to_handle(std::forward<M>(module))));
  }
  Tensor forward(const Tensor& input) override;  // throws: call the module you want, heads[key]

  const ModulePtr& operator[](const std::string& key) const;  // a missing key is an error listing the keys
  bool contains(const std::string& key) const;                // whether a module is held under key
  std::vector<std::string> keys() const;                      // insertion order
  // The number of modules held.
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  // Whether no module is held.
  bool empty() const { return entries_.empty(); }
  // Iteration over (key, module) pairs in insertion order.
  std::vector<std::pair<std::string, ModulePtr>>::const_iterator begin() const { return entries_.begin(); }
  // The end of the iteration that begin() starts.
  std::vector<std::pair<std::string, ModulePtr>>::const_iterator end() const { return entries_.end(); }

 private:
  std::vector<std::pair<std::string, ModulePtr>> entries_;
};

// Gradient checkpointing over a Sequential: its modules are cut into `segments` runs of consecutive modules
// (as even as possible); every run but the last goes through autograd::checkpoint, so forward keeps only
// each run's input and backward recomputes the run, with the same random numbers. The last run executes
// normally, since backward needs its activations first (as PyTorch's checkpoint_sequential).
//   Tensor y = nn::checkpoint_sequential(*model, 4, x);   // model: a handle to a Sequential
Tensor checkpoint_sequential(const Sequential& modules, int64_t segments, const Tensor& input);

}  // namespace kiln::nn
