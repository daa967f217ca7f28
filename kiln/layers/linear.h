// kiln/layers/linear.h — nn::Linear: y = x W^T + b, with PyTorch's parameter names and initialisation.
//
//   auto fc = std::make_shared<nn::Linear>(784, 10);                 // "weight" (10, 784), "bias" (10)
//   auto head = std::make_shared<nn::Linear>(256, 2, nn::LinearOptions{.bias = false});
//   Tensor y = (*fc)(x);                                              // x (N, 784) -> (N, 10)
#pragma once

#include <cstdint>

#include "kiln/layers/module.h"     // nn::Module
#include "kiln/tensor/generator.h"  // Generator (reset_parameters)

namespace kiln::nn {

struct LinearOptions {
  bool bias = true;
};

// (..., in_features) -> (..., out_features). weight (out, in) and bias (out) start U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  Tensor forward(const Tensor& input) override;
  void reset_parameters(Generator* gen = nullptr);

  int64_t in_features, out_features;
  Tensor weight;  // (out_features, in_features)
  Tensor bias;    // (out_features); undefined without bias
};

}  // namespace kiln::nn
