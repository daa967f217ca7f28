// kiln/autograd/fp8.h — the FP8 recipe (amp::Fp8Recipe) and its delayed-scaling state (amp::Fp8ScalingState).
//
//   amp::Fp8Recipe recipe{.format = amp::Fp8Format::Hybrid, .amax_history_len = 1024, .margin = 0};
//   auto state = amp::Fp8ScalingState::for_linear(recipe, Device::cpu());  // 0: input, 1: weight, 2: grad_output
//   // each step: quantise with the current scales, and record what each tensor held
//   state.record_amax(0, x);                        // history[0, 0] = max(history[0, 0], amax(|x|))
//   state.record_amax(1, w);
//   state.record_amax(2, grad_y);
//   state.update();                                  // next step's scales, from the history (no host sync)
//   Tensor s = state.scale();                        // (3,) float32: x_fp8 = saturate(x * s[0]), ...
//   auto saved = state.state_dict();  other.load_state_dict(saved);  // exact resume
//
// Delayed scaling, as NVIDIA Transformer Engine's DelayedScaling recipe: a tensor is quantised to FP8 as
// saturate(x * scale) with a scale chosen from the absolute maxima (amax) that the same tensor had in the previous
// steps, so that quantising needs no reduction over the tensor first. Each tracked tensor j (a column) has an amax
// history h[:, j] of amax_history_len rows; row 0 is the current step's, where record_amax() writes (keeping the
// largest value recorded since the last update, e.g. over micro-batches). update() then does, for each column j,
// with c = h[0, j]:
//
//   - c == 0 (nothing recorded since the last update, or only zeros): nothing changes, neither h[:, j] nor the scale.
//   - otherwise the window amax is
//        a = max over the rows i of h[i, j] whose value is not NaN (0 if none)    (amax_compute_algo Max)
//        a = c                                                                   (amax_compute_algo MostRecent)
//     and the history rolls: the current value moves to the last row, row 1 leaves, the rest move up one row, and
//     row 0 becomes 0 for the next step:  h'[0] = 0,  h'[i] = h[i + 1] (0 < i < L - 1),  h'[L - 1] = c
//     (L = 1: h'[0] = 0). In steady state the window thus spans the current step and the L - 1 before it.
//   - the new scale (float32 arithmetic):
//        scale' = (fp8_max / 2^margin) / a        where a is finite and a > 0,
//        scale' = scale                           where a is 0, inf or NaN (the old scale is kept),
//        scale' = FLT_MAX                         where the quotient overflows to inf (a tiny amax),
//        scale_inv' = 1 / scale'.
//     fp8_max is the format's largest finite value: 448 for E4M3, 57344 for E5M2. The format of a column follows its
//     pass: under Fp8Format::Hybrid forward tensors (inputs, weights) use E4M3 and backward ones (gradients) E5M2;
//     under Fp8Format::E4M3 every tensor uses E4M3. A margin m leaves headroom of 2^m above the window's amax.
//
// These are Transformer Engine's rules (its fused amax-and-scale update): NaN amaxes are skipped by the window
// maximum, an inf in the window keeps the scale until it leaves the window. update() is one backend call on the
// state's device (internal::fp8_update_scales in kiln/tensor/fp8_ops.h: one kernel on CUDA, no host loop, no read of
// a device value), so it can run on a GPU stream, inside a CUDA graph capture. The initial state is a zero history,
// scale = scale_inv = 1.
#pragma once

