// kiln/layers/flatten.h — nn::Flatten: dims start_dim..end_dim merged into one, as PyTorch's nn.Flatten.
//
//   auto flat = std::make_shared<nn::Flatten>();   // (N, C, H, W) -> (N, C*H*W)
#pragma once

#include <cstdint>

#include "kiln/layers/module.h"  // nn::Module

namespace kiln::nn {

struct FlattenOptions {
  int64_t start_dim = 1;  // keeps the batch dim, as PyTorch's nn.Flatten
  int64_t end_dim = -1;
};

// (N, C, H, W) -> (N, C*H*W) with the defaults.
class Flatten : public Module {
 public:
  explicit Flatten(FlattenOptions options = {}) : Module("Flatten"), options(options) {}
  Tensor forward(const Tensor& input) override;

  FlattenOptions options;
};

}  // namespace kiln::nn
