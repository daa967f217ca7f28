// tests/optim/test_optimizers.cpp — SGD, Adam, AdamW and LAMB on the CPU against float64 references written
// in tests/optim/optim_reference.h; the Optimizer base: groups, zero_grad, state_dict, errors; the AMP hooks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kiln/kiln.h"
#include "kiln/optim/adam.h"
#include "kiln/optim/lamb.h"
#include "kiln/optim/sgd.h"
#include "optim/optim_reference.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using namespace optim_ref;

Tensor leaf(const std::vector<double>& v, const Shape& shape, DType dtype = DType::Float64) {
  return make(v, shape, {.dtype = dtype}).requires_grad_();
}

// ---------------------------------------------------------------- trajectories against the reference

TEST(Optimizers, TrajectoriesMatchReferenceFloat64) {
  for (const Case& c : all_cases()) run_trajectory(c, {.dtype = DType::Float64}, 1e-12, 1e-14);
}

TEST(Optimizers, TrajectoriesMatchReferenceFloat32) {
  for (const Case& c : all_cases()) run_trajectory(c, {.dtype = DType::Float32}, 2e-5, 2e-6);
}

// 16-bit parameters: states and math in float32, the parameter rounded once per step.
TEST(Optimizers, BFloat16ParametersKeepFloat32State) {
  // Learning rates large enough that a missed update is far outside the tolerance.
  const std::vector<Case> cases = {
      {"sgd", optim::SGDOptions{.lr = 0.2, .momentum = 0.9, .weight_decay = 0.1}},
      {"adam", optim::AdamOptions{.lr = 0.1, .amsgrad = true}},
      {"adamw", optim::AdamWOptions{.lr = 0.1, .weight_decay = 0.1}},
      {"lamb", optim::LAMBOptions{.lr = 0.1}},
  };
  for (const Case& c : cases) run_trajectory(c, {.dtype = DType::BFloat16}, 1e-2, 2e-2, 3);
  Tensor p = leaf({1, 2}, {2}, DType::BFloat16);
  optim::Adam opt({p}, {.lr = 0.1});
  p.mutable_grad() = make({1, -1}, {2}, {.dtype = DType::BFloat16});
  opt.step();
  EXPECT_EQ(opt.state(p).at("exp_avg").dtype(), DType::Float32);
  EXPECT_EQ(opt.state(p).at("step").dtype(), DType::Float32);
  expect_values(p, {2}, {0.9, 2.1}, 1e-2, 1e-2);
}

// Hand-derived first steps, independent of the reference loops.
TEST(Optimizers, FirstStepsByHand) {
  {  // SGD, momentum 0.9: buf = g on step 1, then 0.9 * buf + g.
    Tensor p = leaf({1.0}, {1});
    optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
    p.mutable_grad() = make({2.0}, {1});
    opt.step();
    expect_values(p, {1}, {0.8});
    opt.step();
    expect_values(p, {1}, {0.8 - 0.1 * (0.9 * 2 + 2)});
    EXPECT_EQ(opt.state(p).at("step").item<float>(), 2.0f);
  }
  {  // Adam step 1 moves every coordinate by lr * sign(g) (up to eps).
    Tensor p = leaf({1.0, -1.0}, {2});
    optim::Adam opt({p}, {.lr = 0.1, .eps = 0});
    p.mutable_grad() = make({3.0, -0.5}, {2});
    opt.step();
    expect_values(p, {2}, {0.9, -0.9});
  }
  {  // AdamW step 1: p * (1 - lr * wd) - lr * sign(g).
    Tensor p = leaf({2.0}, {1});
    optim::AdamW opt({p}, {.lr = 0.1, .eps = 0, .weight_decay = 0.5});
    p.mutable_grad() = make({4.0}, {1});
    opt.step();
    expect_values(p, {1}, {2.0 * 0.95 - 0.1});
  }
  {  // LAMB step 1 without weight decay: update = sign(g), trust = ||p|| / sqrt(n).
    Tensor p = leaf({3.0, 4.0}, {2});
    optim::LAMB opt({p}, {.lr = 0.1, .eps = 0, .weight_decay = 0});
    p.mutable_grad() = make({1.0, -2.0}, {2});
    opt.step();
    const double trust = 5.0 / std::sqrt(2.0);
    expect_values(p, {2}, {3.0 - 0.1 * trust, 4.0 + 0.1 * trust});
  }
  {  // LAMB on a zero parameter: trust ratio 1.
    Tensor p = leaf({0.0, 0.0}, {2});
    optim::LAMB opt({p}, {.lr = 0.1, .eps = 0});
    p.mutable_grad() = make({1.0, -2.0}, {2});
    opt.step();
    expect_values(p, {2}, {-0.1, 0.1});
  }
}

