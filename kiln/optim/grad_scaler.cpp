// amp::GradScaler: the scale, the growth tracker and found_inf live on the device; nothing here reads them on
// the host except get_scale(), get_growth_tracker(), state_dict() and step() for CPU-only optimizers.
#include "kiln/optim/grad_scaler.h"

#include <cmath>
#include <utility>

#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/sparse_grad.h"
#include "kiln/optim/grad_groups.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

#if KILN_WITH_CUDA
#include "kiln/optim/cuda/fused.h"
#endif

namespace kiln::amp {
namespace {

constexpr double kMaxTracker = 16777216.0;  // 2^24: the float32 growth tracker counts exactly up to here

TensorOptions f32_on(Device device) { return {.dtype = DType::Float32, .device = device}; }

// The generic unscale of one gradient: grad *= inv_scale, found_inf = max(found_inf, any(!isfinite(grad))).
// inv_scale0: 0-d float32 on the grad's device (broadcasts into any shape, 0-d included).
void unscale_with_ops(Tensor& grad, const Tensor& inv_scale0, Tensor& found_inf) {
  optim::detail::mul_in_float32_(grad, inv_scale0);
  Tensor bad = internal::any(internal::logical_not(internal::isfinite(grad))).to(DType::Float32).reshape({1});  // (1,)
  found_inf.copy_(internal::maximum(found_inf, bad));
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options), pending_scale_(options.init_scale) {
  check_options();
}

void GradScaler::check_options() const {
  KILN_CHECK(options_.growth_factor > 1.0, "GradScaler: growth_factor must be > 1, got ", options_.growth_factor);
  KILN_CHECK(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0,
             "GradScaler: backoff_factor must be in (0, 1), got ", options_.backoff_factor);
  KILN_CHECK(options_.growth_interval >= 1 && static_cast<double>(options_.growth_interval) <= kMaxTracker,
             "GradScaler: growth_interval must be in [1, 2^24], got ", options_.growth_interval);
  KILN_CHECK(options_.init_scale > 0.0 && std::isfinite(options_.init_scale),
             "GradScaler: init_scale must be positive and finite, got ", options_.init_scale);
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled) return loss;
  KILN_CHECK(loss.defined(), "GradScaler::scale: the loss is an undefined tensor");
  if (!scale_.defined()) {
    scale_ = internal::full({1}, pending_scale_, f32_on(loss.device()));
    growth_tracker_ = internal::full({1}, pending_tracker_, f32_on(loss.device()));
  }
  // A 0-d factor keeps the loss's shape (a (1,) factor would turn a 0-d loss into shape (1,)).
  return loss * scale_.to(loss.device(), /*non_blocking=*/true).reshape({});
}

void GradScaler::unscale_(optim::Optimizer& opt) {
  if (!options_.enabled) return;
  PerOptimizer& st = per_optimizer_[&opt];
  KILN_CHECK(st.stage != Stage::Unscaled, "GradScaler::unscale_: already called on this ", opt.name(),
             " optimizer since the last update(); call it at most once per optimizer per step");
  KILN_CHECK(st.stage != Stage::Stepped, "GradScaler::unscale_: called after step() on this ", opt.name(),
             " optimizer; call update() first");
  KILN_CHECK(scale_.defined(), "GradScaler::unscale_: no loss was scaled in this iteration; call ",
             "scaler.scale(loss).backward() first");
  NoGradGuard no_grad;
  // 1 / scale in float64, then float32 (as PyTorch), on the scale's device: (1,)
  const Tensor inv_scale = internal::reciprocal(scale_.to(DType::Float64)).to(DType::Float32);
  st.found_inf.clear();
  for (optim::detail::GradGroup& group : optim::detail::group_grads(optim::detail::params_of(opt))) {
    const Device device = group.device;
    const Tensor inv_d = inv_scale.to(device, /*non_blocking=*/true);  // (1,)
    Tensor found_d = internal::zeros({1}, f32_on(device));
#if KILN_WITH_CUDA
    if (device.is_cuda()) {
      // One launch per dtype over the contiguous gradients; the others (rare) through kiln ops.
      for (const auto& same_dtype : group.dense_by_dtype) {
        optim::cuda_impl::fused_unscale_and_check(same_dtype, found_d, inv_d);
      }
      const Tensor inv0 = inv_d.reshape({});
      for (Tensor& g : group.others) unscale_with_ops(g, inv0, found_d);
      st.found_inf.push_back(found_d);
      continue;
    }
#endif
    const Tensor inv0 = inv_d.reshape({});
    for (Tensor& g : group.all) unscale_with_ops(g, inv0, found_d);
    st.found_inf.push_back(found_d);
  }
  // Sparse gradients (sparse_grad.h): their values, unscaled in a copy (they may be a tensor the caller still
  // holds) that replaces them. As PyTorch, a float16 one is coalesced first: summing repeated rows of scaled
  // values can overflow, and the check must see the sums the optimizer will use. (bfloat16 likewise.)
  for (const Tensor& p : optim::detail::params_of(opt)) {
    const SparseRowGrad* sparse = autograd::sparse_grad(p);
    if (sparse == nullptr) continue;
    const DType dtype = sparse->values.dtype();
    SparseRowGrad g = dtype == DType::Float16 || dtype == DType::BFloat16 ? sparse->coalesce() : *sparse;
    const Device device = g.values.device();
    Tensor found_d = internal::zeros({1}, f32_on(device));
    g.values = internal::clone(g.values);
    unscale_with_ops(g.values, inv_scale.to(device, /*non_blocking=*/true).reshape({}), found_d);
    autograd::set_sparse_grad(p, std::move(g));
    st.found_inf.push_back(found_d);
  }
  st.stage = Stage::Unscaled;
}

Tensor GradScaler::found_inf_of(const PerOptimizer& st, Device device) const {
  Tensor total = st.found_inf.front().to(device, /*non_blocking=*/true);
  for (size_t i = 1; i < st.found_inf.size(); ++i) {
    total = internal::add(total, st.found_inf[i].to(device, /*non_blocking=*/true));
  }
  return total;  // (1,) float32: > 0 when any device saw an inf/NaN
}

void GradScaler::step(optim::Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return;
  }
  {
    const auto it = per_optimizer_.find(&opt);
    KILN_CHECK(it == per_optimizer_.end() || it->second.stage != Stage::Stepped, "GradScaler::step: already called",
               " on this ", opt.name(), " optimizer since the last update(); call update() once per iteration");
  }
  if (per_optimizer_[&opt].stage == Stage::Ready) unscale_(opt);
  PerOptimizer& st = per_optimizer_[&opt];
  KILN_CHECK(!st.found_inf.empty(), "GradScaler::step: no gradient of the ", opt.name(),
             " optimizer's parameters was found; did the scaled loss's backward() reach them?");
  const Device device = st.found_inf.front().device();
  const Tensor found_inf = found_inf_of(st, device);
  if (device.is_cpu()) {
    // A CPU tensor: reading it costs nothing, and any optimizer can be skipped this way.
    if (found_inf.item<float>() == 0.0f) opt.step();
  } else {
    // The gradients are already unscaled (undefined grad_scale); the optimizer skips on the device.
    opt.step_with(Tensor(), found_inf);
  }
  st.stage = Stage::Stepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  KILN_CHECK(scale_.defined(), "GradScaler::update: no loss was scaled in this iteration; call ",
             "scaler.scale(loss) before update()");
  const Device device = scale_.device();
  Tensor found;  // (1,) float32 on the scale's device: the sum of every optimizer's checks
  for (const auto& [opt, st] : per_optimizer_) {
    if (st.found_inf.empty()) continue;
    const Tensor f = found_inf_of(st, device);
    found = found.defined() ? internal::add(found, f) : f;
  }
  KILN_CHECK(found.defined(), "GradScaler::update: no inf/NaN check was recorded in this iteration; call ",
             "step(optimizer) (or unscale_) before update()");
  NoGradGuard no_grad;
  // As PyTorch's _amp_update_scale_: on inf/NaN the scale backs off and the tracker resets; otherwise the
  // tracker counts, and at growth_interval the scale grows (when the grown scale stays finite) and it resets.
  const Tensor is_inf = internal::gt(found, 0.0);                      // (1,) bool
  const Tensor counted = internal::add(growth_tracker_, 1.0);          // (1,)
  const Tensor grown = internal::mul(scale_, options_.growth_factor);  // (1,)
  const Tensor at_interval = internal::ge(counted, static_cast<double>(options_.growth_interval));
  const Tensor grow = internal::logical_and(internal::logical_and(internal::logical_not(is_inf), at_interval),
                                            internal::isfinite(grown));
  const Tensor new_scale =
      internal::where(is_inf, internal::mul(scale_, options_.backoff_factor), internal::where(grow, grown, scale_));
  const Tensor new_tracker = internal::where(internal::logical_or(is_inf, at_interval), 0.0, counted);
  scale_.copy_(new_scale);  // in place: the scale tensor keeps its identity (CUDA graphs, references)
  growth_tracker_.copy_(new_tracker);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? static_cast<double>(scale_.item<float>()) : pending_scale_;
}

