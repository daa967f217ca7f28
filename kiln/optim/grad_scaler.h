// kiln/optim/grad_scaler.h — amp::GradScaler: dynamic loss scaling for float16 mixed precision.
//
//   amp::GradScaler scaler;                      // {.init_scale = 65536, .growth_interval = 2000, ...}
//   for (...) {
//     opt.zero_grad();
//     Tensor loss;
//     { amp::Autocast cast(DType::Float16); loss = nn::cross_entropy(model->forward(x), y); }
//     scaler.scale(loss).backward();            // gradients are scaled by S
//     scaler.unscale_(opt);                     // optional: true gradients now, e.g. for clipping
//     nn::utils::clip_grad_norm_(model->parameters(), 1.0);
//     scaler.step(opt);                         // skipped when a gradient was inf/NaN
//     scaler.update();                          // S *= 0.5 after an overflow, S *= 2 after growth_interval clean steps
//   }
//
// No method but get_scale() and state_dict() reads a device value on the host: the scale, the growth tracker
// and found_inf stay 1-element float32 tensors on the device of the first scaled loss (and of the gradients),
// and step() hands found_inf to Optimizer::step_with(), which skips the update on the GPU. For CPU-only
// optimizers step() reads found_inf (free on the host) and calls step() or not.
// bfloat16 has float32's range and needs no scaling: GradScaler({.enabled = false}) then makes scale() return
// the loss, step() call opt.step() and update() do nothing, so one training loop serves both.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/optim/optimizer.h"
#include "kiln/tensor/tensor.h"

namespace kiln::amp {

// The loss scale's start, growth and back-off, as torch.amp.GradScaler's arguments.
struct GradScalerOptions {
  double init_scale = 65536.0;     // 2^16
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // consecutive steps without inf/NaN before the scale grows
  bool enabled = true;             // false: scale() returns the loss, step() calls opt.step(), update() does nothing
};

// Dynamic loss scaling for fp16 training: scales the loss, unscales and checks the gradients, skips steps with
// inf/NaN, adapts the scale; its state stays on the device.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});  // throws kiln::Error on an invalid option

  // loss * scale (the scale as a float32 tensor on the loss's device); the loss itself when disabled.
  Tensor scale(const Tensor& loss);
  // Divides the gradients of `opt`'s parameters by the scale in place and records whether any is inf/NaN
  // (one fused kernel per device and dtype on CUDA). At most once per optimizer between two update() calls.
  void unscale_(optim::Optimizer& opt);
  // unscale_(opt) unless done, then the optimizer update, skipped if any gradient was inf/NaN.
  void step(optim::Optimizer& opt);
  // The new scale from this iteration's inf/NaN checks (of every optimizer stepped or unscaled), on the device.
  void update();

  // options().enabled.
  bool is_enabled() const { return options_.enabled; }
  // The options given to the constructor.
  const GradScalerOptions& options() const { return options_; }
  // The current scale. Reads the device tensor: synchronises the host with its stream (for logging, not for
  // every step). 1.0 when disabled; init_scale before the first scale().
  double get_scale() const;
  int64_t get_growth_tracker() const;  // synchronises too
  // The scale tensor itself ((1,) float32 on the device), undefined before the first scale() or when disabled.
  const Tensor& scale_tensor() const { return scale_; }

  // {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} (PyTorch's keys); empty
  // when disabled. Reads the device scale: synchronises.
  std::map<std::string, double> state_dict() const;
  // Throws kiln::Error naming a missing key (and changes nothing) or an empty dict; ignored when disabled.
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    std::vector<Tensor> found_inf{};  // one (1,) float32 tensor per device of the optimizer's gradients
  };
  void check_options() const;
  Tensor found_inf_of(const PerOptimizer& st, Device device) const;  // the sum over devices, on `device`

  GradScalerOptions options_;
  Tensor scale_;           // (1,) float32, created by the first scale() on the loss's device
  Tensor growth_tracker_;  // (1,) float32 count of consecutive clean steps, beside scale_
  double pending_scale_;   // the scale and tracker until scale_ exists (init_scale, or a loaded state)
  double pending_tracker_ = 0;
  std::map<const optim::Optimizer*, PerOptimizer> per_optimizer_;  // this iteration's, cleared by update()
};

}  // namespace kiln::amp
