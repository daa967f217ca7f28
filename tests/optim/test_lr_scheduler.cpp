// LR schedulers: each lr sequence against an independent float64 reference written in the test — PyTorch's
// recursive (chainable) update rules, which kiln's closed forms must reproduce — plus hand-derived values at
// known points, two groups with different base lrs, state_dict round trips mid-schedule, and bad arguments.
#include "kiln/optim/lr_scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numbers>

#include "kiln/kiln.h"
#include "kiln/optim/sgd.h"
#include "optim/scheduler_test_optimizer.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using namespace kiln::optim;
constexpr double kPi = std::numbers::pi;
constexpr int kSteps = 20;
const std::vector<double> kBase = {0.1, 0.02};

// The lrs of every group after construction (row 0) and after each of `steps` step() calls; also checks that
// last_lr() and last_epoch() agree with the optimizer at every row.
std::vector<std::vector<double>> run(LRScheduler& sched, const LrOnlyOptimizer& opt, int steps = kSteps) {
  std::vector<std::vector<double>> rows;
  for (int t = 0; t <= steps; ++t) {
    if (t > 0) sched.step();
    EXPECT_EQ(sched.last_epoch(), t);
    EXPECT_EQ(sched.last_lr(), opt.lrs()) << "step " << t;
    rows.push_back(opt.lrs());
  }
  return rows;
}

// `expected(group, t, previous lr)` gives the reference lr (recursive forms use the previous one).
void expect_sequence(const std::vector<std::vector<double>>& rows,
                     const std::function<double(size_t, int, double)>& expected, double rtol = 1e-12) {
  for (size_t g = 0; g < rows[0].size(); ++g) {
    double prev = kBase.at(g);
    for (size_t t = 0; t < rows.size(); ++t) {
      const double want = expected(g, static_cast<int>(t), prev);
      EXPECT_NEAR(rows[t][g], want, rtol * std::abs(want) + 1e-15) << "group " << g << ", step " << t;
      prev = want;
    }
  }
}

TEST(LRSchedulerTest, StepLRMatchesRecursiveForm) {
  LrOnlyOptimizer opt(kBase);
  StepLR sched(opt, 3, 0.5);
  const auto rows = run(sched, opt);
  expect_sequence(rows, [](size_t, int t, double prev) { return t > 0 && t % 3 == 0 ? prev * 0.5 : prev; });
  EXPECT_DOUBLE_EQ(rows[2][0], 0.1);
  EXPECT_DOUBLE_EQ(rows[7][0], 0.025);  // two decays by 7
  EXPECT_DOUBLE_EQ(rows[7][1], 0.005);
}

TEST(LRSchedulerTest, MultiStepLRCountsRepeatedMilestones) {
  LrOnlyOptimizer opt(kBase);
  MultiStepLR sched(opt, {5, 2, 9, 5}, 0.3);  // unsorted, 5 twice: decays twice at step 5 (as PyTorch's Counter)
  const auto rows = run(sched, opt);
  expect_sequence(rows, [](size_t, int t, double prev) {
    for (int m : {5, 2, 9, 5})
      if (t == m) prev *= 0.3;
    return prev;
  });
  EXPECT_NEAR(rows[5][0], 0.1 * 0.027, 1e-15);
  EXPECT_NEAR(rows[20][1], 0.02 * 0.0081, 1e-15);
}

TEST(LRSchedulerTest, ExponentialLR) {
  LrOnlyOptimizer opt(kBase);
  ExponentialLR sched(opt, 0.9);
  expect_sequence(run(sched, opt), [](size_t, int t, double prev) { return t == 0 ? prev : prev * 0.9; });
}

// PyTorch's recursive CosineAnnealingLR.get_lr (with its special case at T_max + 1, every 2 * T_max).
double torch_cosine(double base, double eta_min, int t_max, int t, double prev) {
  if (t == 0) return prev;
  if ((t - 1 - t_max) % (2 * t_max) == 0) return prev + (base - eta_min) * (1 - std::cos(kPi / t_max)) / 2;
  return (1 + std::cos(kPi * t / t_max)) / (1 + std::cos(kPi * (t - 1) / t_max)) * (prev - eta_min) + eta_min;
}

