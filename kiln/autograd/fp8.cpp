// kiln/autograd/fp8.cpp — the FP8 recipe's options and the delayed-scaling state; its update is one backend call
// (internal::fp8_update_scales, no host sync).
#include "kiln/autograd/fp8.h"

#include <cmath>
#include <limits>
#include <utility>

#include "kiln/autograd/grad_mode.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/fp8_ops.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::amp {
namespace {

constexpr int64_t kMaxMargin = 64;
// The history holds L * N float32 values; a bound far above any real use that keeps L * N * 4 bytes in range.
constexpr int64_t kMaxHistoryLen = int64_t{1} << 24;

TensorOptions f32_on(Device device) { return {.dtype = DType::Float32, .device = device}; }

double pass_code(Fp8Pass pass) { return pass == Fp8Pass::Forward ? 0.0 : 1.0; }

}  // namespace

bool default_fp8_module_filter(const Fp8ModuleInfo& module) {
  return module.type == "Linear" && module.in_features > 0 && module.out_features > 0 && module.in_features % 16 == 0 &&
         module.out_features % 16 == 0;
}

void Fp8Recipe::validate() const {
  KILN_CHECK(format == Fp8Format::Hybrid || format == Fp8Format::E4M3, "Fp8Recipe: format ", static_cast<int>(format),
             " is not an Fp8Format; use Fp8Format::Hybrid or Fp8Format::E4M3");
  KILN_CHECK(amax_history_len >= 1 && amax_history_len <= kMaxHistoryLen, "Fp8Recipe: amax_history_len must be in [1, ",
             kMaxHistoryLen, "], got ", amax_history_len);
  KILN_CHECK(margin >= 0 && margin <= kMaxMargin, "Fp8Recipe: margin must be in [0, ", kMaxMargin, "] (the scales ",
             "leave 2^margin of headroom), got ", margin);
  KILN_CHECK(amax_compute_algo == AmaxComputeAlgo::Max || amax_compute_algo == AmaxComputeAlgo::MostRecent,
             "Fp8Recipe: amax_compute_algo ", static_cast<int>(amax_compute_algo),
             " is not an AmaxComputeAlgo; use AmaxComputeAlgo::Max or AmaxComputeAlgo::MostRecent");
  KILN_CHECK(static_cast<bool>(module_filter), "Fp8Recipe: module_filter is empty; leave the default ",
             "(default_fp8_module_filter) or pass a predicate");
}

AmaxComputeAlgo parse_amax_compute_algo(std::string_view name) {
  if (name == "max") return AmaxComputeAlgo::Max;
  if (name == "most_recent") return AmaxComputeAlgo::MostRecent;
  KILN_FAIL("Fp8Recipe: unknown amax_compute_algo \"", name, "\"; expected \"max\" or \"most_recent\"");
}

const char* amax_compute_algo_name(AmaxComputeAlgo algo) {
  return algo == AmaxComputeAlgo::Max ? "max" : "most_recent";
}

const char* fp8_format_name(Fp8Format format) { return format == Fp8Format::Hybrid ? "hybrid" : "e4m3"; }

DType fp8_dtype(Fp8Format format, Fp8Pass pass) {
  return format == Fp8Format::Hybrid && pass == Fp8Pass::Backward ? DType::Float8_e5m2 : DType::Float8_e4m3fn;
}

double fp8_max(DType fp8_dtype) {
  KILN_CHECK(is_float8(fp8_dtype), "fp8_max: ", fp8_dtype, " is not an FP8 dtype; use Float8_e4m3fn or Float8_e5m2");
  return fp8_dtype == DType::Float8_e4m3fn ? 448.0 : 57344.0;
}

// ---------------------------------------------------------------- Fp8ScalingState

Fp8ScalingState::Fp8ScalingState(Fp8Recipe recipe, std::vector<Fp8Pass> passes, Device device)
    : recipe_(std::move(recipe)), passes_(std::move(passes)), device_(device) {
  recipe_.validate();
  KILN_CHECK(!passes_.empty(), "Fp8ScalingState: no tensors to track; pass one Fp8Pass per tensor");
  for (size_t j = 0; j < passes_.size(); ++j) {
    KILN_CHECK(passes_[j] == Fp8Pass::Forward || passes_[j] == Fp8Pass::Backward, "Fp8ScalingState: passes[", j,
               "] is not an Fp8Pass; use Fp8Pass::Forward or Fp8Pass::Backward");
  }
  const int64_t n = size();
  amax_history_ = internal::zeros({recipe_.amax_history_len, n}, f32_on(device_));
  scale_ = internal::ones({n}, f32_on(device_));
  scale_inv_ = internal::ones({n}, f32_on(device_));
  reset_fp8_limits();
}