#include <cstdint>
#include <functional>  // std::function for the module filter
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::amp {

// Which FP8 formats a recipe uses (Transformer Engine's Format; pure E5M2 training is not offered).
enum class Fp8Format {
  Hybrid,  // E4M3 for forward tensors (activations, weights), E5M2 for gradients: the default
  E4M3,    // E4M3 everywhere
};

// How update() picks the amax from a column's history.
enum class AmaxComputeAlgo {
  Max,         // the largest (non-NaN) value of the history window: the default
  MostRecent,  // the current step's value
};

// Which pass a tracked tensor belongs to: it decides the tensor's FP8 format (see Fp8Format).
enum class Fp8Pass { Forward, Backward };

// What the module filter sees of a module that could compute in FP8.
struct Fp8ModuleInfo {
  std::string_view name;     // the module's qualified name in its model ("encoder.layer.0.attention.query"), or ""
  std::string_view type;     // the module's type name ("Linear")
  int64_t in_features = 0;   // its input features
  int64_t out_features = 0;  // its output features
};
using Fp8ModuleFilter = std::function<bool(const Fp8ModuleInfo&)>;  // true: the module computes in FP8

// The default filter: every "Linear" whose in_features and out_features are positive multiples of 16 (what the FP8
// tensor-core GEMMs need).
bool default_fp8_module_filter(const Fp8ModuleInfo& module);

// How FP8 autocast quantises: formats, the amax history, the scale margin, which modules.
struct Fp8Recipe {
  Fp8Format format = Fp8Format::Hybrid;                       // the FP8 formats of forward and backward tensors
  int64_t amax_history_len = 1024;                            // rows of the amax history, >= 1
  int64_t margin = 0;                                         // scales leave 2^margin of headroom; 0 <= margin <= 64
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::Max;   // how a scale is chosen from the history
  Fp8ModuleFilter module_filter = default_fp8_module_filter;  // which modules compute in FP8
  // Under data parallelism every rank must compute the same scales. When set, update() first calls it on the
  // amaxes recorded since the last update (row 0 of the history: (N,) float32, contiguous, on the state's device),
  // which it replaces in place by their maximum over the ranks: dist::fp8_amax_reduction()
  // (kiln/distributed/process_group.h) does that on the world group, one small all-reduce per state and update.
  // Every rank must then update the same states in the same order, as the ranks of one model do. Empty: each
  // process scales by its own amaxes. Like the module filter it is code, so checkpoints do not hold it.
  std::function<void(const Tensor& amaxes)> amax_reduction{};

  // Throws kiln::Error naming the first invalid option and its valid range.
  void validate() const;
};

// "max" or "most_recent" (Transformer Engine's names), e.g. from a command line; kiln::Error for anything else.
AmaxComputeAlgo parse_amax_compute_algo(std::string_view name);
const char* amax_compute_algo_name(AmaxComputeAlgo algo);  // "max", "most_recent"
const char* fp8_format_name(Fp8Format format);             // "hybrid", "e4m3"

// The FP8 dtype of a tensor of `pass` under `format`, and the largest finite value of an FP8 dtype.
DType fp8_dtype(Fp8Format format, Fp8Pass pass);
double fp8_max(DType fp8_dtype);  // 448 (Float8_e4m3fn), 57344 (Float8_e5m2)

// A flat, name-keyed form of the state, for checkpoints (the shape of optim::OptimizerState):
//   tensors: "amax_history" (L, N), "scale" (N,), "scale_inv" (N,), float32 copies on the state's device;
//   values:  "format" (0 Hybrid, 1 E4M3), "amax_history_len", "margin", "amax_compute_algo" (0 Max, 1 MostRecent),
//            "num_tensors" (N), "pass.<j>" (0 Forward, 1 Backward) for each column j.
// The module filter is code and is not saved: the loading recipe keeps its own.
struct Fp8StateDict {
  std::map<std::string, Tensor> tensors{};  // "amax_history", "scale", "scale_inv" (copies)
  std::map<std::string, double> values{};   // the recipe's options, "num_tensors" and "pass.<j>"
};

// The delayed-scaling state of N tensors (e.g. one Linear layer's input, weight and output gradient).
class Fp8ScalingState {
 public:
  // One column per entry of `passes`. Validates the recipe; kiln::Error if `passes` is empty.
  Fp8ScalingState(Fp8Recipe recipe, std::vector<Fp8Pass> passes, Device device = Device::cpu());
  // A Linear layer's three: 0 input (Forward), 1 weight (Forward), 2 output gradient (Backward).
  static Fp8ScalingState for_linear(Fp8Recipe recipe, Device device = Device::cpu());
  // Movable, not copyable: a copy would share the history and scale tensors (use state_dict() for a snapshot).
  Fp8ScalingState(Fp8ScalingState&&) = default;
  Fp8ScalingState& operator=(Fp8ScalingState&&) = default;  // takes over the other's tensors
  Fp8ScalingState(const Fp8ScalingState&) = delete;
  Fp8ScalingState& operator=(const Fp8ScalingState&) = delete;

  // The number of tensors tracked (columns).
  int64_t size() const { return static_cast<int64_t>(passes_.size()); }
  // The recipe it was made with.
  const Fp8Recipe& recipe() const { return recipe_; }
  // The device of its tensors.
  Device device() const { return device_; }
  Fp8Pass pass(int64_t j) const;     // tensor j's pass; IndexError when out of range
  DType fp8_dtype(int64_t j) const;  // the FP8 dtype tensor j is quantised to

  // h[0, j] = max(h[0, j], amax(|t|)), by tensor ops on t's device, which must be the state's. A NaN in t records
  // NaN; an empty t records nothing. t: a floating tensor (float32, float64, float16, bfloat16).
  void record_amax(int64_t j, const Tensor& t);
  // The new scales from the history, and the history rolled (see the header comment). scale_copy and
  // scale_inv_copy, where given ((N,) float32 on the state's device, any stride), receive copies of the new scale and
  // scale_inv from the same kernel: the scales of this call, which a later update() does not change (an FP8 layer
  // keeps them for its backward).
  void update(const Tensor& scale_copy = {}, const Tensor& scale_inv_copy = {});

  // The amax history, (L, N) float32; row 0 is the current step's.
  const Tensor& amax_history() const { return amax_history_; }
  // The scales, (N,) float32.
  const Tensor& scale() const { return scale_; }
  // Their inverses 1 / scale, (N,) float32.
  const Tensor& scale_inv() const { return scale_inv_; }

  Fp8StateDict state_dict() const;  // copies of the tensors and the recipe's options
  // Restores the history, scales and recipe options (not the module filter) saved by state_dict(), copying the
  // tensors onto this state's device. kiln::Error, and nothing changed, when a key is missing, a tensor's shape or
  // dtype does not match the saved options, an option is invalid, or the columns' number or passes differ.
  void load_state_dict(const Fp8StateDict& state);

 private:
  void reset_fp8_limits();  // scaled_max_ from the recipe and passes

  Fp8Recipe recipe_;
  std::vector<Fp8Pass> passes_;
  Device device_;
  Tensor amax_history_;  // (L, N) float32
  Tensor scale_;         // (N,) float32
  Tensor scale_inv_;     // (N,) float32
  Tensor scaled_max_;    // (N,) float32: fp8_max of each column's format / 2^margin
};

}  // namespace kiln::amp
