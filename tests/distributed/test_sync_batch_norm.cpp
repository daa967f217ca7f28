// SyncBatchNorm in one process: nn::BatchNorm with a statistics reducer (the path that sums statistics over
// processes) against plain BatchNorm — with an identity reducer (world size 1: outputs, running statistics,
// gradients equal), with a reducer that doubles (two identical ranks: equal to plain BatchNorm on the batch
// given twice, which checks that sums and counts are reduced consistently and that backward reduces the
// gradient), gradcheck in float64, 16-bit inputs under autocast, eval mode, bad reducers; then the real
// reducer: dist::functional::all_reduce_sum and dist::convert_sync_batchnorm at world size 1. Two processes:
// test_mpi_sync_batch_norm.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kiln/autograd/autocast.h"  // autocast::Guard
#include "kiln/autograd/gradcheck.h"
#include "kiln/distributed/environment.h"      // dist::init
#include "kiln/distributed/functional.h"       // dist::functional::all_reduce_sum
#include "kiln/distributed/sync_batch_norm.h"  // dist::convert_sync_batchnorm
#include "kiln/layers/containers.h"            // nn::Sequential
#include "kiln/layers/conv.h"                  // nn::Conv2d
#include "kiln/layers/layers.h"
#include "kiln/layers/models/resnet.h"  // nn::models::resnet18
#include "support/grad_support.h"
#include "support/test_support.h"
#include "sync_batch_norm_support.h"

namespace kiln::testing {
namespace {

// What the statistics reducer of `ranks` identical processes returns: every sum times `ranks` (ranks = 1:
// the identity, what the real group does at world size 1). Backward multiplies the gradient the same way,
// as the sum over identical ranks of the same gradient. Records the dtypes it was given.
class ScalingReducer final : public nn::BatchNormStatsReducer {
 public:
  explicit ScalingReducer(int ranks) : ranks_(ranks) {}
  Tensor all_reduce_sum(const Tensor& t) override {
    ++calls;
    dtypes.push_back(t.dtype());
    return ranks_ == 1 ? t : t * static_cast<double>(ranks_);
  }
  int world_size() const override { return ranks_; }
  int calls = 0;
  std::vector<DType> dtypes;