TEST(LRSchedulerTest, CosineAnnealingLRPastTMaxFollowsTheCosineAsPyTorch) {
  LrOnlyOptimizer opt(kBase);
  CosineAnnealingLR sched(opt, 7, 0.001);
  const auto rows = run(sched, opt);  // 20 steps: almost three half periods
  expect_sequence(
      rows, [](size_t g, int t, double prev) { return torch_cosine(kBase[g], 0.001, 7, t, prev); }, 1e-10);
  EXPECT_NEAR(rows[7][0], 0.001, 1e-15);  // the minimum at T_max
  EXPECT_NEAR(rows[14][1], 0.02, 1e-15);  // back at the base lr at 2 T_max
  EXPECT_NEAR(rows[8][0], 0.001 + 0.099 * (1 + std::cos(kPi * 8 / 7)) / 2, 1e-15);
}

// PyTorch's recursive LinearLR.get_lr.
double torch_linear(double start, double end, int total, int t, double prev) {
  if (t == 0) return prev * start;
  if (t > total) return prev;
  return prev * (1.0 + (end - start) / (total * start + (t - 1) * (end - start)));
}

TEST(LRSchedulerTest, LinearLRWarmup) {
  LrOnlyOptimizer opt(kBase);
  LinearLR sched(opt, 0.25, 1.0, 6);
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.025);  // set at construction, as PyTorch
  const auto rows = run(sched, opt);
  expect_sequence(rows, [](size_t, int t, double prev) { return torch_linear(0.25, 1.0, 6, t, prev); });
  EXPECT_DOUBLE_EQ(rows[3][1], 0.02 * 0.625);
  EXPECT_DOUBLE_EQ(rows[20][1], 0.02);
}

// OneCycleLR as the paper describes it, phase by phase: (start lr, end lr, first step, last step).
struct Phase {
  double from, to, first, last;
};
double one_cycle_reference(const std::vector<Phase>& phases, bool cos, int t) {
  for (size_t i = 0; i < phases.size(); ++i) {
    const Phase& p = phases[i];
    if (t <= p.last || i + 1 == phases.size()) {
      // 0 at the phase's start, 1 at its end; past the last phase's end the schedule holds its last lr
      const double x = std::min(1.0, (t - p.first) / (p.last - p.first));
      return cos ? p.to + (p.from - p.to) * (1 + std::cos(kPi * x)) / 2 : p.from + (p.to - p.from) * x;
    }
  }
  return 0;
}

TEST(LRSchedulerTest, OneCycleLRCos) {
  LrOnlyOptimizer opt({1.0, 1.0});  // ignored: OneCycleLR's base lrs are max_lr / div_factor
  OneCycleLR sched(opt, {.max_lr = {0.1, 0.02}, .total_steps = 20, .pct_start = 0.3});
  EXPECT_EQ(sched.base_lrs(), (std::vector<double>{0.1 / 25, 0.02 / 25}));
  const auto rows = run(sched, opt);  // steps 0..20: PyTorch allows reaching total_steps
  for (size_t g = 0; g < 2; ++g) {
    const double max = kBase[g], initial = max / 25, min = initial / 1e4;
    // Up over steps 0..5 (0.3 * 20 - 1), down over 5..19; step 20 holds the last lr.
    const std::vector<Phase> phases = {{initial, max, 0, 5}, {max, min, 5, 19}};
    for (int t = 0; t <= kSteps; ++t)
      EXPECT_NEAR(rows[t][g], one_cycle_reference(phases, true, t), 1e-15) << "group " << g << ", step " << t;
    EXPECT_NEAR(rows[0][g], initial, 1e-17);
    EXPECT_NEAR(rows[5][g], max, 1e-17);
    EXPECT_NEAR(rows[19][g], min, 1e-17);
  }
  // Past total_steps: an error, and nothing changes.
  expect_error([&] { sched.step(); }, {"OneCycleLR", "step 21", "total_steps = 20"});
  EXPECT_EQ(sched.last_epoch(), 20);
  EXPECT_EQ(opt.lrs(), rows[20]);
}

