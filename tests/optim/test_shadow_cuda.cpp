// 16-bit shadows: the fused optimizers write the cast of each updated float32 parameter that an autocast region
// casts (fused.h, autocast::shadow), and the next region uses it instead of casting again.
//  - Kernels: after fused_sgd / fused_adam / fused_lamb the shadows hold exactly internal::cast(param) (the
//    same rounding), for float16 and bfloat16, with undefined entries, misaligned views, tensors over several
//    chunks and launches; a skipped step (found_inf) leaves the parameter and makes the shadow its cast.
//  - Argument errors name the list, the index and what is wrong.
//  - Training: a model trained with autocast + each optimizer gives bit for bit the losses and parameters of the
//    same training in which every step's shadows are made stale (an in-place write bumps each parameter's
//    version, so each region casts anew), and the regions after the first step cast nothing themselves. BERT's
//    self-attention, whose query, key and value casts are one stack (autocast::stacked_cast), eagerly and graphed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/autograd/stacked_cast.h"
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

#if KILN_TEST_CUDA
#include "kiln/optim/cuda/fused.h"

namespace kiln::optim::cuda_impl {
namespace {

using kiln::testing::expect_error;
using kiln::testing::make;
using kiln::testing::uniform;

const Device kGpu = Device::cuda(0);

class CudaShadowTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ha = internal::contiguous(a.to(Device::cpu()));
  const Tensor hb = internal::contiguous(b.to(Device::cpu()));
  return std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

// Parameters of awkward sizes (one element, a chunk boundary crossed twice, a misaligned view), their gradients,
// and shadows: undefined for every third parameter, others pre-filled with garbage.
struct Lists {
  TensorVec params, grads, shadows, m, v, vmax, bufs, steps;
};
Lists make_lists(DType shadow_dtype, int seed) {
  const std::vector<int64_t> sizes = {1, 3, 1000, 2 * 65536 + 7, 517};
  Lists l;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    const auto s = static_cast<uint64_t>(seed * 100 + static_cast<int>(i));
    Tensor p = make(uniform(n, -1, 1, s), {n}, {.device = kGpu});
    if (i == 4) {  // misaligned: a view at element offset 1
      p = make(uniform(n + 1, -1, 1, s), {n + 1}, {.device = kGpu}).narrow(0, 1, n);
    }
    l.params.push_back(p);
    l.grads.push_back(make(uniform(n, -1, 1, s + 50), {n}, {.device = kGpu}));
    Tensor sh;
    if (i % 3 != 2) {
      sh = internal::empty_strided(p.shape(), p.strides(), {.dtype = shadow_dtype, .device = kGpu});
      internal::fill_(sh, 7.0);
    }
    l.shadows.push_back(sh);
    l.m.push_back(internal::zeros({n}, {.device = kGpu}));
    l.v.push_back(internal::zeros({n}, {.device = kGpu}));
    l.vmax.push_back(internal::zeros({n}, {.device = kGpu}));
    l.bufs.push_back(internal::zeros({n}, {.device = kGpu}));
    l.steps.push_back(internal::zeros({1}, {.device = kGpu}));
  }
  return l;
}
void expect_shadows_are_casts(const Lists& l, DType dtype, const std::string& what) {
  for (size_t i = 0; i < l.params.size(); ++i) {
    if (!l.shadows[i].defined()) continue;
    SCOPED_TRACE(what + ": shadow " + std::to_string(i));
    EXPECT_TRUE(same_bits(l.shadows[i], internal::cast(l.params[i], dtype)));
  }
}

TEST_P(CudaShadowTest, KernelsWriteTheCastOfTheUpdatedParameter) {
  const DType dt = GetParam();
  for (int k = 0; k < 3; ++k) {  // several steps: shadows follow the parameters
    Lists a = make_lists(dt, 1);
    Lists before = make_lists(dt, 1);
    const TensorVec no_shadows;
    switch (k) {
      case 0:
        for (int s = 0; s < 3; ++s) {
          fused_sgd(a.params, a.grads, a.bufs, a.steps, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}, Tensor(),
                    Tensor(), a.shadows);
          // The same update without shadows: the parameters do not depend on whether shadows are written.
          fused_sgd(before.params, before.grads, before.bufs, before.steps,
                    {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}, Tensor(), Tensor(), no_shadows);
        }
        break;
      case 1:
        for (int s = 0; s < 3; ++s) {
          fused_adam(a.params, a.grads, a.m, a.v, a.vmax, a.steps,
                     {.lr = 0.01, .weight_decay = 0.1, .decoupled_weight_decay = true, .amsgrad = true}, Tensor(),
                     Tensor(), a.shadows);
          fused_adam(before.params, before.grads, before.m, before.v, before.vmax, before.steps,
                     {.lr = 0.01, .weight_decay = 0.1, .decoupled_weight_decay = true, .amsgrad = true}, Tensor(),
                     Tensor(), no_shadows);
        }
        break;
      default:
        for (int s = 0; s < 3; ++s) {
          fused_lamb(a.params, a.grads, a.m, a.v, a.steps, {.lr = 0.01, .weight_decay = 0.01}, Tensor(), Tensor(),
                     a.shadows);
          fused_lamb(before.params, before.grads, before.m, before.v, before.steps, {.lr = 0.01, .weight_decay = 0.01},
                     Tensor(), Tensor(), no_shadows);
        }
    }
    const std::string what = k == 0 ? "sgd" : k == 1 ? "adam" : "lamb";
    expect_shadows_are_casts(a, dt, what);
    for (size_t i = 0; i < a.params.size(); ++i) {
      SCOPED_TRACE(what + ": param " + std::to_string(i));
      EXPECT_TRUE(same_bits(a.params[i], before.params[i]));
      EXPECT_FALSE(same_bits(a.params[i], make_lists(dt, 1).params[i]));  // the step did move it
    }
  }
}

