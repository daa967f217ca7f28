// nn::Module: registration, traversal, modes, placement, state and summary (module.h).
#include "kiln/layers/module.h"

namespace kiln::nn {

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

Tensor Module::forward(const Tensor&) {
  throw NotImplementedError(detail::str_cat(type_name_, " has no forward(const Tensor&): it takes other inputs; call ",
                                            "its own forward with them"));
}

Module& Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
  return *this;
}

}  // namespace kiln::nn