Fp8ScalingState Fp8ScalingState::for_linear(Fp8Recipe recipe, Device device) {
  return Fp8ScalingState(std::move(recipe), {Fp8Pass::Forward, Fp8Pass::Forward, Fp8Pass::Backward}, device);
}

void Fp8ScalingState::reset_fp8_limits() {
  // fp8_max / 2^margin is exact in double and in float32 (a power-of-two division of 448 or 57344, margin <= 64).
  const double headroom = std::ldexp(1.0, static_cast<int>(recipe_.margin));
  std::vector<double> limits;
  for (size_t j = 0; j < passes_.size(); ++j) limits.push_back(amp::fp8_max(fp8_dtype(j)) / headroom);
  scaled_max_ = internal::from_vector(limits, {size()}).to(device_, DType::Float32);
}

Fp8Pass Fp8ScalingState::pass(int64_t j) const {
  KILN_CHECK_AS(IndexError, j >= 0 && j < size(), "Fp8ScalingState: tensor index ", j, " is out of range for ", size(),
                " tracked tensors");
  return passes_[static_cast<size_t>(j)];
}

DType Fp8ScalingState::fp8_dtype(int64_t j) const { return amp::fp8_dtype(recipe_.format, pass(j)); }

void Fp8ScalingState::record_amax(int64_t j, const Tensor& t) {
  KILN_CHECK_AS(IndexError, j >= 0 && j < size(), "Fp8ScalingState::record_amax: tensor index ", j,
                " is out of range for ", size(), " tracked tensors");
  KILN_CHECK(t.defined(), "Fp8ScalingState::record_amax: tensor ", j, " is undefined");
  KILN_CHECK(t.is_floating_point() && !is_float8(t.dtype()), "Fp8ScalingState::record_amax: tensor ", j, " is ",
             t.dtype(), "; record the amax of the float32, float16 or bfloat16 tensor before quantising it");
  KILN_CHECK(t.device() == device_, "Fp8ScalingState::record_amax: tensor ", j, " is on ", t.device(),
             " but the scaling state is on ", device_, "; move the state (or the tensor) to one device");
  if (t.numel() == 0) return;  // nothing seen: the amax of no values is 0, which leaves the maximum as it is
  NoGradGuard no_grad;
  // (1,) view of h[0, j]; amax of |t| is exact in t's dtype and its cast to float32 is exact too.
  Tensor cell = amax_history_.select(0, 0).narrow(0, j, 1);
  Tensor amax = internal::amax(internal::abs(t)).to(DType::Float32).reshape({1});
  cell.copy_(internal::maximum(cell, amax));  // maximum propagates NaN: a NaN tensor records NaN
}

void Fp8ScalingState::update(const Tensor& scale_copy, const Tensor& scale_inv_copy) {
  // One backend call (one kernel on CUDA) does the whole update; fp8_ops.h states its rules: the window's amax,
  // the roll of the columns that saw data, scale = scaled_max / amax where usable (inf -> FLT_MAX), scale_inv.
  NoGradGuard no_grad;
  if (recipe_.amax_reduction) recipe_.amax_reduction(amax_history_.select(0, 0));  // (N,) view of row 0, in place
  internal::fp8_update_scales(amax_history_, scale_, scale_inv_, scaled_max_,
                              recipe_.amax_compute_algo == AmaxComputeAlgo::MostRecent, scale_copy, scale_inv_copy);
}

// ---------------------------------------------------------------- checkpoints

Fp8StateDict Fp8ScalingState::state_dict() const {
  Fp8StateDict out;
  out.tensors["amax_history"] = amax_history_.clone();
  out.tensors["scale"] = scale_.clone();
  out.tensors["scale_inv"] = scale_inv_.clone();
  out.values["format"] = recipe_.format == Fp8Format::Hybrid ? 0.0 : 1.0;
  out.values["amax_history_len"] = static_cast<double>(recipe_.amax_history_len);
  out.values["margin"] = static_cast<double>(recipe_.margin);
  out.values["amax_compute_algo"] = recipe_.amax_compute_algo == AmaxComputeAlgo::Max ? 0.0 : 1.0;
  out.values["num_tensors"] = static_cast<double>(size());
  for (int64_t j = 0; j < size(); ++j) out.values["pass." + std::to_string(j)] = pass_code(passes_[j]);
  return out;
}