 private:
  int ranks_;
};

// A reducer that breaks the contract: returns the wrong shape.
class WrongShapeReducer final : public nn::BatchNormStatsReducer {
 public:
  Tensor all_reduce_sum(const Tensor& t) override { return narrow(t, 0, 0, 1); }
  int world_size() const override { return 2; }
};

const std::vector<BnCase>& cases() {
  static const std::vector<BnCase> k = {
      {.name = "2d NCHW", .shape = {4, 3, 5, 5}},
      {.name = "2d channels-last", .shape = {4, 3, 5, 5}, .channels_last = true},
      {.name = "2d forward_relu", .shape = {4, 3, 5, 5}, .relu = true},
      {.name = "2d channels-last forward_relu", .shape = {2, 5, 3, 4}, .channels_last = true, .relu = true},
      {.name = "1d (N, C)", .shape = {8, 3}},
      {.name = "1d (N, C, L)", .shape = {4, 3, 6}},
      {.name = "no affine, no running stats", .shape = {4, 3, 2, 2}, .affine = false, .track_running_stats = false},
  };
  return k;
}

class SyncBatchNormTest : public BackendTest {};

// (a) World size 1: identical to plain BatchNorm, over two training steps (the running statistics' momentum)
// and an eval step after them.
TEST_P(SyncBatchNormTest, IdentityReducerMatchesPlainBatchNorm) {
  const double rtol = 1e-5, atol = 1e-5;
  for (const BnCase& k : cases()) {
    SCOPED_TRACE(k.name);
    auto plain = make_bn(k, dev());
    auto synced = make_bn(k, dev());
    auto reducer = std::make_shared<ScalingReducer>(1);
    synced->set_stats_reducer(reducer);
    const int64_t n = numel_of(k.shape);
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const auto data = uniform(n, -2 + step, 2 + 2 * step, 100 + step);  // a different batch each step
      Tensor g = make_out_grad(k.shape, dev(), DType::Float32, 200 + step);
      Tensor x0 = make_leaf(data, k.shape, k.channels_last, dev());
      Tensor x1 = make_leaf(data, k.shape, k.channels_last, dev());
      plain->zero_grad();
      synced->zero_grad();
      Tensor y0 = train_step(*plain, x0, g, k.relu);
      Tensor y1 = train_step(*synced, x1, g, k.relu);
      expect_close(y1, y0, rtol, atol, "output");
      expect_close(x1.grad(), x0.grad(), rtol, atol, "input gradient");
      if (k.affine) {
        expect_close(synced->weight.grad(), plain->weight.grad(), rtol, atol, "weight gradient");
        expect_close(synced->bias.grad(), plain->bias.grad(), rtol, atol, "bias gradient");
      }
      if (k.track_running_stats) {
        expect_close(synced->running_mean, plain->running_mean, rtol, atol, "running_mean");
        expect_close(synced->running_var, plain->running_var, rtol, atol, "running_var");
        EXPECT_EQ(synced->num_batches_tracked.cpu().item<int64_t>(), step + 1);
      }
    }
    EXPECT_EQ(reducer->calls, 4);  // two per training forward, two per backward
    plain->eval();
    synced->eval();
    Tensor x = make(uniform(n, -1, 1, 300), k.shape, opts());
    NoGradGuard no_grad;
    expect_close(k.relu ? synced->forward_relu(x) : (*synced)(x), k.relu ? plain->forward_relu(x) : (*plain)(x), rtol,
                 atol, "eval output");
    EXPECT_EQ(reducer->calls, 4) << "eval mode must not reduce: it uses the running statistics";
  }
}

// (c) Two identical ranks (the reducer doubles every sum, the count included): the same as plain BatchNorm on
// the batch given twice. The unbiased running variance then uses the global count 2n, the input gradient
// gets both ranks' contributions through the statistics, and each rank's weight gradient is its own half.
TEST_P(SyncBatchNormTest, DoublingReducerMatchesPlainBatchNormOnTheBatchTwice) {
  const double rtol = 1e-5, atol = 1e-5;
  for (const BnCase& k : cases()) {
    SCOPED_TRACE(k.name);
    auto plain = make_bn(k, dev());
    auto synced = make_bn(k, dev());
    synced->set_stats_reducer(std::make_shared<ScalingReducer>(2));
    const int64_t n = numel_of(k.shape), b = k.shape[0];
    const auto data = uniform(n, -2, 3, 7);
    Tensor g = make_out_grad(k.shape, dev());
    // The plain reference sees two separate leaves (one per "rank"), so each gets its own gradient.
    Tensor xa = make_leaf(data, k.shape, k.channels_last, dev());
    Tensor xb = make_leaf(data, k.shape, k.channels_last, dev());
    Tensor y_full = train_step(*plain, cat({xa, xb}, 0), cat({g, g}, 0), k.relu);
    Tensor x = make_leaf(data, k.shape, k.channels_last, dev());
    Tensor y = train_step(*synced, x, g, k.relu);
    expect_close(y, narrow(y_full, 0, 0, b), rtol, atol, "output (rank 0's half)");
    expect_close(x.grad(), xa.grad(), rtol, atol, "input gradient");
    if (k.affine) {
      expect_close(synced->weight.grad() * 2.0, plain->weight.grad(), rtol, atol, "weight gradient (both ranks)");
      expect_close(synced->bias.grad() * 2.0, plain->bias.grad(), rtol, atol, "bias gradient (both ranks)");
    }
    if (k.track_running_stats) {
      expect_close(synced->running_mean, plain->running_mean, rtol, atol, "running_mean");
      expect_close(synced->running_var, plain->running_var, rtol, atol, "running_var (unbiased with count 2n)");
    }
  }
}

// Under bfloat16 autocast (a bfloat16 convolution's output coming in): statistics in float32, the output and
// the input gradient back in bfloat16, values as float32 batch norm of the same (rounded) input.
TEST_P(SyncBatchNormTest, BFloat16InputUnderAutocastComputesStatisticsInFloat32) {
  const BnCase k{.name = "2d", .shape = {4, 3, 4, 4}, .relu = true};
  const int64_t n = numel_of(k.shape);
  const auto data = values(make(uniform(n, -2, 2, 5), {n}, {.dtype = DType::BFloat16}));  // bf16-exact
  auto plain = make_bn(k, dev());
  auto synced = make_bn(k, dev());
  auto reducer = std::make_shared<ScalingReducer>(1);
  synced->set_stats_reducer(reducer);
  Tensor g = make_out_grad(k.shape, dev());
  Tensor x32 = make_leaf(data, k.shape, false, dev());
  Tensor y32 = train_step(*plain, x32, g, k.relu);
  Tensor x16 = make_leaf(data, k.shape, false, dev(), DType::BFloat16);
  Tensor y16;
  {
    autocast::Guard cast(dev().type(), DType::BFloat16);
    y16 = synced->forward_relu(x16);
  }
  (y16 * g.to(DType::BFloat16)).sum().backward();
  EXPECT_EQ(y16.dtype(), DType::BFloat16);
  ASSERT_TRUE(x16.grad().defined());
  EXPECT_EQ(x16.grad().dtype(), DType::BFloat16);
  for (DType dt : reducer->dtypes) EXPECT_EQ(dt, DType::Float32) << "the statistics must be reduced in float32";
  expect_close(y16, y32, 1e-2, 1e-2, "output");
  expect_close(synced->running_mean, plain->running_mean, 1e-5, 1e-5, "running_mean (float32 from bf16 input)");
  expect_close(synced->running_var, plain->running_var, 1e-5, 1e-5, "running_var");
  // The input gradient's relative error follows bfloat16's 8 bits (loss weights rounded, gradient rounded).
  expect_close(x16.grad(), x32.grad(), 3e-2, 3e-2, "input gradient");
}

KILN_INSTANTIATE_BACKENDS(SyncBatchNormTest);

// (b) The reducer path's gradients (input, weight, bias) against finite differences, with the identity and the
// doubling reducer, through forward and forward_relu, NCHW and channels-last, BatchNorm1d and 2d.
TEST(SyncBatchNorm, GradcheckInFloat64) {
  struct Case {
    BnCase bn;
    int ranks;
  };
  const std::vector<Case> checks = {
      {{.name = "2d identity", .shape = {3, 2, 2, 2}}, 1},
      {{.name = "2d doubling", .shape = {3, 2, 2, 2}}, 2},
      {{.name = "2d channels-last relu", .shape = {2, 2, 3, 2}, .channels_last = true, .relu = true}, 1},
      {{.name = "1d (N, C, L) doubling relu", .shape = {2, 3, 3}, .relu = true}, 2},
      {{.name = "1d (N, C)", .shape = {5, 2}}, 1},
  };
  for (const Case& c : checks) {
    SCOPED_TRACE(c.bn.name);
    const int64_t ch = c.bn.shape[1];
    auto reducer = std::make_shared<ScalingReducer>(c.ranks);
    auto fn = [&](const TensorList& in) {
      auto bn = make_bn(c.bn, in[0].device(), DType::Float64);
      bn->set_stats_reducer(reducer);
      // BatchNorm normalises with its weight and bias members: pointing them at the checked inputs lets
      // gradcheck perturb them (the registered parameters are not used by this throwaway layer).
      bn->weight = in[1];
      bn->bias = in[2];
      Tensor x = c.bn.channels_last ? contiguous(in[0], MemoryFormat::ChannelsLast) : in[0];
      return TensorList{c.bn.relu ? bn->forward_relu(x) : bn->forward(x)};
    };
    check_gradients(fn, {make_input(c.bn.shape, -2, 2, 3), make_input({ch}, 0.5, 1.5, 4), make_input({ch}, -1, 1, 5)});
  }
}

TEST(SyncBatchNorm, SetStatsReducerAndNullRestoresPlainPath) {
  nn::BatchNorm2d bn(3);
  EXPECT_EQ(bn.stats_reducer(), nullptr);
  auto reducer = std::make_shared<ScalingReducer>(1);
  bn.set_stats_reducer(reducer);
  EXPECT_EQ(bn.stats_reducer(), reducer);
  bn(make(uniform(24, -1, 1), {2, 3, 2, 2}));
  EXPECT_EQ(reducer->calls, 2);
  bn.set_stats_reducer(nullptr);
  bn(make(uniform(24, -1, 1), {2, 3, 2, 2}));
  EXPECT_EQ(reducer->calls, 2);
}

TEST(SyncBatchNorm, BadInputAndBadReducersGiveClearErrors) {
  nn::BatchNorm1d bn(3);
  bn.set_stats_reducer(std::make_shared<ScalingReducer>(1));
  // One process with one value per channel: the variance is undefined, as without a reducer.
  expect_error([&] { bn(zeros({1, 3})); }, {"BatchNorm1d", "more than 1 value per channel", "[1, 3]"});
  // With several processes one sample here is fine: the global batch decides.
  bn.set_stats_reducer(std::make_shared<ScalingReducer>(2));
  EXPECT_NO_THROW(bn(ones({1, 3})));
  bn.set_stats_reducer(std::make_shared<WrongShapeReducer>());
  expect_error([&] { bn(zeros({4, 3})); }, {"BatchNorm1d", "statistics reducer returned", "[1]", "[4]"});
  // The channel check still comes first.
  expect_error([&] { bn(zeros({4, 5})); }, {"BatchNorm1d", "3 channels", "[4, 5]"});
}

// ---------------------------------------------------------------- the real reducer, world size 1

TEST(DistributedFunctional, AllReduceSumAtWorldSizeOneIsACopyWithPassThroughGradient) {
  dist::init();
  ASSERT_EQ(dist::world_size(), 1) << "run this binary without mpirun";
  Tensor base = make({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  Tensor t = base.t();  // (3, 2), a non-contiguous input
  Tensor y = dist::functional::all_reduce_sum(t);
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_FALSE(y.is_same(t));
  expect_values(y, {3, 2}, {1, 4, 2, 5, 3, 6});
  (y * make({1, 2, 3, 4, 5, 6}, {3, 2})).sum().backward();
  expect_values(base.grad(), {2, 3}, {1, 3, 5, 2, 4, 6});  // the loss weights, transposed back
  expect_values(base, {2, 3}, {1, 2, 3, 4, 5, 6});         // the input is not reduced in place
  check_gradients([](const TensorList& in) { return TensorList{dist::functional::all_reduce_sum(in[0])}; },
                  {make_input({4})});
  expect_error([] { dist::functional::all_reduce_sum(ones({2}, {.dtype = DType::Int64})); },
               {"all_reduce_sum", "floating-point", "int64"});
  expect_error([] { dist::functional::all_reduce_sum(Tensor()); }, {"all_reduce_sum", "undefined"});
}

int64_t count_batch_norms(nn::Module& model) {
  int64_t n = 0;
  for (const nn::ModulePtr& m : model.modules()) n += dynamic_cast<nn::BatchNorm*>(m.get()) != nullptr ? 1 : 0;
  return n;
}

// (d) Every BatchNorm of a ResNet-18 is converted: the stem's bn1, two per BasicBlock (8 blocks), and the
// BatchNorm of the three downsampling shortcuts (layer2..4): 1 + 16 + 3 = 20.
TEST(ConvertSyncBatchnorm, ConvertsEveryBatchNormOfResNet18) {
  auto model = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});
  const int64_t expected = count_batch_norms(*model);
  EXPECT_EQ(expected, 20);
  EXPECT_EQ(dist::convert_sync_batchnorm(*model), expected);
  for (const auto& [name, m] : model->named_modules()) {
    if (auto* bn = dynamic_cast<nn::BatchNorm*>(m.get())) {
      EXPECT_NE(bn->stats_reducer(), nullptr) << name << " was not converted";
    }
  }
  EXPECT_NE(model->bn1->stats_reducer(), nullptr);
  // A model without BatchNorm converts nothing.
  nn::Linear fc(2, 3);
  EXPECT_EQ(dist::convert_sync_batchnorm(fc), 0);
}

// The real reducer (the world group, a no-op at world size 1) in a small conv net: the same training step as
// the unconverted net, NCHW and channels-last, BatchNorm2d and BatchNorm1d.
TEST(ConvertSyncBatchnorm, TrainingStepAtWorldSizeOneMatchesUnconvertedModel) {
  dist::init();
  ASSERT_EQ(dist::world_size(), 1) << "run this binary without mpirun";
  for (bool channels_last : {false, true}) {
    SCOPED_TRACE(channels_last ? "channels-last" : "NCHW");
    auto build = [] {
      return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
          std::make_shared<nn::Conv2d>(2, 4, 3, nn::Conv2dOptions{.padding = 1}), std::make_shared<nn::BatchNorm2d>(4),
          std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(4 * 3 * 3, 5),
          std::make_shared<nn::BatchNorm1d>(5)});
    };
    auto plain = build();
    auto synced = build();
    synced->load_state_dict(plain->state_dict());
    ASSERT_EQ(dist::convert_sync_batchnorm(*synced), 2);
    Tensor x = make(uniform(4 * 2 * 3 * 3, -1, 1, 9), {4, 2, 3, 3});
    if (channels_last) x = x.to(MemoryFormat::ChannelsLast);
    Tensor g = make_out_grad({4, 5}, Device::cpu());
    Tensor y0 = (*plain)(x), y1 = (*synced)(x);
    (y0 * g).sum().backward();
    (y1 * g).sum().backward();
    expect_close(y1, y0, 1e-5, 1e-5, "output");
    const auto p0 = plain->named_parameters(), p1 = synced->named_parameters();
    ASSERT_EQ(p0.size(), p1.size());
    for (size_t i = 0; i < p0.size(); ++i)
      expect_close(p1[i].second.grad(), p0[i].second.grad(), 1e-5, 1e-5, p0[i].first);
    const auto b0 = plain->named_buffers(), b1 = synced->named_buffers();
    for (size_t i = 0; i < b0.size(); ++i) expect_close(b1[i].second, b0[i].second, 1e-5, 1e-5, b0[i].first);
  }
}

}  // namespace
}  // namespace kiln::testing