TEST_P(CudaShadowTest, SkippedStepLeavesTheParameterAndCastsItIntoTheShadow) {
  const DType dt = GetParam();
  const Tensor found_inf = make({1.0}, {1}, {.device = kGpu});
  Lists a = make_lists(dt, 2);
  const Lists start = make_lists(dt, 2);
  fused_adam(a.params, a.grads, a.m, a.v, {}, a.steps, {.lr = 0.01}, Tensor(), found_inf, a.shadows);
  expect_shadows_are_casts(a, dt, "adam, skipped");
  Lists b = make_lists(dt, 2);
  fused_sgd(b.params, b.grads, {}, {}, {.lr = 0.1}, Tensor(), found_inf, b.shadows);
  expect_shadows_are_casts(b, dt, "sgd, skipped");
  Lists c = make_lists(dt, 2);
  fused_lamb(c.params, c.grads, c.m, c.v, c.steps, {.lr = 0.01}, Tensor(), found_inf, c.shadows);
  expect_shadows_are_casts(c, dt, "lamb, skipped");
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_TRUE(same_bits(a.params[i], start.params[i]));
    EXPECT_TRUE(same_bits(b.params[i], start.params[i]));
    EXPECT_TRUE(same_bits(c.params[i], start.params[i]));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaShadowTest, ::testing::Values(DType::BFloat16, DType::Float16),
                         [](const auto& info) { return info.param == DType::BFloat16 ? "bf16" : "fp16"; });

