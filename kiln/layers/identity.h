// kiln/layers/identity.h — nn::Identity: returns its input (a placeholder, e.g. for a removed head).
//
//   model->fc = std::make_shared<nn::Identity>();   // features instead of logits
#pragma once

#include "kiln/layers/module.h"  // nn::Module

namespace kiln::nn {

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& input) override { return input; }
};

}  // namespace kiln::nn