int64_t GradScaler::get_growth_tracker() const {
  if (!options_.enabled) return 0;
  return growth_tracker_.defined() ? static_cast<int64_t>(growth_tracker_.item<float>())
                                   : static_cast<int64_t>(pending_tracker_);
}

std::map<std::string, double> GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", get_scale()},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", static_cast<double>(options_.growth_interval)},
          {"_growth_tracker", static_cast<double>(get_growth_tracker())}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  if (!options_.enabled) return;
  KILN_CHECK(!state.empty(), "GradScaler::load_state_dict: the state is empty, possibly because it was saved ",
             "from a disabled GradScaler");
  for (const char* key : {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}) {
    KILN_CHECK(state.count(key) == 1, "GradScaler::load_state_dict: the key \"", key, "\" is missing");
  }
  GradScalerOptions loaded = options_;
  loaded.init_scale = state.at("scale");
  loaded.growth_factor = state.at("growth_factor");
  loaded.backoff_factor = state.at("backoff_factor");
  loaded.growth_interval = static_cast<int64_t>(state.at("growth_interval"));
  const double tracker = state.at("_growth_tracker");
  const GradScalerOptions previous = options_;
  options_ = loaded;
  try {
    check_options();
    KILN_CHECK(tracker >= 0 && tracker <= kMaxTracker, "GradScaler::load_state_dict: _growth_tracker ", tracker,
               " is out of range");
  } catch (...) {
    options_ = previous;
    throw;
  }
  options_.init_scale = previous.init_scale;  // init_scale stays what the constructor was given
  pending_scale_ = state.at("scale");
  pending_tracker_ = tracker;
  if (scale_.defined()) {
    scale_.fill_(pending_scale_);
    growth_tracker_.fill_(pending_tracker_);
  }
}

}  // namespace kiln::amp
