// kiln/optim/lr_scheduler.h — learning-rate schedulers with PyTorch's semantics (torch.optim.lr_scheduler),
// per parameter group.
//
//   optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
//   optim::CosineAnnealingLR sched(opt, /*t_max=*/90, /*eta_min=*/1e-4);  // sets the lr of step 0 now
//   for (int epoch = 0; epoch < 90; ++epoch) {
//     for (...) { opt.zero_grad(); loss.backward(); opt.step(); }
//     sched.step();                                                       // the lr of epoch + 1
//   }
//   auto warm = optim::linear_warmup_linear_decay(opt, 10000, 1000000);  // BERT (Hugging Face's schedule)
//   auto sd = sched.state_dict();  sched2.load_state_dict(sd);            // exact resume
//
// As in PyTorch, a scheduler reads each group's lr when constructed (its base lr, PyTorch's initial_lr),
// sets each group's lr for step 0 right away, and sets it again on every step(). Unlike PyTorch's chainable
// (recursive) forms, every lr is computed from the step count by a closed form, so a resumed run (and
// lr_at) gives the same numbers as an uninterrupted one, and an lr set by hand is overwritten by the next step.
// PyTorch's recursive and closed forms agree mathematically; the values differ from torch's by rounding only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

// A scheduler's state: flat name -> value ("last_epoch", "base_lrs.<g>", then each scheduler's own, e.g.
// "gamma"; SequentialLR nests its children under "schedulers.<i>.").
using SchedulerState = std::map<std::string, double>;

// The base of the schedulers: sets each parameter group's lr of an optimizer from a step count, as
// torch.optim.lr_scheduler.LRScheduler.
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances the step (epoch) counter and sets each group's lr to lr_at(group, last_epoch()).
  void step();
  // The lr this scheduler set last, per group (PyTorch's get_last_lr()).
  const std::vector<double>& last_lr() const { return last_lr_; }
  // How many times step() ran since construction (0 after construction, as PyTorch).
  int64_t last_epoch() const { return last_epoch_; }
  // The lr of each group when the scheduler was made (PyTorch's initial_lr / base_lrs).
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The lr of `group` at step `step` (>= 0), from the closed form; changes nothing.
  virtual double lr_at(size_t group, int64_t step) const = 0;

  // "last_epoch", "base_lrs.<g>" and the scheduler's own hyperparameters. Loading replaces all of them
  // (as PyTorch: the checkpoint wins over the constructor's arguments) and sets the optimizer's lrs to those of
  // the loaded step. Throws kiln::Error naming a missing or invalid entry, and changes nothing then.
  SchedulerState state_dict() const;
  void load_state_dict(const SchedulerState& state);  // the inverse of state_dict()

  virtual std::string name() const = 0;  // "StepLR", ... (error messages)
  // The optimizer whose lrs this scheduler sets.
  Optimizer& optimizer() const { return *optimizer_; }

 protected:
  // Base lrs: the optimizer's current lr of each group.
  explicit LRScheduler(Optimizer& optimizer);
  // Base lrs given (OneCycleLR: max_lr / div_factor).
  LRScheduler(Optimizer& optimizer, std::vector<double> base_lrs);

  // Every derived constructor ends with start(): PyTorch's initial step (last_epoch 0, lrs of step 0 set).
  // (Not in the base constructor: lr_at is virtual.)
  void start();

  // Throws if stepping to `next_step` is not allowed (OneCycleLR past total_steps).
  virtual void check_step(int64_t next_step) const { (void)next_step; }
  // Own entries of state_dict; load_own validates everything before it changes anything.
  virtual void save_own(SchedulerState& state) const { (void)state; }
  // Reads back what save_own wrote; the base has nothing to read.
  virtual void load_own(const SchedulerState& state) { (void)state; }
  // SequentialLR gives its children the base lrs of the first one made (PyTorch's shared initial_lr).
  virtual void rebase(const std::vector<double>& base_lrs) { base_lrs_ = base_lrs; }

  // The entry `key` of `state` (error naming the scheduler and the key when absent).
  double get(const SchedulerState& state, const std::string& key) const;
  // The entry `key` as a whole number >= at_least (error naming the scheduler, the key and the value otherwise).
  int64_t get_int(const SchedulerState& state, const std::string& key, int64_t at_least) const;
  // The number of parameter groups scheduled.
  size_t num_groups() const { return base_lrs_.size(); }

 private:
  friend class SequentialLR;
  void apply();  // sets the optimizer's lrs for last_epoch_

  Optimizer* optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = 0;
  uint64_t ordinal_;  // order of construction (SequentialLR rebases on the first one made)
};