TEST(Optimizers, ParametersWithoutGradientAreSkipped) {
  Tensor a = leaf({1, 2}, {2}), b = leaf({3, 4}, {2});
  optim::Adam opt({a, b}, {.lr = 0.1});
  a.mutable_grad() = make({1, 1}, {2});
  opt.step();
  expect_values(b, {2}, {3, 4});
  EXPECT_EQ(opt.find_state(b), nullptr);
  ASSERT_NE(opt.find_state(a), nullptr);
  EXPECT_EQ(opt.find_state(a)->at("step").item<float>(), 1.0f);
}

TEST(Optimizers, GroupsAndLearningRates) {
  Tensor a = leaf({1}, {1}), b = leaf({1}, {1}), c = leaf({1}, {1});
  optim::SGD opt({a, b}, {.lr = 0.1});
  opt.add_param_group({.params = {c}, .options = optim::SGDOptions{.lr = 0.01}});
  ASSERT_EQ(opt.num_param_groups(), 2u);
  EXPECT_EQ(opt.params(0).size(), 2u);
  EXPECT_DOUBLE_EQ(opt.lr(1), 0.01);
  opt.set_lr(0, 0.5);
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.5);
  auto all = opt.all_params();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_TRUE(all[0].is_same(a) && all[1].is_same(b) && all[2].is_same(c));
  for (Tensor* p : {&a, &b, &c}) p->mutable_grad() = make({1}, {1});
  opt.step();
  expect_values(a, {1}, {0.5});
  expect_values(c, {1}, {0.99});
}

TEST(Optimizers, ZeroGrad) {
  Tensor a = leaf({1, 2}, {2}), b = leaf({3}, {1});
  optim::SGD opt({a, b}, {.lr = 0.1});
  a.mutable_grad() = make({5, 6}, {2});
  opt.zero_grad(false);
  ASSERT_TRUE(a.grad().defined());
  expect_values(a.grad(), {2}, {0, 0});
  EXPECT_FALSE(b.grad().defined());
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  // And through a real backward.
  Tensor loss = kiln::sum(kiln::mul(a, a));
  loss.backward();
  expect_values(a.grad(), {2}, {2, 4});
  opt.step();
  expect_values(a, {2}, {0.8, 1.6});
}

// ---------------------------------------------------------------- AMP hooks on the CPU

TEST(Optimizers, StepWithDividesByGradScaleAndSkipsOnInf) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    Problem pb;
    std::vector<Tensor> p, q;  // q: steps with the unscaled gradient; p: step_with the scaled one
    for (size_t i = 0; i < 2; ++i) {
      p.push_back(leaf(pb.init[i], pb.shapes[i]));
      q.push_back(leaf(pb.init[i], pb.shapes[i]));
    }
    auto op = make_optimizer(c.options, p[0], p[1]);
    auto oq = make_optimizer(c.options, q[0], q[1]);
    ASSERT_TRUE(op->supports_step_with());
    const Tensor scale = make({1024}, {1}, {.dtype = DType::Float32});
    const Tensor no_inf = make({0}, {1}, {.dtype = DType::Float32});
    const Tensor inf = make({1}, {1}, {.dtype = DType::Float32});
    for (int k = 0; k < 3; ++k) {
      for (size_t i = 0; i < 2; ++i) {
        pb.set_grad(i, q[i]);
        p[i].mutable_grad() = internal::mul(q[i].grad(), 1024.0);
      }
      oq->step();
      op->step_with(scale, no_inf);
      for (size_t i = 0; i < 2; ++i) expect_values(p[i], pb.shapes[i], values(q[i]), 1e-13, 1e-15);
      // An overflowed step changes nothing: parameters, states, step counts.
      const auto before = op->state_dict();
      std::vector<Vec> params_before = {values(p[0]), values(p[1])};
      std::map<std::string, Vec> state_before;
      for (const auto& [key, t] : before.tensors) state_before[key] = values(t);
      op->step_with(scale, inf);
      for (size_t i = 0; i < 2; ++i) expect_values(p[i], pb.shapes[i], params_before[i], 0, 0);
      for (const auto& [key, t] : op->state_dict().tensors) {
        SCOPED_TRACE(key);
        expect_values(t, t.shape(), state_before.at(key), 0, 0);
      }
    }
  }
}

// An optimizer without the hooks refuses step_with.
class PlainSGD : public optim::OptimizerWith<optim::SGDOptions> {
 public:
  using OptimizerWith::OptimizerWith;
  void step() override {}
  std::string name() const override { return "PlainSGD"; }
};

