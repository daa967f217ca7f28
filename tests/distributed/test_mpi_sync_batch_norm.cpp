// SyncBatchNorm across 2 processes (mpirun -np 2): each rank holds its part of a batch; every rank also computes
// the whole batch with plain BatchNorm in-process as the reference, and its SyncBatchNorm results must equal
// that reference's share: the output rows and input-gradient rows of its samples, the running statistics, and
// (summed over ranks) the weight and bias gradients. The loss sum(y * g) with fixed g is a sum over samples,
// so the global loss's gradient is the sum of the ranks' gradients and the comparison is exact up to rounding.
// Also an uneven split (3 samples and 1), and a DataParallel step of a converted conv net against one process.
// CPU through the MPI group (MpiSyncBatchNorm); each rank's GPU through NCCL (CudaMpiSyncBatchNorm).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kiln/distributed/data_parallel.h"    // dist::DataParallel
#include "kiln/distributed/environment.h"      // dist::init
#include "kiln/distributed/process_group.h"    // dist::all_reduce
#include "kiln/distributed/sync_batch_norm.h"  // dist::convert_sync_batchnorm
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"  // cuda::device_count, TF32 off for the comparisons
#include "support/test_support.h"
#include "sync_batch_norm_support.h"

namespace kiln::testing {
namespace {

// Rows [begin, begin + count) of row-major data of `shape`.
std::vector<double> rows(const std::vector<double>& data, const Shape& shape, int64_t begin, int64_t count) {
  const int64_t row = numel_of(shape) / shape[0];
  return {data.begin() + begin * row, data.begin() + (begin + count) * row};
}

// The samples of each rank: `split[r]` rows for rank r, in rank order.
struct Split {
  int64_t begin, count;
};
Split my_rows(const std::vector<int64_t>& split) {
  int64_t begin = 0;
  for (int r = 0; r < dist::rank(); ++r) begin += split[static_cast<size_t>(r)];
  return {begin, split[static_cast<size_t>(dist::rank())]};
}

// Sum over ranks of a gradient (a copy: the layer's own gradient stays as backward left it).
Tensor summed_over_ranks(const Tensor& g) {
  Tensor s = contiguous(g.detach()).clone();
  dist::all_reduce(s, dist::ReduceOp::Sum);
  return s;
}

// Whether this job can run the CUDA variant: every rank has its own GPU (NCCL refuses two ranks on one).
bool each_rank_has_a_gpu() {
  const dist::Env& e = dist::init();
  return cuda::device_count() >= e.local_world_size && e.device().is_cuda();
}

// Float32 matrix products in full float32 on the GPU for the test (the reference and SyncBatchNorm then differ
// by summation order only).
class NoTf32 {
 public:
  explicit NoTf32(Device dev) : on_(dev.is_cuda()) {
    if (on_) {
      previous_ = cuda::allow_tf32();
      cuda::set_allow_tf32(false);
    }
  }
  ~NoTf32() {
    if (on_) cuda::set_allow_tf32(previous_);
  }
  NoTf32(const NoTf32&) = delete;
  NoTf32& operator=(const NoTf32&) = delete;

 private:
  bool on_;
  bool previous_ = true;
};

struct SplitCase {
  BnCase bn;                   // shape: the whole batch
  std::vector<int64_t> split;  // samples per rank
};

// Two training steps of SyncBatchNorm on this rank's rows against plain BatchNorm on the whole batch.
void check_two_ranks_match_full_batch(Device dev, double rtol, double atol) {
  const std::vector<SplitCase> cases = {
      {{.name = "2d NCHW", .shape = {4, 3, 5, 5}}, {2, 2}},
      {{.name = "2d channels-last", .shape = {4, 3, 5, 5}, .channels_last = true}, {2, 2}},
      {{.name = "2d forward_relu", .shape = {4, 3, 5, 5}, .relu = true}, {2, 2}},
      {{.name = "2d channels-last forward_relu", .shape = {2, 5, 3, 4}, .channels_last = true, .relu = true}, {1, 1}},
      {{.name = "2d uneven split", .shape = {4, 3, 2, 3}}, {3, 1}},
      {{.name = "1d (N, C), one sample per rank", .shape = {2, 4}}, {1, 1}},
      {{.name = "1d (N, C, L)", .shape = {6, 3, 4}}, {3, 3}},
      {{.name = "no affine, no running stats", .shape = {4, 3, 2, 2}, .affine = false, .track_running_stats = false},
       {2, 2}},
  };
  for (const SplitCase& k : cases) {
    SCOPED_TRACE(k.bn.name + " on rank " + std::to_string(dist::rank()));
    const Shape& full = k.bn.shape;
    const Split mine = my_rows(k.split);
    Shape local = full;
    local[0] = mine.count;
    auto plain = make_bn(k.bn, dev);
    auto synced = make_bn(k.bn, dev);
    ASSERT_EQ(dist::convert_sync_batchnorm(*synced), 1);
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      // Every rank draws the same whole batch and loss weights, then takes its rows.
      const auto data = uniform(numel_of(full), -2 + step, 2 + 2 * step, 100 + step);
      const auto gdata = uniform(numel_of(full), -1, 1, 200 + step);
      plain->zero_grad();
      synced->zero_grad();
      Tensor x_full = make_leaf(data, full, k.bn.channels_last, dev);
      Tensor g_full = make(gdata, full, {.device = dev});
      Tensor y_full = train_step(*plain, x_full, g_full, k.bn.relu);
      Tensor x = make_leaf(rows(data, full, mine.begin, mine.count), local, k.bn.channels_last, dev);
      Tensor g = make(rows(gdata, full, mine.begin, mine.count), local, {.device = dev});
      Tensor y = train_step(*synced, x, g, k.bn.relu);
      expect_close(y, narrow(y_full, 0, mine.begin, mine.count), rtol, atol, "output rows of this rank");
      expect_close(x.grad(), narrow(x_full.grad(), 0, mine.begin, mine.count), rtol, atol,
                   "input-gradient rows of this rank");
      if (k.bn.affine) {
        expect_close(summed_over_ranks(synced->weight.grad()), plain->weight.grad(), rtol, atol,
                     "weight gradient summed over ranks");
        expect_close(summed_over_ranks(synced->bias.grad()), plain->bias.grad(), rtol, atol,
                     "bias gradient summed over ranks");
      }
      if (k.bn.track_running_stats) {
        expect_close(synced->running_mean, plain->running_mean, rtol, atol, "running_mean");
        expect_close(synced->running_var, plain->running_var, rtol, atol, "running_var");
      }
    }
  }
}

// conv -> BatchNorm2d -> ReLU -> flatten -> linear -> BatchNorm1d, the same parameters on every rank and in the
// reference (one seed).
std::shared_ptr<nn::Sequential> make_net(Device dev) {
  manual_seed(5);
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Conv2d>(2, 4, 3, nn::Conv2dOptions{.padding = 1}), std::make_shared<nn::BatchNorm2d>(4),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(4 * 3 * 3, 5),
      std::make_shared<nn::BatchNorm1d>(5)});
  net->to(dev);
  return net;
}