// lr = base_lr * gamma^floor(step / step_size).
class StepLR final : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);  // step_size >= 1
  double lr_at(size_t group, int64_t step) const override;
  std::string name() const override { return "StepLR"; }

 private:
  void save_own(SchedulerState& state) const override;
  void load_own(const SchedulerState& state) override;
  int64_t step_size_;
  double gamma_;
};

// lr = base_lr * gamma^(number of milestones <= step); a milestone listed twice counts twice (as PyTorch).
class MultiStepLR final : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);  // milestones in any order
  double lr_at(size_t group, int64_t step) const override;
  std::string name() const override { return "MultiStepLR"; }

 private:
  void save_own(SchedulerState& state) const override;
  void load_own(const SchedulerState& state) override;
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

// lr = base_lr * gamma^step.
class ExponentialLR final : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);  // gamma: the factor applied per step
  double lr_at(size_t group, int64_t step) const override;
  std::string name() const override { return "ExponentialLR"; }

 private:
  void save_own(SchedulerState& state) const override;
  void load_own(const SchedulerState& state) override;
  double gamma_;
};

// lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * step / t_max)) / 2, for every step: past t_max the lr
// rises again towards base_lr (period 2 * t_max), which is what PyTorch's recursive form gives too (its
// special case at t_max + 1 continues the same cosine). Use linear_warmup_cosine_decay to hold the minimum.
class CosineAnnealingLR final : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);  // t_max >= 1
  double lr_at(size_t group, int64_t step) const override;
  std::string name() const override { return "CosineAnnealingLR"; }

 private:
  void save_own(SchedulerState& state) const override;
  void load_own(const SchedulerState& state) override;
  int64_t t_max_;
  double eta_min_;
};

// lr = base_lr * (start_factor + (end_factor - start_factor) * min(step, total_iters) / total_iters): a linear
// warmup (or decay). As PyTorch: 0 < start_factor <= 1, 0 <= end_factor <= 1.
class LinearLR final : public LRScheduler {
 public:
  // Throws unless 0 < start_factor <= 1, 0 <= end_factor <= 1 and total_iters >= 1.
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3.0, double end_factor = 1.0, int64_t total_iters = 5);
  double lr_at(size_t group, int64_t step) const override;
  std::string name() const override { return "LinearLR"; }

 private:
  void save_own(SchedulerState& state) const override;
  void load_own(const SchedulerState& state) override;
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

// lr = base_lr * lambda(step), one lambda for every group or one per group. The lambdas are not part of
// state_dict (as PyTorch's functions): construct the scheduler with the same ones before loading.
class LambdaLR final : public LRScheduler {
 public:
  using Lambda = std::function<double(int64_t step)>;           // the factor for a step
  LambdaLR(Optimizer& optimizer, Lambda lambda);                // the same lambda for every group
  LambdaLR(Optimizer& optimizer, std::vector<Lambda> lambdas);  // one per group
  double lr_at(size_t group, int64_t step) const override;
  std::string name() const override { return "LambdaLR"; }

 private:
  std::vector<Lambda> lambdas_;  // one per group
};

// How OneCycleLR moves between lrs: cosine or linear.
enum class AnnealStrategy { Cos, Linear };