TEST(LRSchedulerTest, OneCycleLRLinearThreePhase) {
  LrOnlyOptimizer opt(kBase);
  OneCycleLR sched(opt, {.max_lr = {0.1, 0.02},
                         .total_steps = 20,
                         .pct_start = 0.25,
                         .anneal_strategy = AnnealStrategy::Linear,
                         .div_factor = 10,
                         .final_div_factor = 100,
                         .three_phase = true});
  const auto rows = run(sched, opt);
  for (size_t g = 0; g < 2; ++g) {
    const double max = kBase[g], initial = max / 10, min = initial / 100;
    const std::vector<Phase> phases = {{initial, max, 0, 4}, {max, initial, 4, 8}, {initial, min, 8, 19}};
    for (int t = 0; t <= kSteps; ++t)
      EXPECT_NEAR(rows[t][g], one_cycle_reference(phases, false, t), 1e-15) << "group " << g << ", step " << t;
  }
  EXPECT_NEAR(rows[2][0], 0.055, 1e-15);        // half way up from 0.01 to 0.1
  EXPECT_NEAR(rows[8][0], 0.01, 1e-15);         // back at the initial lr
  EXPECT_NEAR(rows[20][0], 0.01 / 100, 1e-17);  // held at the last lr (PyTorch's extrapolation is below zero)
}

// LinearLR 0.1 -> 1 over 5 steps, then a cosine from the base lr (its own step 0 at the milestone).
double warmup_cosine_reference(size_t g, int t) {
  if (t < 5) return kBase[g] * (0.1 + 0.9 * t / 5.0);
  return 0.001 + (kBase[g] - 0.001) * (1 + std::cos(kPi * (t - 5) / 15.0)) / 2;
}

TEST(LRSchedulerTest, SequentialLRWarmupThenCosine) {
  LrOnlyOptimizer opt(kBase);
  // Made in this order the cosine reads the lowered lr (0.1 * base); SequentialLR gives it the warmup's base lrs.
  auto warm = std::make_unique<LinearLR>(opt, 0.1, 1.0, 5);
  auto cos = std::make_unique<CosineAnnealingLR>(opt, 15, 0.001);
  EXPECT_NEAR(cos->base_lrs()[0], 0.01, 1e-17);
  std::vector<std::unique_ptr<LRScheduler>> parts;
  parts.push_back(std::move(warm));
  parts.push_back(std::move(cos));
  SequentialLR sched(opt, std::move(parts), {5});
  EXPECT_EQ(sched.scheduler(1).base_lrs(), kBase);
  const auto rows = run(sched, opt);
  expect_sequence(rows, [](size_t g, int t, double) { return warmup_cosine_reference(g, t); });
  EXPECT_DOUBLE_EQ(rows[5][0], 0.1);
  EXPECT_NEAR(rows[20][1], 0.001, 1e-15);
}

TEST(LRSchedulerTest, WarmupThenIsTheSameSequence) {
  LrOnlyOptimizer opt(kBase);
  auto sched = warmup_then(opt, 5, std::make_unique<CosineAnnealingLR>(opt, 15, 0.001), 0.1);
  expect_sequence(run(*sched, opt), [](size_t g, int t, double) { return warmup_cosine_reference(g, t); });
}

TEST(LRSchedulerTest, SequentialLROfThreeWithStepsCountedPerChild) {
  LrOnlyOptimizer opt(kBase);
  std::vector<std::unique_ptr<LRScheduler>> parts;
  parts.push_back(std::make_unique<ExponentialLR>(opt, 0.5));
  parts.push_back(std::make_unique<StepLR>(opt, 2, 0.1));
  parts.push_back(std::make_unique<LinearLR>(opt, 0.5, 1.0, 4));
  SequentialLR sched(opt, std::move(parts), {3, 8});
  expect_sequence(run(sched, opt, 12), [](size_t g, int t, double) {
    const double b = kBase[g];
    if (t < 3) return b * std::pow(0.5, t);
    if (t < 8) return b * std::pow(0.1, (t - 3) / 2);
    return b * (0.5 + 0.5 * std::min(t - 8, 4) / 4.0);
  });
}

// Hugging Face's get_linear_schedule_with_warmup lambda, as written there.
double hf_linear(int t, int warmup, int total) {
  if (t < warmup) return double(t) / double(std::max(1, warmup));
  return std::max(0.0, double(total - t) / double(std::max(1, total - warmup)));
}