class CudaShadowArgs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_F(CudaShadowArgs, BadShadowsAreNamed) {
  Lists l = make_lists(DType::BFloat16, 3);
  const SgdHyper h{.lr = 0.1};
  TensorVec short_list(l.shadows.begin(), l.shadows.begin() + 2);
  expect_error([&] { fused_sgd(l.params, l.grads, {}, {}, h, Tensor(), Tensor(), short_list); },
               {"fused_sgd: shadows has 2 tensors, expected 5"});
  TensorVec mixed = l.shadows;
  mixed[1] = internal::empty({3}, {.dtype = DType::Float16, .device = kGpu});
  expect_error([&] { fused_sgd(l.params, l.grads, {}, {}, h, Tensor(), Tensor(), mixed); },
               {"shadows[1] is float16 but an earlier shadow is bfloat16"});
  TensorVec wrong_shape = l.shadows;
  wrong_shape[1] = internal::empty({4}, {.dtype = DType::BFloat16, .device = kGpu});
  expect_error([&] { fused_adam(l.params, l.grads, l.m, l.v, {}, l.steps, {}, Tensor(), Tensor(), wrong_shape); },
               {"shadows[1] (shape [4]"});
  TensorVec wide = l.shadows;
  wide[0] = internal::empty({1}, {.dtype = DType::Float32, .device = kGpu});
  expect_error([&] { fused_lamb(l.params, l.grads, l.m, l.v, l.steps, {}, Tensor(), Tensor(), wide); },
               {"shadows[0] has dtype float32; a shadow is float16 or bfloat16"});
  TensorVec half_params;
  for (const Tensor& p : l.params) half_params.push_back(internal::cast(p, DType::BFloat16));
  TensorVec half_grads;
  for (const Tensor& g : l.grads) half_grads.push_back(internal::cast(g, DType::BFloat16));
  expect_error([&] { fused_sgd(half_params, half_grads, {}, {}, h, Tensor(), Tensor(), l.shadows); },
               {"only float32 parameters have 16-bit shadows"});
}

// A bucket's shadows are of one dtype, its first shadow's (CudaBucket::shadow_dtype): a parameter that its last
// region cast to the other dtype gets none in that step, and one that no region cast gets none either.
class PlanProbe : public SGD {
 public:
  using SGD::SGD;
  auto plan() const { return plan_step(params(0)); }
};

TEST_F(CudaShadowArgs, ABucketKeepsTheShadowsOfItsFirstShadowsDtype) {
  std::vector<Tensor> ps;
  for (int i = 0; i < 5; ++i) {
    ps.push_back(make(uniform(6, -1, 1, 40 + i), {2, 3}, {.device = kGpu}).requires_grad_());
    ps.back().mutable_grad() = make(uniform(6, -1, 1, 50 + i), {2, 3}, {.device = kGpu});
  }
  {
    amp::Autocast cast(DType::Float16);
    autocast::cast_to(ps[2], DType::Float16);
  }
  {
    amp::Autocast cast(DType::BFloat16);
    autocast::cast_to(ps[1], DType::BFloat16);
    autocast::cast_to(ps[3], DType::BFloat16);
  }
  {
    amp::Autocast cast(DType::Float16);
    autocast::cast_to(ps[4], DType::Float16);
  }
  // ps[0]: no region cast it. Bucket order: 0 (none), 1 (bfloat16: the bucket's dtype), 2 (float16), 3, 4.
  const PlanProbe opt(ps, SGDOptions{.lr = 0.1});
  const auto plan = opt.plan();
  ASSERT_EQ(plan.cuda.size(), 1u);
  const auto& bucket = plan.cuda[0];
  ASSERT_EQ(bucket.shadows.size(), 5u);
  ASSERT_TRUE(bucket.shadow_dtype.has_value());
  EXPECT_EQ(*bucket.shadow_dtype, DType::BFloat16);
  const std::vector<bool> kept{false, true, false, true, false};
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(bucket.shadows[i].defined(), kept[i]) << "parameter " << i;
    if (kept[i]) {
      EXPECT_EQ(bucket.shadows[i].dtype(), DType::BFloat16) << "parameter " << i;
    }
  }
}

// ---------------------------------------------------------------- training through the optimizers

struct TrainRun {
  std::vector<float> losses;
  std::vector<Tensor> params;
  size_t casts_after_first = 0;  // weights a region after the last step cast anew instead of using the shadow
};

enum class Opt { Sgd, AdamW, Lamb };

