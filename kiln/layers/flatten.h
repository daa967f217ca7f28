// kiln/layers/flatten.h — nn::Flatten: dims start_dim..end_dim merged into one, as PyTorch's nn.Flatten.
//
//   auto flat = std::make_shared<nn::Flatten>();   // (N, C, H, W) -> (N, C*H*W)
#pragma once

#include <cstdint>

#include "kiln/layers/module.h"  // nn::Module

namespace kiln::nn {

// Options of nn::Flatten: the dims start_dim..end_dim (inclusive) become one.
struct FlattenOptions {
  int64_t start_dim = 1;  // keeps the batch dim, as PyTorch's nn.Flatten
  int64_t end_dim = -1;   // the last dim flattened (inclusive); negative counts from the end
};

// (N, C, H, W) -> (N, C*H*W) with the defaults.
class Flatten : public Module {
 public:
  // Flattens dims options.start_dim..options.end_dim, as torch.nn.Flatten.
  explicit Flatten(FlattenOptions options = {}) : Module("Flatten"), options(options) {}
  Tensor forward(const Tensor& input) override;

  FlattenOptions options;  // as constructed
};

}  // namespace kiln::nn