TEST(LRSchedulerTest, LinearWarmupLinearDecayAsHuggingFace) {
  LrOnlyOptimizer opt(kBase);
  auto sched = linear_warmup_linear_decay(opt, 4, 16);
  EXPECT_EQ(opt.lr(0), 0.0);  // warmup starts at 0
  const auto rows = run(*sched, opt);
  expect_sequence(rows, [](size_t g, int t, double) { return kBase[g] * hf_linear(t, 4, 16); });
  EXPECT_DOUBLE_EQ(rows[2][0], 0.05);
  EXPECT_DOUBLE_EQ(rows[4][1], 0.02);
  EXPECT_DOUBLE_EQ(rows[10][0], 0.05);
  EXPECT_EQ(rows[16][0], 0.0);
  EXPECT_EQ(rows[20][1], 0.0);
}

TEST(LRSchedulerTest, LinearWarmupCosineDecayHoldsMinLr) {
  LrOnlyOptimizer opt(kBase);
  auto sched = linear_warmup_cosine_decay(opt, 4, 16, 0.001);
  const auto rows = run(*sched, opt);
  expect_sequence(rows, [](size_t g, int t, double) {
    if (t < 4) return kBase[g] * t / 4.0;
    if (t >= 16) return 0.001;
    return 0.001 + (kBase[g] - 0.001) * (1 + std::cos(kPi * (t - 4) / 12.0)) / 2;
  });
  EXPECT_NEAR(rows[10][0], (0.1 + 0.001) / 2, 1e-15);  // half way down
}

TEST(LRSchedulerTest, LambdaLRPerGroup) {
  LrOnlyOptimizer opt(kBase);
  LambdaLR sched(opt, std::vector<LambdaLR::Lambda>{[](int64_t t) { return 1.0 / (1 + t); },
                                                    [](int64_t t) { return t % 2 ? 2.0 : 1.0; }});
  const auto rows = run(sched, opt, 5);
  EXPECT_DOUBLE_EQ(rows[3][0], 0.025);
  EXPECT_DOUBLE_EQ(rows[3][1], 0.04);
  EXPECT_DOUBLE_EQ(rows[4][1], 0.02);
}

TEST(LRSchedulerTest, StepOverwritesAnLrSetByHand) {
  LrOnlyOptimizer opt(kBase);
  ExponentialLR sched(opt, 0.5);
  opt.set_lr(0, 42.0);  // closed forms: the next step does not multiply this
  sched.step();
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.05);
  EXPECT_DOUBLE_EQ(sched.lr_at(1, 3), 0.0025);
}

// ---- state_dict ----

using Factory = std::function<std::unique_ptr<LRScheduler>(LrOnlyOptimizer&)>;

std::vector<std::pair<std::string, Factory>> factories() {
  return {
      {"StepLR", [](auto& o) { return std::make_unique<StepLR>(o, 3, 0.5); }},
      {"MultiStepLR",
       [](auto& o) {
         return std::make_unique<MultiStepLR>(o, std::vector<int64_t>{5, 2, 9, 5}, 0.3);
       }},
      {"ExponentialLR", [](auto& o) { return std::make_unique<ExponentialLR>(o, 0.9); }},
      {"CosineAnnealingLR", [](auto& o) { return std::make_unique<CosineAnnealingLR>(o, 7, 0.001); }},
      {"LinearLR", [](auto& o) { return std::make_unique<LinearLR>(o, 0.25, 1.0, 12); }},
      {"OneCycleLR",
       [](auto& o) {
         return std::make_unique<OneCycleLR>(o, OneCycleOptions{.max_lr = {0.1, 0.02}, .total_steps = 20});
       }},
      {"SequentialLR",
       [](auto& o) { return warmup_then(o, 5, std::make_unique<CosineAnnealingLR>(o, 15, 0.001), 0.1); }},
      {"LambdaLR", [](auto& o) { return linear_warmup_linear_decay(o, 4, 16); }},
  };
}