TrainRun train(Opt which, DType dtype, bool stale_shadows) {
  manual_seed(5);
  auto model =
      nn::make<nn::Sequential>(nn::Linear(32, 64), nn::ReLU(), nn::Linear(64, 64), nn::ReLU(), nn::Linear(64, 10));
  model->to(kGpu);
  std::unique_ptr<Optimizer> opt;
  switch (which) {
    case Opt::Sgd: opt = std::make_unique<SGD>(model->parameters(), SGDOptions{.lr = 0.05, .momentum = 0.9}); break;
    case Opt::AdamW: opt = std::make_unique<AdamW>(model->parameters(), AdamWOptions{.lr = 3e-3}); break;
    case Opt::Lamb: opt = std::make_unique<LAMB>(model->parameters(), LAMBOptions{.lr = 1e-2}); break;
  }
  const Tensor x = make(uniform(16 * 32, -1, 1, 9), {16, 32}, {.device = kGpu});
  const Tensor y = make(std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5}, {16},
                        {.dtype = DType::Int64, .device = kGpu});
  TrainRun r;
  for (int step = 0; step < 8; ++step) {
    opt->zero_grad();
    Tensor loss;
    {
      amp::Autocast cast(dtype);
      loss = nn::cross_entropy(model(x), y);
    }
    loss.backward();
    opt->step();
    r.losses.push_back(loss.item<float>());
    if (stale_shadows) {
      NoGradGuard no_grad;
      for (Tensor& p : model->parameters()) internal::mul_(p, 1.0);  // values unchanged, version bumped
    }
  }
  for (const Tensor& p : model->parameters()) r.params.push_back(internal::clone(p));
  // The regions after a step use the shadows: the cast the next region returns for each weight is the shadow
  // itself, and it equals casting the weight now.
  if (!stale_shadows) {
    amp::Autocast cast(dtype);
    for (const Tensor& p : model->parameters()) {
      if (p.dim() != 2) continue;  // the weights: the matmuls cast them (biases are added in the output dtype)
      const Tensor c = autocast::cast_to(p, dtype);
      EXPECT_TRUE(same_bits(c, internal::cast(p, dtype)));
      EXPECT_TRUE(c.is_alias_of(autocast::shadow::buffer(p))) << "the region cast the weight again";
      r.casts_after_first += c.is_alias_of(autocast::shadow::buffer(p)) ? 0 : 1;
    }
  }
  return r;
}