TEST(Optimizers, StepWithUnsupportedThrows) {
  Tensor a = leaf({1}, {1});
  PlainSGD opt({a}, optim::SGDOptions{});
  EXPECT_FALSE(opt.supports_step_with());
  expect_error([&] { opt.step_with(Tensor(), Tensor()); }, {"PlainSGD.step_with", "unscale"});
}

// ---------------------------------------------------------------- state_dict

TEST(Optimizers, StateDictRoundTripResumesExactly) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    Problem pb;
    std::vector<Tensor> p, q;
    for (size_t i = 0; i < 2; ++i) p.push_back(leaf(pb.init[i], pb.shapes[i]));
    auto op = make_optimizer(c.options, p[0], p[1]);
    for (int k = 0; k < 3; ++k) {
      for (size_t i = 0; i < 2; ++i) pb.set_grad(i, p[i]);
      op->step();
    }
    // A second optimizer over copies of the parameters, with default options, loads the state.
    for (size_t i = 0; i < 2; ++i) q.push_back(leaf(values(p[i]), pb.shapes[i]));
    auto oq = std::visit(
        [&](const auto& o) {
          using O = std::decay_t<decltype(o)>;
          return make_optimizer(AnyOptions{O{}}, q[0], q[1]);
        },
        c.options);
    optim::OptimizerState sd = op->state_dict();
    EXPECT_TRUE(sd.tensors.count("state.1.step"));
    EXPECT_DOUBLE_EQ(sd.values.at("param_groups.1.size"), 1.0);
    EXPECT_DOUBLE_EQ(sd.values.at("param_groups.1.lr"), op->lr(1));
    oq->load_state_dict(sd);
    EXPECT_DOUBLE_EQ(oq->lr(0), op->lr(0));
    EXPECT_DOUBLE_EQ(oq->lr(1), op->lr(1));
    EXPECT_EQ(oq->state_dict().values, sd.values);
    for (int k = 0; k < 2; ++k) {
      for (size_t i = 0; i < 2; ++i) {
        pb.set_grad(i, p[i]);
        pb.set_grad(i, q[i]);
      }
      op->step();
      oq->step();
      for (size_t i = 0; i < 2; ++i) expect_values(q[i], pb.shapes[i], values(p[i]), 0, 0);
    }
    // The loaded state is a copy: the two optimizers do not share tensors.
    for (const auto& [key, t] : oq->state_dict().tensors) {
      EXPECT_NE(t.data_ptr<void>(), op->state_dict().tensors.at(key).data_ptr<void>()) << key;
    }
  }
}

TEST(Optimizers, LoadStateDictErrorsLeaveOptimizerUnchanged) {
  Tensor a = leaf({1, 2, 3}, {3}), b = leaf({4}, {1});
  optim::Adam opt({a, b}, {.lr = 0.1});
  a.mutable_grad() = make({1, 1, 1}, {3});
  b.mutable_grad() = make({1}, {1});
  opt.step();
  const auto good = opt.state_dict();
  const Vec m_before = values(opt.state(a).at("exp_avg"));
  auto expect_unchanged = [&] {
    EXPECT_DOUBLE_EQ(opt.lr(0), 0.1);
    expect_values(opt.state(a).at("exp_avg"), {3}, m_before, 0, 0);
    EXPECT_EQ(opt.state(a).at("step").item<float>(), 1.0f);
  };
  auto changed = [&](auto edit) {
    optim::OptimizerState sd = good;
    for (auto& [k, t] : sd.tensors) t = internal::clone(t);  // edits must not touch the live state
    sd.values["param_groups.0.lr"] = 0.5;                    // would change the options if applied
    edit(sd);
    return sd;
  };
  // Group count.
  expect_error([&] { opt.load_state_dict(changed([](auto& sd) { sd.values["param_groups.1.size"] = 1; })); },
               {"Adam.load_state_dict", "2 parameter group(s)", "has 1"});
  expect_unchanged();
  // Group size.
  expect_error([&] { opt.load_state_dict(changed([](auto& sd) { sd.values["param_groups.0.size"] = 1; })); },
               {"Adam.load_state_dict", "parameter group 0 has 1", "2 in this optimizer"});
  expect_unchanged();
  // Shape of a state tensor.
  expect_error(
      [&] {
        opt.load_state_dict(
            changed([](auto& sd) { sd.tensors["state.1.exp_avg"] = internal::zeros({2}, {.dtype = DType::Float64}); }));
      },
      {"Adam.load_state_dict", "state.1.exp_avg", "[2]", "[1]"});
  expect_unchanged();
  // A parameter index past the end, a malformed key.
  expect_error(
      [&] { opt.load_state_dict(changed([](auto& sd) { sd.tensors["state.7.exp_avg"] = internal::zeros({1}); })); },
      {"state.7.exp_avg", "2 parameters"});
  expect_error([&] { opt.load_state_dict(changed([](auto& sd) { sd.tensors["exp_avg"] = internal::zeros({1}); })); },
               {"unexpected tensor key 'exp_avg'"});
  // A missing option (a state saved by SGD), and an invalid one: the options are restored.
  Tensor c = leaf({1, 2, 3}, {3}), d = leaf({4}, {1});
  optim::SGD sgd({c, d}, {.lr = 0.1});
  expect_error([&] { opt.load_state_dict(sgd.state_dict()); },
               {"Adam.load_state_dict", "the state has no value 'param_groups.0.", "another kind"});
  expect_error([&] { opt.load_state_dict(changed([](auto& sd) { sd.values["param_groups.0.betas.1"] = 1.5; })); },
               {"Adam: invalid beta parameter at index 1"});
  expect_unchanged();
  // The good one still loads.
  opt.load_state_dict(changed([](auto&) {}));
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.5);
}

