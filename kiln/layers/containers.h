// kiln/layers/containers.h — modules that hold other modules: Sequential, ModuleList, ModuleDict.
//
//   auto mlp = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
//       std::make_shared<nn::Linear>(784, 256), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(256, 10)});
//   Tensor logits = (*mlp)(x);                 // (N, 784) -> (N, 10); parameters "0.weight", "0.bias", "2.weight", ...
//
//   nn::ModuleList blocks;                     // children "0", "1", ...; iterate and call them yourself
//   blocks.push_back(std::make_shared<Block>());
//   for (const auto& b : blocks) h = (*b)(h);
//
//   nn::ModuleDict heads;                      // children under their keys, in insertion order
//   heads.insert("cls", std::make_shared<nn::Linear>(768, 2));
//   Tensor y = (*heads["cls"])(h);
//
// Children are registered under "0", "1", ... (Sequential, ModuleList) or their keys (ModuleDict), so
// parameter names match PyTorch's and state dicts can be exchanged with it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/layers/module.h"

namespace kiln::nn {

// What Sequential and ModuleList share: children held by index, registered under "0", "1", ... (or a
// name of the caller's choice), as PyTorch names them.
class IndexedModules : public Module {
 public:
  // The i-th module (negative i counts from the end); at<T>(i) casts it to its concrete type.
  const ModulePtr& operator[](int64_t index) const;
  template <typename M>
  std::shared_ptr<M> at(int64_t index) const {
    auto out = std::dynamic_pointer_cast<M>((*this)[index]);
    if (out == nullptr) throw_bad_cast(index);
    return out;
  }
  int64_t size() const { return static_cast<int64_t>(modules_.size()); }
  bool empty() const { return modules_.empty(); }
  std::vector<ModulePtr>::const_iterator begin() const { return modules_.begin(); }
  std::vector<ModulePtr>::const_iterator end() const { return modules_.end(); }

 protected:
  explicit IndexedModules(std::string type_name) : Module(std::move(type_name)) {}
  void add_indexed(const std::string& name, ModulePtr module);  // registers and appends
  std::string next_index() const { return std::to_string(modules_.size()); }

 private:
  [[noreturn]] void throw_bad_cast(int64_t index) const;
  std::vector<ModulePtr> modules_;
};

// Chains modules that each map one tensor to one tensor: forward(x) = m_n(... m_1(m_0(x))).
class Sequential : public IndexedModules {
 public:
  Sequential();
  explicit Sequential(const std::vector<ModulePtr>& modules);
  Sequential(std::initializer_list<ModulePtr> modules) : Sequential(std::vector<ModulePtr>(modules)) {}

  // Appends under the next index ("0", "1", ...), or under a name of your choice.
  Sequential& append(ModulePtr module);
  Sequential& append(const std::string& name, ModulePtr module);

  // An empty Sequential returns its input unchanged, as PyTorch's.
  Tensor forward(const Tensor& input) override;
};

// Holds modules by index for code that calls them itself (a stack of transformer blocks). No forward.
class ModuleList : public IndexedModules {
 public:
  ModuleList();
  explicit ModuleList(const std::vector<ModulePtr>& modules);

  ModuleList& push_back(ModulePtr module);       // registered under the next index
  Tensor forward(const Tensor& input) override;  // throws: a ModuleList does not know how to chain its modules
};

// Holds modules by name, in insertion order (task heads, per-language embeddings). No forward.
class ModuleDict : public Module {
 public:
  ModuleDict();

  // Registers the module under `key`; a key already present is an error (keys are unique).
  ModuleDict& insert(const std::string& key, ModulePtr module);
  Tensor forward(const Tensor& input) override;  // throws: call the module you want, heads[key]

  const ModulePtr& operator[](const std::string& key) const;  // a missing key is an error listing the keys
  bool contains(const std::string& key) const;
  std::vector<std::string> keys() const;  // insertion order
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  bool empty() const { return entries_.empty(); }
  std::vector<std::pair<std::string, ModulePtr>>::const_iterator begin() const { return entries_.begin(); }
  std::vector<std::pair<std::string, ModulePtr>>::const_iterator end() const { return entries_.end(); }

 private:
  std::vector<std::pair<std::string, ModulePtr>> entries_;
};

// Gradient checkpointing over a Sequential: its modules are cut into `segments` runs of consecutive modules
// (as even as possible); every run but the last goes through autograd::checkpoint, so forward keeps only
// each run's input and backward recomputes the run, with the same random numbers. The last run executes
// normally, since backward needs its activations first (as PyTorch's checkpoint_sequential).
//   Tensor y = nn::checkpoint_sequential(*model, 4, x);
Tensor checkpoint_sequential(const Sequential& modules, int64_t segments, const Tensor& input);

}  // namespace kiln::nn
