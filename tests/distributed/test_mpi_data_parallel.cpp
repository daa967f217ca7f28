// DataParallel across 2 processes (mpirun -np 2): a step on 2 ranks with b samples each gives the parameters
// that one process gets from the combined batch of 2b, on the CPU (MPI, float64) and on each rank's GPU (NCCL,
// float32 without TF32). Also: gradient accumulation with no_sync, unused parameters, GradScaler's skip
// decision, gradient checkpointing with a weight reached twice, many small buckets, mismatched models.
#include <gtest/gtest.h>

#include <cmath>

#include "distributed/mpi_test_util.h"
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

using namespace kiln;
using kiln::testing::expect_error;

namespace {

constexpr int64_t kBatch = 6;  // per rank

struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2, fc3, extra;
  bool checkpointed = false;
  bool reuse_fc2 = false;  // fc2 applied twice (each in its own checkpointed segment when checkpointed)

  explicit Net(bool with_extra = false) : nn::Module("Net") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 16));
    fc3 = register_module("fc3", std::make_shared<nn::Linear>(16, 4));
    if (with_extra) extra = register_module("extra", std::make_shared<nn::Linear>(4, 4));
  }
  Tensor block(const Tensor& h) { return kiln::tanh((*fc2)(h)); }
  Tensor forward(const Tensor& x) override {
    Tensor h = relu((*fc1)(x));
    const int reps = reuse_fc2 ? 2 : 1;
    for (int i = 0; i < reps; ++i) {
      h = checkpointed ? autograd::checkpoint([this](const Tensor& t) { return block(t); }, h) : block(h);
    }
    return (*fc3)(h);
  }
};

class MpiDataParallel : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (dist::world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2";
    if (dev().is_cuda()) {
      tf32_ = cuda::allow_tf32();
      cuda::set_allow_tf32(false);
    }
  }
  void TearDown() override {
    if (dev().is_cuda()) cuda::set_allow_tf32(tf32_);
  }
  Device dev() const { return GetParam(); }
  DType dtype() const { return dev().is_cpu() ? DType::Float64 : DType::Float32; }
  double tol() const { return dev().is_cpu() ? 1e-11 : 2e-5; }
  int rank() const { return dist::rank(); }

  std::shared_ptr<Net> make_net(bool with_extra = false, uint64_t seed = 7) const {
    manual_seed(seed);
    auto net = std::make_shared<Net>(with_extra);
    net->to(dev(), dtype());
    return net;
  }
  // The combined batch (2b rows), the same on both ranks; rank r trains on rows [r b, (r + 1) b).
  std::pair<Tensor, Tensor> batch(uint64_t seed) const {
    Generator gen(seed);
    Tensor x = internal::randn({2 * kBatch, 8}, {.dtype = dtype()}, &gen).to(dev());
    Tensor y = internal::randn({2 * kBatch, 4}, {.dtype = dtype()}, &gen).to(dev());
    return {x, y};
  }
  Tensor shard(const Tensor& t) const { return t.narrow(0, rank() * kBatch, kBatch); }

  void expect_same_parameters(nn::Module& a, nn::Module& b) const {
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      const auto va = kiln::testing::values(pa[i].second), vb = kiln::testing::values(pb[i].second);
      double worst = 0;
      for (size_t k = 0; k < va.size(); ++k) worst = std::max(worst, std::abs(va[k] - vb[k]) / (1 + std::abs(vb[k])));
      EXPECT_LT(worst, tol()) << pa[i].first << " on rank " << rank();
    }
  }

  bool tf32_ = true;
};

TEST_P(MpiDataParallel, TwoRanksMatchOneProcessOnTheCombinedBatch) {
  auto ref = make_net();
  auto net = make_net();
  if (rank() == 1) {  // a different start on rank 1: the constructor's broadcast must undo it
    NoGradGuard g;
    for (Tensor& p : net->parameters()) p.add_(Scalar(1.0));
  }
  dist::DataParallel ddp(net);
  expect_same_parameters(*net, *ref);
  optim::SGD opt_ref(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(100 + step);
    opt_ref.zero_grad();
    nn::mse_loss((*ref)(x), y).backward();
    opt_ref.step();
    opt.zero_grad();
    nn::mse_loss(ddp(shard(x)), shard(y)).backward();
    opt.step();
  }
  expect_same_parameters(*net, *ref);
}

TEST_P(MpiDataParallel, ManySmallBucketsGiveTheSameResult) {
  auto ref = make_net();
  auto net = make_net();
  dist::DataParallel ddp(net, {.bucket_mb = 1e-4});  // 104 bytes: one parameter per bucket
  EXPECT_EQ(ddp.bucket_layout().size(), net->parameters().size());
  EXPECT_EQ(ddp.bucket_layout().front().front(), net->parameters().size() - 1);  // the last parameter first
  dist::DataParallel one(make_net(), {.bucket_mb = 100});
  EXPECT_EQ(one.bucket_layout().size(), 1u);
  auto [x, y] = batch(5);
  nn::mse_loss((*ref)(x), y).backward();
  nn::mse_loss(ddp(shard(x)), shard(y)).backward();
  const auto pr = ref->parameters(), pn = net->parameters();
  for (size_t i = 0; i < pr.size(); ++i) {
    kiln::testing::expect_values(pn[i].grad(), pr[i].shape(), kiln::testing::values(pr[i].grad()), tol(), tol());
  }
}

