// kiln/layers/module.h — nn::Module: the base of every layer and model.
//
//   struct Mlp : nn::Module {
//     std::shared_ptr<nn::Linear> fc1, fc2;
//     Mlp() {
//       fc1 = register_module("fc1", std::make_shared<nn::Linear>(784, 256));
//       fc2 = register_module("fc2", std::make_shared<nn::Linear>(256, 10));
//     }
//     Tensor forward(const Tensor& x) override { return (*fc2)(relu((*fc1)(x))); }
//   };
//   auto model = std::make_shared<Mlp>();
//   model->to(Device::cuda(0));
//   for (auto& [name, p] : model->named_parameters()) ...;   // "fc1.weight", "fc1.bias", "fc2.weight", ...
//
// A module owns its parameters (tensors that require grad and that optimizers update), buffers (state
// such as BatchNorm's running statistics) and children, each under a name, in registration order.
// Modules are held by std::shared_ptr; copying a module's handle shares it. Parameters are Tensor
// handles: to() changes their device or dtype in place, so handles held elsewhere (an optimizer, a
// data-parallel wrapper) stay valid.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/tensor/tensor.h"
#include "kiln/tensor/trace.h"  // a range per module call

namespace kiln::nn {

class Module;
using ModulePtr = std::shared_ptr<Module>;
// name -> tensor, in registration order (parameters first, then buffers, recursively), as PyTorch's.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module");
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The type shown in summaries and error messages ("Linear", "Conv2d", ...).
  const std::string& type_name() const { return type_name_; }

  // The computation of modules that map one tensor to one tensor (every layer in a Sequential).
  // Modules with other inputs define their own forward; this one then throws a clear error.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) {
    trace::Scope range(trace::Kind::Module, type_name_, input.defined() ? input.device() : Device::cpu());
    return forward(input);
  }

  // ---- registration (names: non-empty, no '.', unique within this module) ----
  // Stores the tensor under `name`, with requires_grad set as asked, and returns the stored handle.
  Tensor& register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  // Buffers are moved by to() and saved in state_dict() (unless not persistent), but never trained.
  Tensor& register_buffer(const std::string& name, Tensor tensor, bool persistent = true);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // ---- traversal (recursive ones in registration order, depth first, this module's own first) ----
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;  // "layer1.0.conv1.weight"
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<ModulePtr> children() const;
  std::vector<std::pair<std::string, ModulePtr>> named_children() const;
  std::vector<ModulePtr> modules();                                // this module and every descendant
  std::vector<std::pair<std::string, ModulePtr>> named_modules();  // "" for this module
  // fn(module) on every module, children first then this one (as PyTorch's apply).
  Module& apply(const std::function<void(Module&)>& fn);

  // ---- modes and placement ----
  virtual Module& train(bool on = true);  // recursive
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }
  // Moves parameters and buffers (recursively) in place: gradients move with them. dtype applies to
  // floating-point tensors only; a memory format applies to 4-d tensors only.
  Module& to(Device device, bool non_blocking = false);
  Module& to(DType dtype);
  Module& to(Device device, DType dtype, bool non_blocking = false);
  Module& to(MemoryFormat format);
  Module& to(Device device, MemoryFormat format);
  // Resets every parameter's gradient: to undefined (set_to_none, the default), or to zeros.
  void zero_grad(bool set_to_none = true);

  // ---- state ----
  StateDict state_dict() const;  // parameters and persistent buffers, detached, sharing memory
  struct LoadResult {
    std::vector<std::string> missing_keys{}, unexpected_keys{};
  };
  // Copies values into the module's tensors (converting dtype and device). strict: every key must match
  // and every shape agree, else kiln::Error listing the missing, unexpected and mismatched keys and
  // nothing is changed. Not strict: loads what matches by name and shape, reports the rest.
  // A tied tensor (registered under several names) needs one of its names and is copied once, from the
  // first given in state_dict() order: state dicts that keep one copy of a tied weight (Hugging Face's
  // save_pretrained) load strictly.
  LoadResult load_state_dict(const StateDict& state, bool strict = true);

  // ---- summary ----
  // One line per module (dotted name, type, own parameter count), then the trainable and total
  // parameter counts and their bytes.
  std::string summary();
  int64_t num_parameters(bool trainable_only = false) const;

 protected:
  // For containers that hold children by index ("0", "1", ...).
  void add_child(const std::string& name, ModulePtr module);
  void set_type_name(std::string name) { type_name_ = std::move(name); }

 private:
  struct BufferSlot {
    std::string name;
    Tensor tensor;
    bool persistent;
  };
  void check_new_name(const std::string& name, const char* what) const;
  void to_impl(std::optional<Device> device, std::optional<DType> dtype, std::optional<MemoryFormat> format,
               bool non_blocking);

  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<BufferSlot> buffers_;
  std::vector<std::pair<std::string, ModulePtr>> children_;
};

}  // namespace kiln::nn
