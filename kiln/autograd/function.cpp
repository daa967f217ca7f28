// The parts of custom functions (function.h) that need no template: saving tensors, zero gradients.
#include "kiln/autograd/function.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

#include "kiln/tensor/internal_ops.h"

namespace kiln::autograd {

void Context::finish_forward(const Node* node, const TensorList& outputs) {
  node_ = node;
  for (const Tensor& t : to_save_) {
    bool is_output = false;
    for (const Tensor& o : outputs) is_output = is_output || (t.defined() && o.defined() && t.is_alias_of(o));
    saved_.emplace_back(t, is_output);
  }
  to_save_.clear();
}

TensorList Context::saved() const {
  if (node_ == nullptr) return to_save_;  // forward without recording
  KILN_CHECK(!released_, "Context::saved: backward already ran through this function and freed its saved tensors; ",
             "pass retain_graph=true to the first backward() to run it again");
  TensorList out;
  out.reserve(saved_.size());
  for (const SavedTensor& s : saved_) out.push_back(s.unpack(*node_));
  return out;
}

std::string demangled_name(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(mangled);
}

Tensor zeros_from_meta(const InputMeta& meta) {
  return internal::zeros(meta.shape, {.dtype = meta.dtype, .device = meta.device});
}

}  // namespace kiln::autograd
