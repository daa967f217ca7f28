// kiln/layers/activation.h — the activations as modules: nn::ReLU, GELU, SiLU, Tanh, Sigmoid, Softmax.
//
//   auto act = std::make_shared<nn::GELU>(nn::GELUOptions{.tanh_approximation = true});
//   Tensor y = (*act)(x);                                   // any shape; elementwise
//   auto probs = std::make_shared<nn::Softmax>(/*dim=*/-1);  // rows summing to 1
#pragma once

#include <cstdint>

#include "kiln/layers/module.h"  // nn::Module; kiln::relu, gelu, ... (differentiable)

namespace kiln::nn {

// max(x, 0), as torch.nn.ReLU.
class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& input) override { return relu(input); }
};

// Options of nn::GELU.
struct GELUOptions {
  bool tanh_approximation = false;  // PyTorch's approximate="tanh"
};

// The Gaussian error linear unit, exact (erf) or tanh-approximated, as torch.nn.GELU.
class GELU : public Module {
 public:
  // The exact GELU by default; options.tanh_approximation for the tanh form.
  explicit GELU(GELUOptions options = {}) : Module("GELU"), options(options) {}
  Tensor forward(const Tensor& input) override { return gelu(input, options.tanh_approximation); }

  GELUOptions options;  // as constructed
};

// x * sigmoid(x), as torch.nn.SiLU.
class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& input) override { return silu(input); }
};

// tanh(x), as torch.nn.Tanh.
class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& input) override { return kiln::tanh(input); }
};

// 1 / (1 + exp(-x)), as torch.nn.Sigmoid.
class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& input) override { return sigmoid(input); }
};

// Softmax along `dim` (negative counts from the end).
class Softmax : public Module {
 public:
  // Softmax along `dim`, as torch.nn.Softmax(dim).
  explicit Softmax(int64_t dim) : Module("Softmax"), dim(dim) {}
  Tensor forward(const Tensor& input) override { return softmax(input, dim); }

  int64_t dim;  // the dim normalised over, as constructed
};

}  // namespace kiln::nn