// A DataParallel step of a converted net (loss: the mean over this rank's samples) gives the averaged gradients
// and running statistics of one process on the whole batch (loss: the mean over all samples). DataParallel's
// gradient all-reduces and SyncBatchNorm's backward all-reduces share one group in one backward.
void check_data_parallel_step(Device dev, double rtol, double atol) {
  const int64_t b = 3;  // per rank
  const Shape full{2 * b, 2, 3, 3};
  const auto data = uniform(numel_of(full), -1, 1, 9);
  const auto gdata = uniform(2 * b * 5, -1, 1, 10);
  auto reference = make_net(dev);
  Tensor x_full = make(data, full, {.device = dev}).to(MemoryFormat::ChannelsLast);
  Tensor g_full = make(gdata, {2 * b, 5}, {.device = dev});
  (((*reference)(x_full)*g_full).sum() / (2.0 * static_cast<double>(b))).backward();

  auto net = make_net(dev);
  ASSERT_EQ(dist::convert_sync_batchnorm(*net), 2);
  dist::DataParallel ddp(net);
  Shape local = full;
  local[0] = b;
  Tensor x = make(rows(data, full, b * dist::rank(), b), local, {.device = dev}).to(MemoryFormat::ChannelsLast);
  Tensor g = make(rows(gdata, {2 * b, 5}, b * dist::rank(), b), {b, 5}, {.device = dev});
  ((ddp(x) * g).sum() / static_cast<double>(b)).backward();

  const auto p0 = reference->named_parameters(), p1 = net->named_parameters();
  ASSERT_EQ(p0.size(), p1.size());
  for (size_t i = 0; i < p0.size(); ++i) {
    expect_close(p1[i].second.grad(), p0[i].second.grad(), rtol, atol, "gradient of " + p0[i].first);
  }
  const auto b0 = reference->named_buffers(), b1 = net->named_buffers();
  for (size_t i = 0; i < b0.size(); ++i) expect_close(b1[i].second, b0[i].second, rtol, atol, b0[i].first);
}

TEST(MpiSyncBatchNorm, TwoRanksMatchOneProcessOnTheWholeBatch) {
  if (dist::init().world_size != 2) GTEST_SKIP() << "run under mpirun -np 2";
  check_two_ranks_match_full_batch(Device::cpu(), 1e-5, 1e-5);
}

TEST(MpiSyncBatchNorm, DataParallelStepMatchesOneProcessOnTheWholeBatch) {
  if (dist::init().world_size != 2) GTEST_SKIP() << "run under mpirun -np 2";
  check_data_parallel_step(Device::cpu(), 1e-5, 1e-5);
}

TEST(CudaMpiSyncBatchNorm, TwoRanksMatchOneProcessOnTheWholeBatch) {
  if (dist::init().world_size != 2) GTEST_SKIP() << "run under mpirun -np 2";
  if (!each_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  const Device dev = Device::cuda(dist::env().local_rank);
  NoTf32 exact(dev);
  // The reference runs kiln's fused kernels, SyncBatchNorm composed ops: summation orders differ.
  check_two_ranks_match_full_batch(dev, 1e-4, 2e-5);
}

TEST(CudaMpiSyncBatchNorm, DataParallelStepMatchesOneProcessOnTheWholeBatch) {
  if (dist::init().world_size != 2) GTEST_SKIP() << "run under mpirun -np 2";
  if (!each_rank_has_a_gpu()) GTEST_SKIP() << "needs one GPU per rank";
  const Device dev = Device::cuda(dist::env().local_rank);
  NoTf32 exact(dev);
  check_data_parallel_step(dev, 1e-4, 2e-5);
}

}  // namespace
}  // namespace kiln::testing