// OneCycleLR's settings, with PyTorch's names and defaults.
struct OneCycleOptions {
  std::vector<double> max_lr{};  // one value (every group) or one per group
  int64_t total_steps = 0;       // >= 1; step() may reach total_steps (as PyTorch), not beyond
  double pct_start = 0.3;        // in [0, 1]: the fraction of steps spent increasing the lr
  // The shape of each phase.
  AnnealStrategy anneal_strategy = AnnealStrategy::Cos;
  double div_factor = 25.0;       // initial lr = max_lr / div_factor
  double final_div_factor = 1e4;  // min lr = initial lr / final_div_factor
  bool three_phase = false;       // up, back down to the initial lr (symmetric), then down to min lr
};

// The 1cycle policy (Smith & Topin), as PyTorch's OneCycleLR. Sets the lr only: the Optimizer interface has no
// momentum, so PyTorch's cycle_momentum (on by default there) is not done; use momentum constant. The base lrs
// are max_lr / div_factor (the optimizer's own lrs are ignored, as PyTorch).
class OneCycleLR final : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, OneCycleOptions options);  // throws on invalid options
  double lr_at(size_t group, int64_t step) const override;
  std::string name() const override { return "OneCycleLR"; }

 private:
  struct Phase {
    double end_step;
    int start, end;  // 0: initial lr, 1: max lr, 2: min lr
  };
  void check_step(int64_t next_step) const override;
  void save_own(SchedulerState& state) const override;
  void load_own(const SchedulerState& state) override;
  void rebase(const std::vector<double>& base_lrs) override { (void)base_lrs; }  // keeps max_lr / div_factor
  void check_options() const;
  std::vector<Phase> phases() const;
  OneCycleOptions options_;  // max_lr: one per group
};

// Runs schedulers one after another: schedulers[i] from step milestones[i-1] on, counting its own steps from 0
// there (as PyTorch, which restarts it with step(0)). milestones: strictly increasing, one fewer than schedulers.
// Every scheduler must be on `optimizer`; all get the base lrs of the one constructed first (PyTorch's shared
// initial_lr: a LinearLR warmup made first does not lower the base lr of the cosine made after it).
// The children's own last_epoch is not advanced: the SequentialLR's is the one that counts.
class SequentialLR final : public LRScheduler {
 public:
  // Takes ownership of the schedulers; throws kiln::Error when the rules above are broken.
  SequentialLR(Optimizer& optimizer, std::vector<std::unique_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  double lr_at(size_t group, int64_t step) const override;
  std::string name() const override { return "SequentialLR"; }
  // Child i, in the order given; throws std::out_of_range past the last.
  const LRScheduler& scheduler(size_t i) const { return *schedulers_.at(i); }

 private:
  // The child that runs at `step`, and its own step count there.
  std::pair<const LRScheduler*, int64_t> child_at(int64_t step) const;
  void check_step(int64_t next_step) const override;
  void save_own(SchedulerState& state) const override;
  void load_own(const SchedulerState& state) override;
  void rebase(const std::vector<double>& base_lrs) override;
  std::vector<std::unique_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

// A LinearLR warmup over `warmup_steps` steps (from start_factor * base lr to the base lr), then `after`, which
// starts counting its steps at warmup_steps: SequentialLR({LinearLR, after}, {warmup_steps}).
std::unique_ptr<SequentialLR> warmup_then(Optimizer& optimizer, int64_t warmup_steps,
                                          std::unique_ptr<LRScheduler> after, double start_factor = 1e-3);

// Hugging Face's warmup shape: lr = base_lr * step / warmup_steps while step < warmup_steps (0 at step 0), then
// down to the end value at total_steps, held after it. LambdaLRs (their state_dict holds the step count only).
// Linear decay to 0, as transformers.get_linear_schedule_with_warmup (BERT's schedule).
std::unique_ptr<LambdaLR> linear_warmup_linear_decay(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps);
// Cosine decay to min_lr (absolute, every group): transformers.get_cosine_with_min_lr_schedule_with_warmup
// with min_lr_rate = min_lr / base_lr, except that the lr stays at min_lr after total_steps (there Hugging
// Face's cosine rises again).
std::unique_ptr<LambdaLR> linear_warmup_cosine_decay(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps,
                                                     double min_lr = 0.0);

}  // namespace kiln::optim