TEST(LRSchedulerTest, StateDictRoundTripResumesTheSameSequence) {
  for (const auto& [name, make] : factories()) {
    SCOPED_TRACE(name);
    LrOnlyOptimizer opt(kBase);
    auto sched = make(opt);
    for (int t = 0; t < 7; ++t) sched->step();
    const SchedulerState sd = sched->state_dict();
    EXPECT_EQ(sd.at("last_epoch"), 7.0);
    EXPECT_EQ(sd.at("base_lrs.1"), sched->base_lrs()[1]);

    // A fresh run (its optimizer at other lrs, as after a restart before the optimizer's state is loaded).
    LrOnlyOptimizer opt2({0.5, 0.5});
    auto resumed = make(opt2);
    resumed->load_state_dict(sd);
    EXPECT_EQ(resumed->last_epoch(), 7);
    EXPECT_EQ(opt2.lrs(), opt.lrs());  // loading sets the loaded step's lrs
    EXPECT_EQ(resumed->state_dict(), sd);
    for (int t = 0; t < 13; ++t) {
      sched->step();
      resumed->step();
      EXPECT_EQ(opt2.lrs(), opt.lrs()) << "step " << 8 + t;  // exact: closed forms
    }
  }
}

TEST(LRSchedulerTest, LoadedHyperparametersReplaceTheConstructorArguments) {
  LrOnlyOptimizer opt(kBase);
  StepLR saved(opt, 4, 0.25);
  saved.step();
  LrOnlyOptimizer opt2(kBase);
  StepLR loaded(opt2, 2, 0.9);
  loaded.load_state_dict(saved.state_dict());
  for (int t = 0; t < 10; ++t) {
    saved.step();
    loaded.step();
    EXPECT_EQ(opt2.lrs(), opt.lrs());
  }
}

TEST(LRSchedulerTest, BadStateDictIsAnErrorAndChangesNothing) {
  LrOnlyOptimizer opt(kBase);
  auto sched = warmup_then(opt, 5, std::make_unique<CosineAnnealingLR>(opt, 15, 0.001), 0.1);
  sched->step();
  sched->step();
  const SchedulerState before = sched->state_dict();
  const std::vector<double> lrs = opt.lrs();

  SchedulerState missing = before;
  missing.erase("schedulers.1.T_max");
  SchedulerState bad_child = before;
  bad_child["schedulers.1.T_max"] = 0;
  bad_child["last_epoch"] = 9;
  SchedulerState fractional = before;
  fractional["last_epoch"] = 2.5;
  expect_error([&] { sched->load_state_dict(missing); }, {"CosineAnnealingLR", "no entry 'T_max'"});
  expect_error([&] { sched->load_state_dict(bad_child); }, {"T_max must be >= 1"});
  expect_error([&] { sched->load_state_dict(fractional); }, {"last_epoch", "whole number"});
  EXPECT_EQ(sched->state_dict(), before);
  EXPECT_EQ(opt.lrs(), lrs);

  // A state of two groups into a scheduler of one, and the other way.
  LrOnlyOptimizer one({0.1});
  StepLR one_group(one, 3);
  StepLR two_groups(opt, 3);
  expect_error([&] { one_group.load_state_dict(two_groups.state_dict()); }, {"more base_lrs", "1 parameter groups"});
  expect_error([&] { two_groups.load_state_dict(one_group.state_dict()); }, {"no entry 'base_lrs.1'"});

  // OneCycleLR: a step count past total_steps.
  OneCycleLR cycle(opt, {.max_lr = {0.1}, .total_steps = 10});
  SchedulerState past = cycle.state_dict();
  past["last_epoch"] = 11;
  expect_error([&] { cycle.load_state_dict(past); }, {"OneCycleLR", "total_steps = 10"});
  EXPECT_EQ(cycle.last_epoch(), 0);
}