TEST(Optimizers, LoadStateDictCastsToTheParameter) {
  Tensor a = leaf({1, 2}, {2}, DType::Float32);
  optim::SGD opt({a}, {.lr = 0.1, .momentum = 0.9});
  optim::OptimizerState sd = opt.state_dict();
  sd.tensors["state.0.momentum_buffer"] = make({1, 1}, {2}, {.dtype = DType::Float64});
  sd.tensors["state.0.step"] = make({3}, {}, {.dtype = DType::Float64});
  opt.load_state_dict(sd);
  EXPECT_EQ(opt.state(a).at("momentum_buffer").dtype(), DType::Float32);
  EXPECT_EQ(opt.state(a).at("step").dtype(), DType::Float32);
  EXPECT_EQ(opt.state(a).at("step").shape(), Shape({1}));
  a.mutable_grad() = make({1, 1}, {2}, {.dtype = DType::Float32});
  opt.step();  // not a first step: buf = 0.9 * 1 + 1
  expect_values(a, {2}, {1 - 0.19, 2 - 0.19});
}

// ---------------------------------------------------------------- option and parameter errors

TEST(Optimizers, BadOptionsThrow) {
  Tensor a = leaf({1}, {1});
  expect_error([&] { optim::SGD({a}, {.lr = -1}); }, {"SGD: invalid learning rate -1"});
  expect_error([&] { optim::SGD({a}, {.momentum = -0.5}); }, {"SGD: invalid momentum"});
  expect_error([&] { optim::SGD({a}, {.weight_decay = -1}); }, {"SGD: invalid weight_decay"});
  expect_error([&] { optim::SGD({a}, {.nesterov = true}); }, {"nesterov", "momentum > 0 and dampening == 0"});
  expect_error([&] { optim::SGD({a}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}); },
               {"nesterov", "dampening 0.1"});
  expect_error([&] { optim::Adam({a}, {.betas = {1.0, 0.999}}); }, {"Adam: invalid beta parameter at index 0: 1"});
  expect_error([&] { optim::Adam({a}, {.betas = {0.9, -0.1}}); }, {"index 1", "[0, 1)"});
  expect_error([&] { optim::Adam({a}, {.eps = -1e-8}); }, {"Adam: invalid eps"});
  expect_error([&] { optim::AdamW({a}, {.lr = std::nan("")}); }, {"AdamW: invalid learning rate"});
  expect_error([&] { optim::AdamW({a}, {.weight_decay = -0.1}); }, {"AdamW: invalid weight_decay"});
  expect_error([&] { optim::LAMB({a}, {.max_trust_ratio = 0}); }, {"LAMB: invalid max_trust_ratio"});
  expect_error([&] { optim::LAMB({a}, {.betas = {0.9, 1.0}}); }, {"LAMB: invalid beta"});
  // A bad group is refused and the optimizer keeps its groups.
  optim::SGD opt({a}, {.lr = 0.1});
  Tensor b = leaf({1}, {1});
  expect_error([&] { opt.add_param_group({.params = {b}, .options = optim::SGDOptions{.lr = -0.1}}); },
               {"invalid learning rate"});
  EXPECT_EQ(opt.num_param_groups(), 1u);
}

