// kiln/layers/linear.h — nn::Linear: y = x W^T + b, with PyTorch's parameter names and initialisation.
//
//   auto fc = std::make_shared<nn::Linear>(784, 10);                 // "weight" (10, 784), "bias" (10)
//   auto head = std::make_shared<nn::Linear>(256, 2, nn::LinearOptions{.bias = false});
//   Tensor y = (*fc)(x);                                              // x (N, 784) -> (N, 10)
//
// Inside an amp::Autocast region with an FP8 recipe (kiln/autograd/amp.h) on the input's device type, a Linear the
// recipe's module filter selects computes in FP8 (kiln/layers/fp8_linear.h) and keeps its delayed-scaling state in
// three persistent buffers: "fp8_amax_history" (L, 3), "fp8_scale" (3), "fp8_scale_inv" (3) (columns: input, weight,
// output gradient). amp::prepare_fp8() makes them ahead of time; otherwise the first FP8 forward asks the filter
// with the name "" and makes them then.
#pragma once

#include <cstdint>
#include <memory>

#include "kiln/layers/module.h"     // nn::Module
#include "kiln/tensor/generator.h"  // Generator (reset_parameters)

namespace kiln::amp {
struct Fp8Recipe;
class Fp8ScalingState;
}  // namespace kiln::amp

namespace kiln::nn {

// Whether a Linear has a bias.
struct LinearOptions {
  bool bias = true;  // false: no "bias" parameter
};

// (..., in_features) -> (..., out_features). weight (out, in) and bias (out) start U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  // kiln::Error unless both sizes are positive.
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  Tensor forward(const Tensor& input) override;
  // forward(gelu(pre, tanh_approximation)), for a transformer MLP's second product (fc2->forward_gelu(fc1(x))). In an
  // FP8 region where this Linear computes in FP8, the GELU is applied as its input is quantised (nn::fp8_linear's
  // act), so that gelu(pre) is never written; elsewhere it is the two ops as written.
  Tensor forward_gelu(const Tensor& pre, bool tanh_approximation = false);
  // Redraws weight and bias from U(-1/sqrt(in), 1/sqrt(in)) (from gen, or the default generator), as PyTorch's.
  void reset_parameters(Generator* gen = nullptr);

  // FP8 (amp::prepare_fp8 calls these; a program rarely does). enable_fp8 makes the delayed-scaling state on
  // `device` and registers its buffers (nothing changes if there is one already); disable_fp8 keeps this Linear out
  // of FP8 regions (an existing state is kept, and unused).
  void enable_fp8(const amp::Fp8Recipe& recipe, Device device);
  // Keeps this Linear out of FP8 regions (see enable_fp8).
  void disable_fp8() { fp8_excluded_ = true; }
  // The FP8 state, or nullptr before enable_fp8 / the first FP8 forward.
  const amp::Fp8ScalingState* fp8_state() const { return fp8_state_.get(); }
  // The state a forward in an FP8 region under `recipe` on `device` uses (made now, as the first FP8 forward would,
  // where the filter selects this Linear and there is none yet), or nullptr where this Linear stays out of FP8. For
  // layers that compute a Linear's product themselves.
  amp::Fp8ScalingState* fp8_state_for(const amp::Fp8Recipe& recipe, Device device);
  // Makes this Linear use `owner`'s FP8 state (and its buffers hold the same memory as owner's): for one FP8 product
  // of several Linears' stacked weights on one input, which one state scales (BERT's query, key and value). Both must
  // have a state on one device. Module::to() separates them again (each then has its own copy); share again after.
  void share_fp8_state(const Linear& owner);

  // The size of the input's last dim.
  int64_t in_features, out_features;  // the size of the output's last dim
  Tensor weight;                      // (out_features, in_features)
  Tensor bias;                        // (out_features); undefined without bias

 private:
  // The FP8 state a forward on `input` computes with here (an FP8 region whose recipe selects this Linear), or null.
  amp::Fp8ScalingState* fp8_state_in_region(const Tensor& input);
  std::shared_ptr<amp::Fp8ScalingState> fp8_state_;
  bool fp8_excluded_ = false;
  Tensor fp8_buffers_[3];  // the registered buffers: amax history, scale, scale_inv (share the state's storage)
};

}  // namespace kiln::nn