namespace {

double value_of(const Fp8StateDict& state, const std::string& key) {
  auto it = state.values.find(key);
  KILN_CHECK(it != state.values.end(), "Fp8ScalingState::load_state_dict: the value \"", key,
             "\" is missing; was the state saved by Fp8ScalingState::state_dict()?");
  return it->second;
}

// A saved number that must be a whole number in [lo, hi].
int64_t integer_of(const Fp8StateDict& state, const std::string& key, int64_t lo, int64_t hi) {
  const double v = value_of(state, key);
  KILN_CHECK(std::isfinite(v) && v == std::floor(v) && v >= static_cast<double>(lo) && v <= static_cast<double>(hi),
             "Fp8ScalingState::load_state_dict: \"", key, "\" is ", v, "; expected a whole number in [", lo, ", ", hi,
             "]");
  return static_cast<int64_t>(v);
}

const Tensor& tensor_of(const Fp8StateDict& state, const std::string& key, const Shape& shape) {
  auto it = state.tensors.find(key);
  KILN_CHECK(it != state.tensors.end() && it->second.defined(), "Fp8ScalingState::load_state_dict: the tensor \"", key,
             "\" is missing; was the state saved by Fp8ScalingState::state_dict()?");
  const Tensor& t = it->second;
  KILN_CHECK(t.dtype() == DType::Float32 && t.shape() == shape, "Fp8ScalingState::load_state_dict: \"", key, "\" is ",
             t.dtype(), " of shape ", t.shape(), "; expected float32 of shape ", shape,
             " (amax_history_len and num_tensors of the saved state)");
  return t;
}

}  // namespace

void Fp8ScalingState::load_state_dict(const Fp8StateDict& state) {
  // Everything is checked before anything changes.
  const int64_t n = integer_of(state, "num_tensors", 1, std::numeric_limits<int32_t>::max());
  KILN_CHECK(n == size(), "Fp8ScalingState::load_state_dict: the saved state tracks ", n,
             " tensors but this one tracks ", size(), "; load it into a state of the same layer");
  for (int64_t j = 0; j < n; ++j) {
    const int64_t code = integer_of(state, "pass." + std::to_string(j), 0, 1);
    KILN_CHECK(static_cast<double>(code) == pass_code(passes_[j]), "Fp8ScalingState::load_state_dict: tensor ", j,
               " was saved as a ", code == 0 ? "forward" : "backward", " tensor but is a ",
               passes_[j] == Fp8Pass::Forward ? "forward" : "backward", " tensor here");
  }
  Fp8Recipe loaded = recipe_;  // the module filter stays this state's
  loaded.format = integer_of(state, "format", 0, 1) == 0 ? Fp8Format::Hybrid : Fp8Format::E4M3;
  loaded.amax_history_len = integer_of(state, "amax_history_len", 1, kMaxHistoryLen);
  loaded.margin = integer_of(state, "margin", 0, kMaxMargin);
  loaded.amax_compute_algo =
      integer_of(state, "amax_compute_algo", 0, 1) == 0 ? AmaxComputeAlgo::Max : AmaxComputeAlgo::MostRecent;
  loaded.validate();
  const Tensor& history = tensor_of(state, "amax_history", {loaded.amax_history_len, n});
  const Tensor& scale = tensor_of(state, "scale", {n});
  const Tensor& scale_inv = tensor_of(state, "scale_inv", {n});

  NoGradGuard no_grad;
  // Contiguous copies: the state never aliases the dict's tensors, and update() works on them in place.
  Tensor new_history = history.to(device_).clone(MemoryFormat::Contiguous);
  Tensor new_scale = scale.to(device_).clone(MemoryFormat::Contiguous);
  Tensor new_scale_inv = scale_inv.to(device_).clone(MemoryFormat::Contiguous);
  recipe_ = std::move(loaded);
  amax_history_ = std::move(new_history);
  scale_ = std::move(new_scale);
  scale_inv_ = std::move(new_scale_inv);
  reset_fp8_limits();
}

}  // namespace kiln::amp