TEST(Optimizers, BadParametersThrow) {
  Tensor a = leaf({1}, {1}), b = leaf({2}, {1});
  optim::SGD opt({a}, {.lr = 0.1});
  expect_error(
      [&] {
        opt.add_param_group({.params = {b, a}, .options = {}});
      },
      {"SGD.add_param_group", "parameter 1", "already in a parameter group"});
  EXPECT_EQ(opt.num_param_groups(), 1u);
  expect_error([&] { opt.add_param_group({.params = {b, b}, .options = {}}); }, {"parameter 1", "appears twice"});
  Tensor non_leaf = kiln::mul(b, 2.0);
  expect_error([&] { opt.add_param_group({.params = {non_leaf}, .options = {}}); }, {"parameter 0", "not a leaf"});
  Tensor ints = internal::zeros({2}, {.dtype = DType::Int64});
  expect_error([&] { opt.add_param_group({.params = {ints}, .options = {}}); }, {"int64", "floating-point"});
  expect_error([&] { opt.add_param_group({.params = {Tensor()}, .options = {}}); }, {"undefined"});
  EXPECT_EQ(opt.num_param_groups(), 1u);
  opt.add_param_group({.params = {b}, .options = {.lr = 0.2}});
  EXPECT_EQ(opt.num_param_groups(), 2u);
}

// As PyTorch: an optimizer over nothing is a mistake (a model whose layers were not registered, a name filter that
// matched nothing), not an optimizer whose step() does nothing.
TEST(Optimizers, EmptyParameterListsAreRefused) {
  expect_error([&] { optim::SGD(std::vector<Tensor>{}, {.lr = 0.1}); }, {"SGD: got an empty parameter list"});
  expect_error([&] { optim::Adam(std::vector<Tensor>{}); }, {"Adam: got an empty parameter list"});
  expect_error([&] { optim::AdamW(std::vector<Tensor>{}).step(); }, {"AdamW: got an empty parameter list"});
  expect_error([&] { optim::LAMB(std::vector<Tensor>{}); }, {"LAMB: got an empty parameter list"});
  // No group at all, and an empty group among others.
  expect_error([&] { optim::AdamW(std::vector<optim::ParamGroup<optim::AdamWOptions>>{}, {}); },
               {"AdamW: got an empty list of parameter groups"});
  Tensor a = leaf({1}, {1});
  expect_error(
      [&] {
        optim::SGD(std::vector<optim::ParamGroup<optim::SGDOptions>>{{{a}, {.lr = 0.1}}, {{}, {.lr = 0.1}}}, {});
      },
      {"SGD: got an empty parameter list for parameter group 1"});
  optim::SGD opt({a}, {.lr = 0.1});
  expect_error([&] { opt.add_param_group({.params = {}, .options = {}}); },
               {"empty parameter list for parameter group 1"});
  EXPECT_EQ(opt.num_param_groups(), 1u);
}

// set_lr and set_options take the constructor's checks (the options' validate(), not a copy of them): a NaN lr
// would make every weight NaN at the next step.
TEST(Optimizers, SettersRefuseWhatTheConstructorRefuses) {
  Tensor a = leaf({1}, {1});
  optim::SGD sgd({a}, {.lr = 0.1, .momentum = 0.9});
  optim::AdamW adamw({leaf({1}, {1})}, {.lr = 0.1});
  optim::LAMB lamb({leaf({1}, {1})}, {.lr = 0.1});
  for (optim::Optimizer* opt : std::vector<optim::Optimizer*>{&sgd, &adamw, &lamb}) {
    for (double bad : {std::nan(""), std::numeric_limits<double>::infinity(), -0.1}) {
      expect_error([&] { opt->set_lr(0, bad); }, {opt->name() + ": invalid learning rate"});
      EXPECT_EQ(opt->lr(0), 0.1) << opt->name() << " kept the refused lr " << bad;
    }
    expect_error([&] { opt->set_lr(3, 0.1); }, {opt->name() + ".set_lr: parameter group 3 does not exist"});
  }
  expect_error([&] { sgd.set_options(0, {.lr = 0.1, .momentum = std::nan("")}); }, {"SGD: invalid momentum"});
  EXPECT_EQ(sgd.groups()[0].options.momentum, 0.9);
  sgd.set_options(0, {.lr = 0.2, .momentum = 0.5});
  EXPECT_EQ(sgd.groups()[0].options.momentum, 0.5);
  // Options edited in place through groups() are checked by step(), before any weight changes.
  a.mutable_grad() = make({1}, {1});
  sgd.groups()[0].options.weight_decay = -1;
  expect_error([&] { sgd.step(); }, {"SGD: invalid weight_decay"});
  expect_values(a, {1}, {1.0});
}

}  // namespace
}  // namespace kiln::testing
