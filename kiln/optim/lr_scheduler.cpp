// kiln/optim/lr_scheduler.cpp — the schedulers' closed forms (PyTorch's formulas), state_dict, composition.
#include "kiln/optim/lr_scheduler.h"

#include <algorithm>  // std::upper_bound, std::is_sorted, std::min
#include <atomic>     // construction order
#include <cmath>      // std::pow, std::cos, std::floor
#include <numbers>    // std::numbers::pi

#include "kiln/tensor/error.h"

namespace kiln::optim {

namespace {

std::atomic<uint64_t> next_ordinal{0};

// A state entry that must hold a whole number (a step count).
int64_t as_int(const std::string& scheduler, const std::string& key, double v) {
  KILN_CHECK(std::isfinite(v) && std::floor(v) == v, scheduler, "::load_state_dict: '", key,
             "' must be a whole number, got ", v);
  return static_cast<int64_t>(v);
}

// The entries of `state` under `prefix`, with the prefix removed.
SchedulerState sub_state(const SchedulerState& state, const std::string& prefix) {
  SchedulerState out;
  for (auto it = state.lower_bound(prefix); it != state.end() && it->first.rfind(prefix, 0) == 0; ++it)
    out[it->first.substr(prefix.size())] = it->second;
  return out;
}

std::vector<double> optimizer_lrs(const Optimizer& optimizer) {
  std::vector<double> lrs(optimizer.num_param_groups());
  for (size_t g = 0; g < lrs.size(); ++g) lrs[g] = optimizer.lr(g);
  return lrs;
}

}  // namespace

// ---- LRScheduler ----

LRScheduler::LRScheduler(Optimizer& optimizer) : LRScheduler(optimizer, optimizer_lrs(optimizer)) {}

LRScheduler::LRScheduler(Optimizer& optimizer, std::vector<double> base_lrs)
    : optimizer_(&optimizer), base_lrs_(std::move(base_lrs)), ordinal_(next_ordinal++) {
  KILN_CHECK(!base_lrs_.empty(), "LRScheduler: the optimizer (", optimizer.name(),
             ") has no parameter group; add its groups before making the scheduler");
}

void LRScheduler::start() {
  last_epoch_ = 0;
  apply();
}

void LRScheduler::apply() {
  KILN_CHECK(optimizer_->num_param_groups() == base_lrs_.size(), name(), ": the optimizer (", optimizer_->name(),
             ") has ", optimizer_->num_param_groups(), " parameter groups but the scheduler was made for ",
             base_lrs_.size(), "; make the scheduler after adding every group");
  std::vector<double> lrs(base_lrs_.size());
  for (size_t g = 0; g < lrs.size(); ++g) {
    lrs[g] = lr_at(g, last_epoch_);  // may throw: nothing set yet
    KILN_CHECK(std::isfinite(lrs[g]), name(), ": the learning rate of parameter group ", g, " at step ", last_epoch_,
               " would be ", lrs[g], " (base lr ", base_lrs_[g],
               "); check the scheduler's options: a learning rate must be finite");
  }
  // The optimizer validates each lr (a negative one is refused): all groups change, or none.
  std::vector<double> old(lrs.size());
  for (size_t g = 0; g < lrs.size(); ++g) old[g] = optimizer_->lr(g);
  try {
    for (size_t g = 0; g < lrs.size(); ++g) optimizer_->set_lr(g, lrs[g]);
  } catch (...) {
    for (size_t g = 0; g < lrs.size(); ++g) optimizer_->set_lr(g, old[g]);
    throw;
  }
  last_lr_ = std::move(lrs);
}

void LRScheduler::step() {
  check_step(last_epoch_ + 1);
  ++last_epoch_;
  try {
    apply();
  } catch (...) {
    --last_epoch_;
    throw;
  }
}

double LRScheduler::get(const SchedulerState& state, const std::string& key) const {
  auto it = state.find(key);
  KILN_CHECK(it != state.end(), name(), "::load_state_dict: the state has no entry '", key, "'; was it saved by a ",
             name(), " on an optimizer with the same number of groups?");
  return it->second;
}

int64_t LRScheduler::get_int(const SchedulerState& state, const std::string& key, int64_t at_least) const {
  const int64_t v = as_int(name(), key, get(state, key));
  KILN_CHECK(v >= at_least, name(), "::load_state_dict: ", key, " must be >= ", at_least, ", got ", v);
  return v;
}

SchedulerState LRScheduler::state_dict() const {
  SchedulerState state;
  state["last_epoch"] = static_cast<double>(last_epoch_);
  for (size_t g = 0; g < base_lrs_.size(); ++g) state["base_lrs." + std::to_string(g)] = base_lrs_[g];
  save_own(state);
  return state;
}

void LRScheduler::load_state_dict(const SchedulerState& state) {
  const int64_t epoch = get_int(state, "last_epoch", 0);
  KILN_CHECK(!state.count("base_lrs." + std::to_string(base_lrs_.size())), name(),
             "::load_state_dict: the state has more base_lrs than the ", base_lrs_.size(),
             " parameter groups of this scheduler's optimizer");
  std::vector<double> base(base_lrs_.size());
  for (size_t g = 0; g < base.size(); ++g) base[g] = get(state, "base_lrs." + std::to_string(g));

  // Load, then check the result by computing the loaded step's lrs; on any error restore the old state.
  const SchedulerState old = state_dict();
  const int64_t old_epoch = last_epoch_;
  const std::vector<double> old_base = base_lrs_;
  const std::vector<double> old_lrs = optimizer_lrs(*optimizer_);  // a SequentialLR's children set them
  try {
    load_own(state);
    base_lrs_ = base;
    last_epoch_ = epoch;
    if (epoch > 0) check_step(epoch);
    apply();
  } catch (...) {
    load_own(old);
    base_lrs_ = old_base;
    last_epoch_ = old_epoch;
    for (size_t g = 0; g < old_lrs.size(); ++g) optimizer_->set_lr(g, old_lrs[g]);
    throw;
  }
}

// ---- StepLR ----

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  KILN_CHECK(step_size > 0, "StepLR: step_size must be >= 1, got ", step_size);
  start();
}

