// kiln/layers/init.h — weight initialisation as PyTorch's torch.nn.init: in place, without recording gradients.
//
//   using namespace kiln;
//   nn::init::kaiming_normal_(conv_weight, 0, nn::init::FanMode::FanOut, nn::init::Nonlinearity::ReLU);
//   nn::init::xavier_uniform_(w, nn::init::calculate_gain(nn::init::Nonlinearity::Tanh));
//   nn::init::trunc_normal_(pos_embedding, 0, 0.02);       // values in [-2, 2] (absolute bounds, as PyTorch)
//   nn::init::zeros_(bias);
//
// Each function runs under NoGradGuard on the tensor in place (so on parameters that require grad too)
// and returns it; random ones draw from `gen`, or from the default generator of the tensor's device.
//
// Building a model whose start is drawn later (or loaded) need not draw one first, as torch.nn.utils.skip_init:
//   { nn::SkipInit skip; table = nn::make<nn::Embedding>(100'000'000, 128, nn::EmbeddingOptions{.device = gpu}); }
//   nn::init::uniform_(table->weight, -1e-4, 1e-4);  // the only draw
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "kiln/tensor/generator.h"  // Generator
#include "kiln/tensor/tensor.h"     // Tensor, Scalar

namespace kiln::nn {

// While a SkipInit lives on a thread, the nn::init functions called on that thread check their arguments and
// return the tensor without writing it or drawing from any generator. Modules built meanwhile keep parameters
// whose values are unspecified (the memory as allocated) and leave the generators where they were, so a model whose
// start comes from its own draws or from a checkpoint skips the draws it would throw away: for a 10^8-row table,
// 12.8e9 numbers drawn on the host. Guards nest; the last one destroyed ends the skipping. Buffers set without
// nn::init (for example a batch norm's running variance of ones) are unaffected.
class SkipInit {
 public:
  SkipInit();
  ~SkipInit();
  SkipInit(const SkipInit&) = delete;
  SkipInit& operator=(const SkipInit&) = delete;
  // Whether a SkipInit lives on this thread.
  static bool active();
};

}  // namespace kiln::nn

namespace kiln::nn::init {

// The activation a weight feeds, for calculate_gain (as torch.nn.init.calculate_gain's names).
enum class Nonlinearity {
  Linear,
  Conv1d,
  Conv2d,
  Conv3d,
  ConvTranspose1d,
  ConvTranspose2d,
  ConvTranspose3d,
  Sigmoid,
  Tanh,
  ReLU,
  LeakyReLU,
  SELU
};
// Which fan the Kaiming initialisations scale by: FanIn preserves the forward pass's variance, FanOut backward's.
enum class FanMode { FanIn, FanOut };

// PyTorch's recommended gains: 1 for linear, conv and sigmoid; 5/3 for tanh; sqrt(2) for ReLU;
// sqrt(2 / (1 + slope^2)) for leaky ReLU (slope defaults to 0.01); 3/4 for SELU.
double calculate_gain(Nonlinearity nonlinearity, std::optional<double> param = {});

// (fan_in, fan_out) of a weight with at least 2 dims: size(1) and size(0), times the receptive field
// (the product of dims 2...), e.g. a conv weight (out, in, kh, kw) gives (in*kh*kw, out*kh*kw).
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

// The functions below fill t in place without recording gradients and return t, as torch.nn.init's; gen: the
// generator drawn from, or the default one of t's device. Under a SkipInit they write and draw nothing.
// U(a, b); kiln::Error if a > b.
Tensor& uniform_(Tensor& t, double a = 0, double b = 1, Generator* gen = nullptr);
// N(mean, std^2); kiln::Error if std < 0.
Tensor& normal_(Tensor& t, double mean = 0, double std = 1, Generator* gen = nullptr);
Tensor& constant_(Tensor& t, Scalar value);  // every element `value`
Tensor& zeros_(Tensor& t);                   // every element 0
Tensor& ones_(Tensor& t);                    // every element 1

// U(-bound, bound) with bound = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a).
Tensor& kaiming_uniform_(Tensor& t, double a = 0, FanMode mode = FanMode::FanIn,
                         Nonlinearity nonlinearity = Nonlinearity::LeakyReLU, Generator* gen = nullptr);
// N(0, std^2) with std = gain / sqrt(fan).
Tensor& kaiming_normal_(Tensor& t, double a = 0, FanMode mode = FanMode::FanIn,
                        Nonlinearity nonlinearity = Nonlinearity::LeakyReLU, Generator* gen = nullptr);
// U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)).
Tensor& xavier_uniform_(Tensor& t, double gain = 1, Generator* gen = nullptr);
// N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor& xavier_normal_(Tensor& t, double gain = 1, Generator* gen = nullptr);
// N(mean, std^2) truncated to [a, b] (absolute bounds), by inverting the normal CDF of a uniform draw.
Tensor& trunc_normal_(Tensor& t, double mean = 0, double std = 1, double a = -2, double b = 2,
                      Generator* gen = nullptr);

}  // namespace kiln::nn::init
