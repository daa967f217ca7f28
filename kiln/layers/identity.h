// kiln/layers/identity.h — nn::Identity: returns its input (a placeholder, e.g. for a removed head).
//
//   model->fc = std::make_shared<nn::Identity>();   // features instead of logits
#pragma once

#include "kiln/layers/module.h"  // nn::Module

namespace kiln::nn {

// Returns its input (a placeholder layer), as torch.nn.Identity.
class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& input) override { return input; }
};

}  // namespace kiln::nn
