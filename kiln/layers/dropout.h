// kiln/layers/dropout.h — nn::Dropout: inverted dropout in training mode, the identity in eval mode.
//
//   auto drop = std::make_shared<nn::Dropout>(0.1);
//   Tensor y = (*drop)(x);   // training: each element zeroed with probability 0.1, the rest scaled by 1 / 0.9
#pragma once

#include "kiln/layers/module.h"  // nn::Module

namespace kiln::nn {

// Options of nn::Dropout.
struct DropoutOptions {
  double p = 0.5;  // probability of zeroing an element, in [0, 1)
};

// Inverted dropout in training mode; the identity in eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(DropoutOptions options = {});  // kiln::Error unless 0 <= p < 1
  // Dropout(DropoutOptions{.p = p}), as torch.nn.Dropout(p).
  explicit Dropout(double p) : Dropout(DropoutOptions{.p = p}) {}
  Tensor forward(const Tensor& input) override;

  DropoutOptions options;  // as constructed; p is read at every forward
};

}  // namespace kiln::nn