double StepLR::lr_at(size_t group, int64_t step) const {
  return base_lrs().at(group) * std::pow(gamma_, static_cast<double>(step / step_size_));
}

void StepLR::save_own(SchedulerState& state) const {
  state["step_size"] = static_cast<double>(step_size_);
  state["gamma"] = gamma_;
}

void StepLR::load_own(const SchedulerState& state) {
  step_size_ = get_int(state, "step_size", 1);
  gamma_ = get(state, "gamma");
}

// ---- MultiStepLR ----

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());  // PyTorch counts them (a Counter): order does not matter
  start();
}

double MultiStepLR::lr_at(size_t group, int64_t step) const {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), step) - milestones_.begin();
  return base_lrs().at(group) * std::pow(gamma_, static_cast<double>(passed));
}

void MultiStepLR::save_own(SchedulerState& state) const {
  state["gamma"] = gamma_;
  state["milestones.size"] = static_cast<double>(milestones_.size());
  for (size_t i = 0; i < milestones_.size(); ++i)
    state["milestones." + std::to_string(i)] = static_cast<double>(milestones_[i]);
}

void MultiStepLR::load_own(const SchedulerState& state) {
  const int64_t n = get_int(state, "milestones.size", 0);
  std::vector<int64_t> milestones(static_cast<size_t>(n));
  for (size_t i = 0; i < milestones.size(); ++i) {
    const std::string key = "milestones." + std::to_string(i);
    milestones[i] = as_int(name(), key, get(state, key));
  }
  std::sort(milestones.begin(), milestones.end());
  gamma_ = get(state, "gamma");
  milestones_ = std::move(milestones);
}

// ---- ExponentialLR ----

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma) : LRScheduler(optimizer), gamma_(gamma) { start(); }

double ExponentialLR::lr_at(size_t group, int64_t step) const {
  return base_lrs().at(group) * std::pow(gamma_, static_cast<double>(step));
}

void ExponentialLR::save_own(SchedulerState& state) const { state["gamma"] = gamma_; }
void ExponentialLR::load_own(const SchedulerState& state) { gamma_ = get(state, "gamma"); }

