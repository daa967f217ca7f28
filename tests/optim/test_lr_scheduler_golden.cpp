// LR schedulers against PyTorch (torch.optim.lr_scheduler) and Hugging Face transformers: the lrs that
// tests/golden/make_golden_sched.py recorded (optimizer.param_groups[g]['lr'] after construction and after each
// scheduler.step()) for the same configurations. A missing tests/golden/data/lr_scheduler.golden (or case in it) fails
// the test.
#include <gtest/gtest.h>

#include <cmath>

#include <functional>

#include "kiln/kiln.h"
#include "kiln/optim/lr_scheduler.h"
#include "optim/scheduler_test_optimizer.h"
#include "support/golden.h"

namespace kiln::testing {
namespace {

using namespace kiln::optim;
using Factory = std::function<std::unique_ptr<LRScheduler>(LrOnlyOptimizer&)>;

// The configurations of make_golden_sched.py, by case name.
struct Case {
  std::string name;
  std::vector<double> base_lrs;
  Factory make;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }  // gtest names the case, not its bytes

std::vector<Case> cases() {
  const std::vector<double> two = {0.1, 0.02};
  auto seq = [](LrOnlyOptimizer& o) {
    std::vector<std::unique_ptr<LRScheduler>> parts;
    parts.push_back(std::make_unique<LinearLR>(o, 0.1, 1.0, 5));
    parts.push_back(std::make_unique<CosineAnnealingLR>(o, 15, 0.001));
    return std::make_unique<SequentialLR>(o, std::move(parts), std::vector<int64_t>{5});
  };
  return {
      {"step_lr", two, [](auto& o) { return std::make_unique<StepLR>(o, 3, 0.5); }},
      {"multistep_lr", two,
       [](auto& o) {
         return std::make_unique<MultiStepLR>(o, std::vector<int64_t>{5, 2, 9, 5}, 0.3);
       }},
      {"exponential_lr", two, [](auto& o) { return std::make_unique<ExponentialLR>(o, 0.9); }},
      {"cosine_lr", two, [](auto& o) { return std::make_unique<CosineAnnealingLR>(o, 7, 0.001); }},
      {"linear_lr", two, [](auto& o) { return std::make_unique<LinearLR>(o, 0.25, 1.0, 6); }},
      {"onecycle_cos", two,
       [](auto& o) {
         return std::make_unique<OneCycleLR>(
             o, OneCycleOptions{.max_lr = {0.1, 0.02}, .total_steps = 20, .pct_start = 0.3});
       }},
      {"onecycle_linear_three_phase", two,
       [](auto& o) {
         return std::make_unique<OneCycleLR>(o, OneCycleOptions{.max_lr = {0.1, 0.02},
                                                                .total_steps = 20,
                                                                .pct_start = 0.25,
                                                                .anneal_strategy = AnnealStrategy::Linear,
                                                                .div_factor = 10,
                                                                .final_div_factor = 100,
                                                                .three_phase = true});
       }},
      {"sequential_warmup_cosine", two, seq},
      {"hf_linear_warmup", two, [](auto& o) { return linear_warmup_linear_decay(o, 4, 16); }},
      {"hf_cosine_min_lr", {0.1}, [](auto& o) { return linear_warmup_cosine_decay(o, 4, 16, 0.001); }},
  };
}

class LRSchedulerGoldenTest : public ::testing::TestWithParam<Case> {};

TEST_P(LRSchedulerGoldenTest, MatchesPyTorch) {
  // A missing file, or a case missing from it, fails the test.
  const Golden g = load_golden("lr_scheduler",
                               "python3 tests/golden/make_golden_sched.py tests/golden/data, with transformers "
                               "installed for the hf_* cases");
  const Case& c = GetParam();
  const Tensor expected = g.get(c.name);  // (steps + 1, groups)
  ASSERT_EQ(expected.dim(), 2);
  ASSERT_EQ(expected.shape()[1], static_cast<int64_t>(c.base_lrs.size()));

  LrOnlyOptimizer opt(c.base_lrs);
  auto sched = c.make(opt);
  std::vector<double> lrs;
  for (int64_t t = 0; t < expected.shape()[0]; ++t) {
    if (t > 0) sched->step();
    lrs.insert(lrs.end(), opt.lrs().begin(), opt.lrs().end());
  }
  const int64_t groups = expected.shape()[1];
  if (c.name.rfind("onecycle", 0) == 0) {
    // At step total_steps (the last row) kiln holds the schedule's last lr, where PyTorch extrapolates the last
    // phase (to a negative lr for a linear anneal): compare the rows before it, and the last row with the one
    // before it.
    const int64_t rows = expected.shape()[0];
    for (int64_t j = 0; j < groups; ++j)
      EXPECT_EQ(lrs[static_cast<size_t>((rows - 1) * groups + j)], lrs[static_cast<size_t>((rows - 2) * groups + j)])
          << c.name << ", group " << j;
    const std::vector<double> w = expected.to_vector<double>();
    for (int64_t k = 0; k < (rows - 1) * groups; ++k)
      EXPECT_NEAR(lrs[static_cast<size_t>(k)], w[static_cast<size_t>(k)], 1e-15 + 1e-10 * std::abs(w[static_cast<size_t>(k)])) << c.name << ", element " << k;
    return;
  }
  // PyTorch's recursive forms against kiln's closed forms: the same up to rounding.
  expect_golden(from_vector(lrs, expected.shape()), g, c.name, 1e-10, 1e-15);
}

INSTANTIATE_TEST_SUITE_P(Schedulers, LRSchedulerGoldenTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace kiln::testing