// Whole-number entries below their bound (a step size, a count, a step) are refused naming the scheduler, the
// entry and the value, and the scheduler keeps its state.
TEST(LRSchedulerTest, StateEntriesBelowTheirBoundAreErrors) {
  LrOnlyOptimizer opt(kBase);
  StepLR step(opt, 3);
  step.step();
  const SchedulerState step_before = step.state_dict();
  SchedulerState zero_size = step_before;
  zero_size["step_size"] = 0;
  SchedulerState negative_epoch = step_before;
  negative_epoch["last_epoch"] = -1;
  expect_error([&] { step.load_state_dict(zero_size); },
               {"StepLR::load_state_dict", "step_size must be >= 1", "got 0"});
  expect_error([&] { step.load_state_dict(negative_epoch); },
               {"StepLR::load_state_dict", "last_epoch must be >= 0", "got -1"});
  EXPECT_EQ(step.state_dict(), step_before);

  MultiStepLR multi(opt, {2, 4});
  const SchedulerState multi_before = multi.state_dict();
  SchedulerState negative_count = multi_before;
  negative_count["milestones.size"] = -2;
  expect_error([&] { multi.load_state_dict(negative_count); },
               {"MultiStepLR::load_state_dict", "milestones.size must be >= 0", "got -2"});
  EXPECT_EQ(multi.state_dict(), multi_before);
}

// ---- bad arguments ----

TEST(LRSchedulerTest, BadArgumentsAreClearErrors) {
  LrOnlyOptimizer opt(kBase);
  expect_error([&] { StepLR(opt, 0); }, {"StepLR", "step_size must be >= 1", "got 0"});
  expect_error([&] { CosineAnnealingLR(opt, 0); }, {"CosineAnnealingLR", "t_max", ">= 1"});
  expect_error([&] { LinearLR(opt, 0.0, 1.0, 5); }, {"LinearLR", "start_factor must be in (0, 1]"});
  expect_error([&] { LinearLR(opt, 0.5, 1.5, 5); }, {"LinearLR", "end_factor must be in [0, 1]"});
  expect_error([&] { LinearLR(opt, 0.5, 1.0, 0); }, {"LinearLR", "total_iters must be >= 1"});
  expect_error([&] { OneCycleLR(opt, {.max_lr = {0.1}, .total_steps = 0}); },
               {"OneCycleLR", "total_steps must be >= 1"});
  expect_error([&] { OneCycleLR(opt, {.max_lr = {0.1}, .total_steps = 10, .pct_start = 1.5}); },
               {"OneCycleLR", "pct_start must be in [0, 1]"});
  expect_error(
      [&] {
        OneCycleLR(opt, {.max_lr = {0.1, 0.2, 0.3}, .total_steps = 10});
      },
      {"OneCycleLR", "3 values of max_lr for 2 parameter groups"});
  expect_error([&] { OneCycleLR(opt, {.max_lr = {}, .total_steps = 10}); }, {"OneCycleLR", "0 values of max_lr"});
  expect_error([&] { OneCycleLR(opt, {.max_lr = {0.1}, .total_steps = 10, .div_factor = 0}); },
               {"OneCycleLR", "div_factor must be > 0"});
  // pct_start * total_steps - 1 == 0: the first phase has no length (PyTorch divides by zero).
  expect_error([&] { OneCycleLR(opt, {.max_lr = {0.1}, .total_steps = 10, .pct_start = 0.1}); },
               {"OneCycleLR", "phase 1 of 2 has no length"});
  expect_error([&] { LambdaLR(opt, std::vector<LambdaLR::Lambda>(3, [](int64_t) { return 1.0; })); },
               {"LambdaLR", "3 lambdas", "2 parameter groups"});
  expect_error([&] { linear_warmup_linear_decay(opt, 10, 5); }, {"warmup_steps must be in [0, total_steps = 5]"});
  expect_error([&] { linear_warmup_cosine_decay(opt, 1, 0); }, {"total_steps must be >= 1"});
  expect_error([&] { linear_warmup_cosine_decay(opt, 1, 10, 0.05); }, {"min_lr must be in [0, lr]", "group 1"});
  expect_error([&] { warmup_then(opt, 0, std::make_unique<StepLR>(opt, 3)); },
               {"warmup_then", "warmup_steps must be >= 1"});

  LrOnlyOptimizer none(std::vector<double>{});
  expect_error([&] { StepLR(none, 3); }, {"no parameter group"});
}