// ---- CosineAnnealingLR ----

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  KILN_CHECK(t_max > 0, "CosineAnnealingLR: t_max (the steps of half a cosine period) must be >= 1, got ", t_max);
  start();
}

double CosineAnnealingLR::lr_at(size_t group, int64_t step) const {
  const double base = base_lrs().at(group);
  const double phase = std::numbers::pi * static_cast<double>(step) / static_cast<double>(t_max_);
  return eta_min_ + (base - eta_min_) * (1.0 + std::cos(phase)) / 2.0;
}

void CosineAnnealingLR::save_own(SchedulerState& state) const {
  state["T_max"] = static_cast<double>(t_max_);
  state["eta_min"] = eta_min_;
}

void CosineAnnealingLR::load_own(const SchedulerState& state) {
  const int64_t t_max = get_int(state, "T_max", 1);
  eta_min_ = get(state, "eta_min");
  t_max_ = t_max;
}

// ---- LinearLR ----

namespace {

void check_linear(const char* where, double start_factor, double end_factor, int64_t total_iters) {
  KILN_CHECK(start_factor > 0.0 && start_factor <= 1.0, where, ": start_factor must be in (0, 1] (as PyTorch), got ",
             start_factor);
  KILN_CHECK(end_factor >= 0.0 && end_factor <= 1.0, where, ": end_factor must be in [0, 1] (as PyTorch), got ",
             end_factor);
  KILN_CHECK(total_iters >= 1, where, ": total_iters must be >= 1, got ", total_iters);
}

}  // namespace

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(optimizer), start_factor_(start_factor), end_factor_(end_factor), total_iters_(total_iters) {
  check_linear("LinearLR", start_factor, end_factor, total_iters);
  start();
}

double LinearLR::lr_at(size_t group, int64_t step) const {
  const double done = static_cast<double>(std::min(step, total_iters_)) / static_cast<double>(total_iters_);
  return base_lrs().at(group) * (start_factor_ + (end_factor_ - start_factor_) * done);
}

void LinearLR::save_own(SchedulerState& state) const {
  state["start_factor"] = start_factor_;
  state["end_factor"] = end_factor_;
  state["total_iters"] = static_cast<double>(total_iters_);
}

void LinearLR::load_own(const SchedulerState& state) {
  const double start_factor = get(state, "start_factor"), end_factor = get(state, "end_factor");
  const int64_t total_iters = as_int(name(), "total_iters", get(state, "total_iters"));
  check_linear("LinearLR::load_state_dict", start_factor, end_factor, total_iters);
  start_factor_ = start_factor;
  end_factor_ = end_factor;
  total_iters_ = total_iters;
}

// ---- LambdaLR ----

LambdaLR::LambdaLR(Optimizer& optimizer, Lambda lambda)
    : LambdaLR(optimizer, std::vector<Lambda>(optimizer.num_param_groups(), lambda)) {}

LambdaLR::LambdaLR(Optimizer& optimizer, std::vector<Lambda> lambdas)
    : LRScheduler(optimizer), lambdas_(std::move(lambdas)) {
  KILN_CHECK(lambdas_.size() == num_groups(), "LambdaLR: got ", lambdas_.size(), " lambdas for the ", num_groups(),
             " parameter groups of the optimizer; give one, or one per group");
  for (const auto& f : lambdas_) KILN_CHECK(static_cast<bool>(f), "LambdaLR: a lambda is empty");
  start();
}

double LambdaLR::lr_at(size_t group, int64_t step) const { return base_lrs().at(group) * lambdas_.at(group)(step); }

// ---- OneCycleLR ----

namespace {

std::vector<double> one_cycle_max_lrs(const Optimizer& optimizer, const std::vector<double>& max_lr) {
  const size_t groups = optimizer.num_param_groups();
  KILN_CHECK(max_lr.size() == 1 || max_lr.size() == groups, "OneCycleLR: got ", max_lr.size(), " values of max_lr for ",
             groups, " parameter groups; give one, or one per group");
  return max_lr.size() == 1 ? std::vector<double>(groups, max_lr[0]) : max_lr;
}

OneCycleOptions one_cycle_options(const Optimizer& optimizer, OneCycleOptions options) {
  options.max_lr = one_cycle_max_lrs(optimizer, options.max_lr);
  KILN_CHECK(options.div_factor > 0.0, "OneCycleLR: div_factor must be > 0, got ", options.div_factor);
  return options;
}

std::vector<double> one_cycle_initial_lrs(const OneCycleOptions& options) {
  std::vector<double> lrs(options.max_lr.size());
  for (size_t g = 0; g < lrs.size(); ++g) lrs[g] = options.max_lr[g] / options.div_factor;
  return lrs;
}

}  // namespace