TEST_P(MpiDataParallel, NoSyncAccumulatesLocallyThenAverages) {
  auto ref = make_net();
  auto net = make_net();
  dist::DataParallel ddp(net);
  auto [x, y] = batch(11);
  nn::mse_loss((*ref)(x), y).backward();
  // Two micro-batches of b/2 per rank: the first stays local, the second's backward averages the sum.
  const Tensor xs = shard(x), ys = shard(y);
  {
    auto guard = ddp.no_sync();
    (nn::mse_loss(ddp(xs.narrow(0, 0, kBatch / 2)), ys.narrow(0, 0, kBatch / 2)) * Scalar(0.5)).backward();
  }
  // Between the two, rank 0's and rank 1's gradients differ (nothing was exchanged).
  Tensor g = net->fc1->weight.grad().clone();
  Tensor other = kiln::testing::the_other_ranks(g);
  EXPECT_GT((g - other).abs().max().item<double>(), 1e-6);
  (nn::mse_loss(ddp(xs.narrow(0, kBatch / 2, kBatch / 2)), ys.narrow(0, kBatch / 2, kBatch / 2)) * Scalar(0.5))
      .backward();
  const auto pr = ref->parameters(), pn = net->parameters();
  for (size_t i = 0; i < pr.size(); ++i) {
    kiln::testing::expect_values(pn[i].grad(), pr[i].shape(), kiln::testing::values(pr[i].grad()), tol(), tol());
  }
}

TEST_P(MpiDataParallel, UnusedParameterIsAnErrorNamingItUnlessDeclared) {
  auto [x, y] = batch(3);
  {
    auto net = make_net(/*with_extra=*/true);
    dist::DataParallel ddp(net);
    expect_error([&] { nn::mse_loss(ddp(shard(x)), shard(y)).backward(); },
                 {"rank " + std::to_string(rank()), "extra.weight", "extra.bias", "find_unused_parameters"});
  }
  auto ref = make_net(true);
  auto net = make_net(true);
  dist::DataParallel ddp(net, {.find_unused_parameters = true});
  nn::mse_loss((*ref)(x), y).backward();
  nn::mse_loss(ddp(shard(x)), shard(y)).backward();
  kiln::testing::expect_values(net->fc1->weight.grad(), {16, 8}, kiln::testing::values(ref->fc1->weight.grad()), tol(),
                               tol());
  ASSERT_TRUE(net->extra->weight.grad().defined());
  EXPECT_EQ(net->extra->weight.grad().abs().sum().item<double>(), 0.0);  // unused everywhere: zero
  // The next step works normally.
  net->zero_grad();
  nn::mse_loss(ddp(shard(x)), shard(y)).backward();
  kiln::testing::expect_values(net->fc1->weight.grad(), {16, 8}, kiln::testing::values(ref->fc1->weight.grad()), tol(),
                               tol());
}

TEST_P(MpiDataParallel, CheckpointedSegmentsWithAReusedWeight) {
  auto ref = make_net();
  ref->reuse_fc2 = true;
  auto net = make_net();
  net->checkpointed = true;
  net->reuse_fc2 = true;  // fc2's gradient is accumulated in two nested backwards: its bucket is sent again
  dist::DataParallel ddp(net, {.bucket_mb = 1e-4});
  for (int step = 0; step < 2; ++step) {
    auto [x, y] = batch(20 + step);
    ref->zero_grad();
    net->zero_grad();
    nn::mse_loss((*ref)(x), y).backward();
    nn::mse_loss(ddp(shard(x)), shard(y)).backward();
    const auto pr = ref->named_parameters(), pn = net->named_parameters();
    for (size_t i = 0; i < pr.size(); ++i) {
      SCOPED_TRACE(pr[i].first);
      kiln::testing::expect_values(pn[i].second.grad(), pr[i].second.shape(),
                                   kiln::testing::values(pr[i].second.grad()), tol(), tol());
    }
  }
}

TEST_P(MpiDataParallel, GradScalerSkipsOnEveryRankWhenOneOverflows) {
  auto net = make_net();
  dist::DataParallel ddp(net);
  optim::SGD opt(net->parameters(), {.lr = 0.1});
  amp::GradScaler scaler({.init_scale = 1024.0});
  auto [x, y] = batch(9);
  Tensor xs = shard(x).clone();
  if (rank() == 1) {  // only rank 1 overflows
    NoGradGuard g;
    xs.narrow(0, 0, 1).fill_(Scalar(std::numeric_limits<double>::infinity()));
  }
  std::vector<Tensor> before;
  for (const Tensor& p : net->parameters()) before.push_back(p.detach().clone());
  scaler.scale(nn::mse_loss(ddp(xs), shard(y))).backward();
  scaler.step(opt);
  scaler.update();
  const auto after = net->parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(kiln::testing::values(after[i]), kiln::testing::values(before[i])) << "rank " << rank();
  }
  EXPECT_EQ(scaler.get_scale(), 512.0);
  // A clean step then updates on both ranks, by the same amount.
  opt.zero_grad();
  scaler.scale(nn::mse_loss(ddp(shard(x)), shard(y))).backward();
  scaler.step(opt);
  scaler.update();
  Tensor w = net->fc1->weight.detach().clone();
  Tensor w_other = kiln::testing::the_other_ranks(w);
  EXPECT_EQ(kiln::testing::values(w), kiln::testing::values(w_other));
  EXPECT_NE(kiln::testing::values(w), kiln::testing::values(before[0]));
}

TEST_P(MpiDataParallel, DifferentModelsOnTheRanksAreRefused) {
  auto net = make_net(/*with_extra=*/rank() == 1);
  expect_error([&] { dist::DataParallel ddp(net); }, {"DataParallel", "disagree", "same model"});
}

INSTANTIATE_TEST_SUITE_P(Devices, MpiDataParallel, ::testing::ValuesIn(kiln::testing::mpi_devices()),
                         kiln::testing::device_param_name);

}  // namespace