// A schedule that computes a NaN or infinite lr stops with an error naming the scheduler, the group and the step,
// and the optimizer keeps the lrs it had (a NaN lr would make every weight NaN). A negative one is refused by the
// optimizer's set_lr (below), again leaving every group as it was.
TEST(LRSchedulerTest, NonFiniteOrNegativeLrIsAnError) {
  {
    Tensor a = internal::ones({1}).requires_grad_(), b = internal::ones({1}).requires_grad_();
    optim::SGD sgd(std::vector<optim::ParamGroup<optim::SGDOptions>>{{{a}, {.lr = 0.1}}, {{b}, {.lr = 0.02}}}, {});
    LambdaLR sched(sgd, std::vector<LambdaLR::Lambda>{[](int64_t t) { return t >= 2 ? 0.9 : 0.5; },
                                                      [](int64_t t) { return t >= 2 ? -1.0 : 0.5; }});
    sched.step();
    expect_error([&] { sched.step(); }, {"SGD: invalid learning rate -0.02"});
    EXPECT_EQ(sgd.lr(0), 0.05);
    EXPECT_EQ(sgd.lr(1), 0.01);
    EXPECT_EQ(sched.last_epoch(), 1);
  }
  for (double bad : {std::nan(""), HUGE_VAL}) {
    LrOnlyOptimizer opt(kBase);
    LambdaLR sched(opt, std::vector<LambdaLR::Lambda>{[](int64_t) { return 1.0; },
                                                      [bad](int64_t t) { return t >= 2 ? bad : 0.5; }});
    sched.step();
    EXPECT_EQ(opt.lrs(), (std::vector<double>{0.1, 0.01}));
    expect_error([&] { sched.step(); }, {"LambdaLR: the learning rate of parameter group 1 at step 2 would be"});
    EXPECT_EQ(opt.lrs(), (std::vector<double>{0.1, 0.01})) << "the refused step changed the lrs (" << bad << ")";
  }
}

TEST(LRSchedulerTest, SequentialLRBadArguments) {
  LrOnlyOptimizer opt(kBase), other(kBase);
  auto two = [&](Optimizer& second) {
    std::vector<std::unique_ptr<LRScheduler>> v;
    v.push_back(std::make_unique<StepLR>(opt, 3));
    v.push_back(std::make_unique<StepLR>(second, 3));
    return v;
  };
  expect_error([&] { SequentialLR(opt, two(opt), {}); }, {"SequentialLR", "2 schedulers and 0 milestones"});
  expect_error([&] { SequentialLR(opt, two(opt), {0}); }, {"SequentialLR", "strictly increasing and >= 1"});
  expect_error([&] { SequentialLR(opt, two(other), {3}); }, {"SequentialLR", "scheduler 1", "another optimizer"});
  expect_error([&] { SequentialLR(opt, {}, {}); }, {"SequentialLR", "at least one scheduler"});
  std::vector<std::unique_ptr<LRScheduler>> three;
  for (int i = 0; i < 3; ++i) three.push_back(std::make_unique<StepLR>(opt, 3));
  expect_error([&] { SequentialLR(opt, std::move(three), {4, 4}); }, {"strictly increasing", "position 1"});

  // A OneCycleLR child past its total_steps: the SequentialLR's step fails the same way.
  std::vector<std::unique_ptr<LRScheduler>> cyc;
  cyc.push_back(std::make_unique<StepLR>(opt, 3));
  cyc.push_back(std::make_unique<OneCycleLR>(opt, OneCycleOptions{.max_lr = {0.1}, .total_steps = 4}));
  SequentialLR seq(opt, std::move(cyc), {2});
  for (int t = 0; t < 6; ++t) seq.step();  // step 6 = the OneCycleLR's step 4 = its total_steps
  expect_error([&] { seq.step(); }, {"OneCycleLR", "step 5", "total_steps = 4"});
  EXPECT_EQ(seq.last_epoch(), 6);
}

TEST(LRSchedulerTest, GroupAddedAfterTheSchedulerIsAnError) {
  LrOnlyOptimizer opt(kBase);
  StepLR sched(opt, 3);
  opt.add_group(0.5);
  expect_error([&] { sched.step(); }, {"StepLR", "3 parameter groups", "made for 2"});
  EXPECT_EQ(sched.last_epoch(), 0);
}

}  // namespace
}  // namespace kiln::testing