OneCycleLR::OneCycleLR(Optimizer& optimizer, OneCycleOptions options)
    : LRScheduler(optimizer, one_cycle_initial_lrs(one_cycle_options(optimizer, options))),
      options_(one_cycle_options(optimizer, std::move(options))) {
  check_options();
  start();
}

void OneCycleLR::check_options() const {
  const auto& o = options_;
  KILN_CHECK(o.total_steps >= 1, "OneCycleLR: total_steps must be >= 1, got ", o.total_steps);
  KILN_CHECK(o.pct_start >= 0.0 && o.pct_start <= 1.0, "OneCycleLR: pct_start must be in [0, 1], got ", o.pct_start);
  KILN_CHECK(o.div_factor > 0.0, "OneCycleLR: div_factor must be > 0, got ", o.div_factor);
  KILN_CHECK(o.final_div_factor > 0.0, "OneCycleLR: final_div_factor must be > 0, got ", o.final_div_factor);
  KILN_CHECK(o.max_lr.size() == num_groups(), "OneCycleLR: ", o.max_lr.size(), " values of max_lr for ", num_groups(),
             " parameter groups");
}

// PyTorch's phases; end_step is a float there too (pct_start * total_steps - 1).
std::vector<OneCycleLR::Phase> OneCycleLR::phases() const {
  const double total = static_cast<double>(options_.total_steps);
  const double up = options_.pct_start * total;
  if (options_.three_phase) return {{up - 1.0, 0, 1}, {2.0 * up - 2.0, 1, 0}, {total - 1.0, 0, 2}};
  return {{up - 1.0, 0, 1}, {total - 1.0, 1, 2}};
}

double OneCycleLR::lr_at(size_t group, int64_t step) const {
  const double initial = base_lrs().at(group);
  const double lrs[3] = {initial, options_.max_lr.at(group), initial / options_.final_div_factor};
  const auto ph = phases();
  const double s = static_cast<double>(step);
  double start_step = 0.0;
  for (size_t i = 0; i < ph.size(); ++i) {
    if (s <= ph[i].end_step || i + 1 == ph.size()) {
      // PyTorch divides by zero here (ZeroDivisionError); say why instead.
      KILN_CHECK(ph[i].end_step != start_step, "OneCycleLR: phase ", i + 1, " of ", ph.size(),
                 " has no length at step ", step, " (total_steps ", options_.total_steps, ", pct_start ",
                 options_.pct_start, "); choose pct_start so that every phase spans at least one step");
      // Step total_steps (reached by the scheduler step after the last training step) holds the schedule's
      // last lr: PyTorch extrapolates the last phase there, and a linear anneal would then go below zero, which
      // no optimizer accepts as a learning rate.
      const double pct = std::min(1.0, (s - start_step) / (ph[i].end_step - start_step));
      const double a = lrs[ph[i].start], b = lrs[ph[i].end];
      if (options_.anneal_strategy == AnnealStrategy::Cos)
        return b + (a - b) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
      return (b - a) * pct + a;
    }
    start_step = ph[i].end_step;
  }
  return lrs[0];  // not reached: the last phase always matches
}

void OneCycleLR::check_step(int64_t next_step) const {
  KILN_CHECK(next_step <= options_.total_steps, "OneCycleLR: cannot step to step ", next_step,
             ": the schedule has total_steps = ", options_.total_steps,
             " (PyTorch allows stepping up to total_steps); make it with more total_steps");
}

void OneCycleLR::save_own(SchedulerState& state) const {
  const auto& o = options_;
  state["total_steps"] = static_cast<double>(o.total_steps);
  state["pct_start"] = o.pct_start;
  state["div_factor"] = o.div_factor;
  state["final_div_factor"] = o.final_div_factor;
  state["three_phase"] = o.three_phase ? 1.0 : 0.0;
  state["anneal_cos"] = o.anneal_strategy == AnnealStrategy::Cos ? 1.0 : 0.0;
  for (size_t g = 0; g < o.max_lr.size(); ++g) state["max_lrs." + std::to_string(g)] = o.max_lr[g];
}