class CudaShadowTraining : public ::testing::TestWithParam<std::tuple<Opt, DType>> {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_P(CudaShadowTraining, SameLossesAndParametersAsCastingEveryStep) {
  const auto [which, dtype] = GetParam();
  const TrainRun with = train(which, dtype, false);
  const TrainRun without = train(which, dtype, true);
  ASSERT_EQ(with.losses.size(), without.losses.size());
  for (size_t i = 0; i < with.losses.size(); ++i) {
    EXPECT_EQ(with.losses[i], without.losses[i]) << "step " << i;
    EXPECT_TRUE(std::isfinite(with.losses[i]));
  }
  EXPECT_LT(with.losses.back(), with.losses.front());  // it trains
  ASSERT_EQ(with.params.size(), without.params.size());
  for (size_t i = 0; i < with.params.size(); ++i) EXPECT_TRUE(same_bits(with.params[i], without.params[i])) << i;
  EXPECT_EQ(with.casts_after_first, 0U);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CudaShadowTraining,
                         ::testing::Combine(::testing::Values(Opt::Sgd, Opt::AdamW, Opt::Lamb),
                                            ::testing::Values(DType::BFloat16, DType::Float16)),
                         [](const auto& info) {
                           const Opt o = std::get<0>(info.param);
                           return std::string(o == Opt::Sgd     ? "sgd"
                                              : o == Opt::AdamW ? "adamw"
                                                                : "lamb") +
                                  (std::get<1>(info.param) == DType::BFloat16 ? "_bf16" : "_fp16");
                         });

// kSteps steps of `step` (which leaves its loss in `loss`), eager or as replays of one captured step (two eager
// warm-up steps first); the losses from step 2 on go into r. In eager runs with stale_shadows, every parameter's
// version is bumped after each step (values unchanged), so that each region casts anew.
void run_steps(const std::function<void()>& step, const Tensor& loss, nn::Module& model, bool stale_shadows,
               bool graphed, int kSteps, TrainRun& r) {
  if (graphed) {
    cuda::Graph graph;
    graph.capture(step, /*warmup=*/2);  // two eager steps, then the captured one (not run by the capture)
    // The capture ran the step twice eagerly; the captured step's loss is each replay's.
    for (int i = 0; i < kSteps - 2; ++i) {
      graph.replay();
      r.losses.push_back(loss.item<float>());
    }
    return;
  }
  for (int i = 0; i < kSteps; ++i) {
    step();
    if (i >= 2) r.losses.push_back(loss.item<float>());
    if (stale_shadows) {
      NoGradGuard no_grad;
      for (Tensor& p : model.parameters()) internal::mul_(p, 1.0);
    }
  }
}

// A small channels-last convolutional network (3x3 and 1x1 convolutions, batch norm, a residual add), SGD with
// momentum and, for float16, the GradScaler, trained eagerly or as CUDA graph replays; deterministic mode, so
// that two runs can agree bit for bit. Returns the per-step losses and the final parameters.
TrainRun train_conv(DType dtype, bool stale_shadows, bool graphed) {
  set_deterministic(true);
  manual_seed(11);
  struct Net : nn::Module {
    nn::Handle<nn::Conv2d> stem, conv, shortcut;
    nn::Handle<nn::BatchNorm2d> bn;
    nn::Handle<nn::Linear> head;
    Net() : Module("Net") {
      stem = register_module("stem", nn::Conv2d(3, 16, 3, {.padding = 1}));
      bn = register_module("bn", nn::BatchNorm2d(16));
      conv = register_module("conv", nn::Conv2d(16, 16, 3, {.padding = 1}));
      shortcut = register_module("shortcut", nn::Conv2d(16, 16, 1));
      head = register_module("head", nn::Linear(16 * 8 * 8, 10));
    }
    Tensor forward(const Tensor& x) override {
      const Tensor h = relu(bn(stem(x)));
      const Tensor r = relu(conv(h) + shortcut(h));
      return head(r.flatten(1));
    }
  };
  auto model = nn::make<Net>();
  model->to(kGpu, MemoryFormat::ChannelsLast);
  SGD opt(model->parameters(), {.lr = 0.02, .momentum = 0.9, .weight_decay = 5e-5});
  amp::GradScaler scaler({.enabled = dtype == DType::Float16});
  const Tensor x = internal::contiguous(make(uniform(8 * 3 * 8 * 8, -1, 1, 3), {8, 3, 8, 8}, {.device = kGpu}),
                                        MemoryFormat::ChannelsLast);
  const Tensor y = make(std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7}, {8}, {.dtype = DType::Int64, .device = kGpu});
  TrainRun r;
  Tensor loss;
  auto step = [&] {
    opt.zero_grad(true);
    {
      amp::Autocast cast(dtype);
      loss = nn::cross_entropy(model(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  };
  run_steps(step, loss, *model, stale_shadows, graphed, 10, r);
  for (const Tensor& p : model->parameters()) r.params.push_back(internal::clone(p));
  set_deterministic(false);
  return r;
}

// The eager and graphed runs against the reference (shadows made stale every step): the same losses from step 2 on and
// the same final parameters, bit for bit; the reference trains.
void expect_same_training(const TrainRun& reference, const TrainRun& eager, const TrainRun& graphed) {
  for (const TrainRun* run : {&eager, &graphed}) {
    const char* what = run == &eager ? "eager" : "graphed";
    ASSERT_EQ(run->losses.size(), reference.losses.size()) << what;
    for (size_t i = 0; i < run->losses.size(); ++i) {
      EXPECT_EQ(run->losses[i], reference.losses[i]) << what << ", step " << i + 2;
    }
    ASSERT_EQ(run->params.size(), reference.params.size());
    for (size_t i = 0; i < run->params.size(); ++i) {
      EXPECT_TRUE(same_bits(run->params[i], reference.params[i])) << what << ", parameter " << i;
    }
  }
  EXPECT_TRUE(std::isfinite(reference.losses.back()));
  EXPECT_LT(reference.losses.back(), reference.losses.front());
}

class CudaShadowConv : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_P(CudaShadowConv, ChannelsLastNetworkEagerAndGraphedMatchCastingEveryStep) {
  const DType dtype = GetParam();
  const TrainRun reference = train_conv(dtype, /*stale_shadows=*/true, /*graphed=*/false);
  expect_same_training(reference, train_conv(dtype, false, false), train_conv(dtype, false, true));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaShadowConv, ::testing::Values(DType::BFloat16, DType::Float16),
                         [](const auto& info) { return info.param == DType::BFloat16 ? "bf16" : "fp16"; });

// BERT's self-attention casts its query, key and value weights (and biases) as one stack (autocast::stacked_cast).
// Trained with AdamW under autocast, eagerly and as CUDA graph replays, it gives bit for bit the losses and parameters
// of the same training with every step's shadows made stale (each region then casts and concatenates anew, and the
// stack's gradient is copied out per parameter). After a step the stack is the shadows' buffer, and the parameters'
// gradients are consecutive rows of one tensor (kept without a copy).
TrainRun train_attention(DType dtype, bool stale_shadows, bool graphed) {
  set_deterministic(true);
  manual_seed(13);
  const nn::models::BertConfig config{.hidden_size = 64, .num_attention_heads = 4, .attention_probs_dropout_prob = 0.0};
  struct Net : nn::Module {
    nn::Handle<nn::models::BertSelfAttention> attention;
    nn::Handle<nn::Linear> head;
    explicit Net(const nn::models::BertConfig& c) : Module("Net") {
      attention = register_module("attention", std::make_shared<nn::models::BertSelfAttention>(c));
      head = register_module("head", nn::Linear(c.hidden_size, 10));
    }
    Tensor forward(const Tensor& x) override { return head(attention->forward(x, Tensor()).mean({1})); }
  };
  auto model = nn::make<Net>(config);
  model->to(kGpu);
  AdamW opt(model->parameters(), {.lr = 3e-3});
  const Tensor x = make(uniform(8 * 16 * 64, -1, 1, 4), {8, 16, 64}, {.device = kGpu});
  const Tensor y = make(std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7}, {8}, {.dtype = DType::Int64, .device = kGpu});
  TrainRun r;
  Tensor loss;
  auto step = [&] {
    opt.zero_grad(true);
    {
      amp::Autocast cast(dtype);
      loss = nn::cross_entropy(model(x), y);
    }
    loss.backward();
    opt.step();
  };
  run_steps(step, loss, *model, stale_shadows, graphed, 8, r);
  for (const Tensor& p : model->parameters()) r.params.push_back(internal::clone(p));
  if (!stale_shadows && !graphed) {
    const nn::models::BertSelfAttention& a = *model->attention;
    for (const auto& [ps, size] :
         {std::pair{std::vector<Tensor>{a.query->weight, a.key->weight, a.value->weight}, int64_t{64 * 64 * 4}},
          std::pair{std::vector<Tensor>{a.query->bias, a.key->bias, a.value->bias}, int64_t{64 * 4}}}) {
      const char* q = static_cast<const char*>(ps[0].grad().data_ptr());
      EXPECT_EQ(static_cast<const char*>(ps[1].grad().data_ptr()), q + size) << "the gradients were copied apart";
      EXPECT_EQ(static_cast<const char*>(ps[2].grad().data_ptr()), q + 2 * size);
      amp::Autocast cast(dtype);
      const Tensor stack = autocast::stacked_cast(ps, dtype);
      EXPECT_TRUE(stack.is_alias_of(autocast::shadow::buffer(ps[0]))) << "the region stacked the casts again";
      EXPECT_TRUE(same_bits(stack, internal::cast(internal::cat(ps, 0), dtype)));
      r.casts_after_first += stack.is_alias_of(autocast::shadow::buffer(ps[0])) ? 0 : 1;
    }
  }
  set_deterministic(false);
  return r;
}

TEST_P(CudaShadowTest, StackedProjectionEagerAndGraphedMatchCastingEveryStep) {
  const DType dtype = GetParam();
  const TrainRun reference = train_attention(dtype, /*stale_shadows=*/true, /*graphed=*/false);
  const TrainRun eager = train_attention(dtype, false, false);
  expect_same_training(reference, eager, train_attention(dtype, false, true));
  EXPECT_EQ(eager.casts_after_first, 0U);
}

}  // namespace
}  // namespace kiln::optim::cuda_impl

#else
TEST(CudaShadow, NeedsACudaBuild) { GTEST_SKIP() << "kiln was built without CUDA (KILN_CUDA=OFF)"; }
#endif