void OneCycleLR::load_own(const SchedulerState& state) {
  OneCycleOptions o;
  o.total_steps = as_int(name(), "total_steps", get(state, "total_steps"));
  o.pct_start = get(state, "pct_start");
  o.div_factor = get(state, "div_factor");
  o.final_div_factor = get(state, "final_div_factor");
  o.three_phase = get(state, "three_phase") != 0.0;
  o.anneal_strategy = get(state, "anneal_cos") != 0.0 ? AnnealStrategy::Cos : AnnealStrategy::Linear;
  o.max_lr.resize(num_groups());
  for (size_t g = 0; g < o.max_lr.size(); ++g) o.max_lr[g] = get(state, "max_lrs." + std::to_string(g));
  std::swap(options_, o);
  try {
    check_options();
  } catch (...) {
    std::swap(options_, o);
    throw;
  }
}

// ---- SequentialLR ----

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::unique_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  KILN_CHECK(!schedulers_.empty(), "SequentialLR: needs at least one scheduler");
  KILN_CHECK(milestones_.size() + 1 == schedulers_.size(), "SequentialLR: got ", schedulers_.size(), " schedulers and ",
             milestones_.size(), " milestones; give one milestone fewer than schedulers");
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    KILN_CHECK(schedulers_[i] != nullptr, "SequentialLR: scheduler ", i, " is null");
    KILN_CHECK(&schedulers_[i]->optimizer() == &optimizer, "SequentialLR: scheduler ", i, " (", schedulers_[i]->name(),
               ") is on another optimizer; every scheduler must be on the same one");
  }
  for (size_t i = 0; i < milestones_.size(); ++i)
    KILN_CHECK(milestones_[i] >= 1 && (i == 0 || milestones_[i] > milestones_[i - 1]),
               "SequentialLR: milestones must be strictly increasing and >= 1, got ", milestones_[i], " at position ",
               i);
  // The one made first read the optimizer's lrs before any other scheduler changed them (PyTorch's initial_lr).
  const LRScheduler* first = schedulers_[0].get();
  for (const auto& s : schedulers_)
    if (s->ordinal_ < first->ordinal_) first = s.get();
  ordinal_ = first->ordinal_;  // a SequentialLR nested in another counts as made when its first child was
  rebase(std::vector<double>(first->base_lrs()));
  start();
}

void SequentialLR::rebase(const std::vector<double>& base_lrs) {
  LRScheduler::rebase(base_lrs);
  for (auto& s : schedulers_) s->rebase(base_lrs);
}

std::pair<const LRScheduler*, int64_t> SequentialLR::child_at(int64_t step) const {
  const size_t i =
      static_cast<size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), step) - milestones_.begin());
  return {schedulers_[i].get(), i == 0 ? step : step - milestones_[i - 1]};
}

double SequentialLR::lr_at(size_t group, int64_t step) const {
  const auto [child, local] = child_at(step);
  return child->lr_at(group, local);
}

void SequentialLR::check_step(int64_t next_step) const {
  const auto [child, local] = child_at(next_step);
  child->check_step(local);
}

void SequentialLR::save_own(SchedulerState& state) const {
  for (size_t i = 0; i < milestones_.size(); ++i)
    state["milestones." + std::to_string(i)] = static_cast<double>(milestones_[i]);
  for (size_t i = 0; i < schedulers_.size(); ++i)
    for (const auto& [k, v] : schedulers_[i]->state_dict()) state["schedulers." + std::to_string(i) + "." + k] = v;
}

void SequentialLR::load_own(const SchedulerState& state) {
  KILN_CHECK(sub_state(state, "milestones.").size() == milestones_.size() &&
                 !state.count("schedulers." + std::to_string(schedulers_.size()) + ".last_epoch"),
             "SequentialLR::load_state_dict: the state is of a SequentialLR with another number of schedulers (this "
             "one has ",
             schedulers_.size(), ")");
  std::vector<int64_t> milestones(milestones_.size());
  for (size_t i = 0; i < milestones.size(); ++i) {
    const std::string key = "milestones." + std::to_string(i);
    milestones[i] = as_int(name(), key, get(state, key));
    KILN_CHECK(milestones[i] >= 1 && (i == 0 || milestones[i] > milestones[i - 1]),
               "SequentialLR::load_state_dict: milestones must be strictly increasing and >= 1");
  }
  // Children load one by one (each sets the optimizer's lrs; the caller's apply() sets the right ones after);
  // on an error the ones already loaded go back.
  std::vector<SchedulerState> old;
  for (const auto& s : schedulers_) old.push_back(s->state_dict());
  size_t i = 0;
  try {
    for (; i < schedulers_.size(); ++i)
      schedulers_[i]->load_state_dict(sub_state(state, "schedulers." + std::to_string(i) + "."));
  } catch (...) {
    for (size_t j = 0; j < i; ++j) schedulers_[j]->load_state_dict(old[j]);
    throw;
  }
  milestones_ = std::move(milestones);
}

// ---- Conveniences ----

std::unique_ptr<SequentialLR> warmup_then(Optimizer& optimizer, int64_t warmup_steps,
                                          std::unique_ptr<LRScheduler> after, double start_factor) {
  KILN_CHECK(warmup_steps >= 1, "warmup_then: warmup_steps must be >= 1, got ", warmup_steps);
  KILN_CHECK(after != nullptr, "warmup_then: the scheduler to run after the warmup is null");
  std::vector<std::unique_ptr<LRScheduler>> schedulers;
  schedulers.push_back(std::make_unique<LinearLR>(optimizer, start_factor, 1.0, warmup_steps));
  schedulers.push_back(std::move(after));
  return std::make_unique<SequentialLR>(optimizer, std::move(schedulers), std::vector<int64_t>{warmup_steps});
}

namespace {

void check_warmup(const char* where, int64_t warmup_steps, int64_t total_steps) {
  KILN_CHECK(total_steps >= 1, where, ": total_steps must be >= 1, got ", total_steps);
  KILN_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps, where,
             ": warmup_steps must be in [0, total_steps = ", total_steps, "], got ", warmup_steps);
}

// Hugging Face's warmup factor (transformers.optimization): step / max(1, warmup_steps).
double warmup_factor(int64_t step, int64_t warmup_steps) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
}

}  // namespace

std::unique_ptr<LambdaLR> linear_warmup_linear_decay(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps) {
  check_warmup("linear_warmup_linear_decay", warmup_steps, total_steps);
  return std::make_unique<LambdaLR>(optimizer, [warmup_steps, total_steps](int64_t step) {
    if (step < warmup_steps) return warmup_factor(step, warmup_steps);
    return std::max(0.0, static_cast<double>(total_steps - step) /
                             static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps)));
  });
}

std::unique_ptr<LambdaLR> linear_warmup_cosine_decay(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps,
                                                     double min_lr) {
  check_warmup("linear_warmup_cosine_decay", warmup_steps, total_steps);
  std::vector<LambdaLR::Lambda> lambdas;
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    const double base = optimizer.lr(g);
    KILN_CHECK(min_lr >= 0.0 && min_lr <= base,
               "linear_warmup_cosine_decay: min_lr must be in [0, lr] for every "
               "group, got min_lr ",
               min_lr, " and lr ", base, " in group ", g);
    // As Hugging Face's min_lr_rate; a group with lr 0 stays at 0.
    const double rate = base > 0.0 ? min_lr / base : 0.0;
    lambdas.push_back([warmup_steps, total_steps, rate](int64_t step) {
      if (step < warmup_steps) return warmup_factor(step, warmup_steps);
      if (step >= total_steps) return rate;  // held (Hugging Face's cosine would rise again)
      const double progress = static_cast<double>(step - warmup_steps) /
                              static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
      const double factor = 0.5 * (1.0 + std::cos(std::numbers::pi * 0.5 * 2.0 * progress));
      return std::max(0.0, factor * (1.0 - rate) + rate);
    });
  }
  return std::make_unique<LambdaLR>(optimizer, std::move(lambdas));
}

}  // namespace kiln::optim
