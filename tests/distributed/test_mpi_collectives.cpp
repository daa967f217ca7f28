// Collectives across 2 processes (run under `mpirun -np 2` by CTest: distributed.mpi_np2): CPU tensors through
// the MPI group, CUDA tensors through NCCL where every rank has its own GPU. Expected values are computed by
// hand from what each rank contributed.
#include <gtest/gtest.h>

#include <cmath>

#include "distributed/mpi_test_util.h"
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

using namespace kiln;
using kiln::testing::expect_error;

namespace {

class MpiCollectives : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (dist::world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2";
  }
  Device dev() const { return GetParam(); }
  int rank() const { return dist::rank(); }
  std::vector<double> get(const Tensor& t) const { return kiln::testing::values(t); }
};

// (rank + 1) * (i + 1): rank 0 holds 1, 2, 3, ..., rank 1 holds 2, 4, 6, ...
Tensor ramp(int64_t n, int rank, DType dtype, Device dev) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (rank + 1.0) * (i + 1.0);
  return kiln::testing::make(v, {n}, {.dtype = dtype, .device = dev});
}

TEST_P(MpiCollectives, AllReduceEveryOpAndDtype) {
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int64, DType::Int32}) {
    for (dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Average, dist::ReduceOp::Max, dist::ReduceOp::Min}) {
      if (op == dist::ReduceOp::Average && !is_floating_point(dt) && dev().is_cpu()) continue;  // refused, below
      if (op == dist::ReduceOp::Average && !is_floating_point(dt)) continue;
      Tensor t = ramp(5, rank(), dt, dev());
      dist::all_reduce(t, op);
      for (int64_t i = 0; i < 5; ++i) {
        const double a = i + 1.0, b = 2.0 * (i + 1.0);
        const double want = op == dist::ReduceOp::Sum       ? a + b
                            : op == dist::ReduceOp::Average ? (a + b) / 2
                            : op == dist::ReduceOp::Max     ? b
                                                            : a;
        EXPECT_EQ(get(t)[static_cast<size_t>(i)], want) << dtype_name(dt) << " " << dist::to_string(op) << " i=" << i;
      }
    }
  }
}

TEST_P(MpiCollectives, LargeAllReduceSumsExactly) {
  // 3M elements: several MPI/NCCL chunks. Values are small integers, so float32 sums are exact.
  const int64_t n = 3 << 20;
  Tensor t = internal::full({n}, rank() + 1.0, {.device = dev()});
  dist::all_reduce(t);
  EXPECT_EQ(t.sum().item<double>(), 3.0 * n);
}

TEST_P(MpiCollectives, BroadcastFromEitherRoot) {
  for (int root : {0, 1}) {
    Tensor t = ramp(4, rank(), DType::Float32, dev());
    dist::broadcast(t, root);
    EXPECT_EQ(get(t), get(ramp(4, root, DType::Float32, Device::cpu())));
  }
  Tensor b = ramp(3, rank(), DType::BFloat16, dev());
  dist::broadcast(b, 1);
  EXPECT_EQ(get(b), (std::vector<double>{2, 4, 6}));
  expect_error([&] { dist::broadcast(b, 2); }, {"root 2", "not a rank"});
}

TEST_P(MpiCollectives, AllGatherAndReduceScatter) {
  Tensor in = ramp(3, rank(), DType::Float32, dev());
  Tensor out = internal::zeros({2, 3}, {.device = dev()});
  dist::all_gather(out, in);
  EXPECT_EQ(get(out), (std::vector<double>{1, 2, 3, 2, 4, 6}));

  Tensor big = ramp(4, rank(), DType::Float64, dev());  // blocks of 2: rank 0 gets elements 0-1 summed
  Tensor mine = internal::zeros({2}, {.dtype = DType::Float64, .device = dev()});
  dist::reduce_scatter(mine, big, dist::ReduceOp::Sum);
  EXPECT_EQ(get(mine), rank() == 0 ? (std::vector<double>{3, 6}) : (std::vector<double>{9, 12}));
  dist::reduce_scatter(mine, big, dist::ReduceOp::Average);
  EXPECT_EQ(get(mine), rank() == 0 ? (std::vector<double>{1.5, 3}) : (std::vector<double>{4.5, 6}));

  Tensor wrong = internal::zeros({5}, {.device = dev()});
  expect_error([&] { dist::all_gather(wrong, in); }, {"all_gather", "5", "world size 2"});
}

TEST_P(MpiCollectives, AsyncWorkCompletes) {
  Tensor a = ramp(1000, rank(), DType::Float32, dev());
  Tensor b = ramp(10, rank(), DType::Float32, dev());
  auto& g = dist::group(dev());
  const uint64_t seq = g.sequence_number();
  auto wa = g.all_reduce_async(a, dist::ReduceOp::Sum);
  auto wb = g.all_reduce_async(b, dist::ReduceOp::Max);
  EXPECT_EQ(g.sequence_number(), seq + 2);
  wa->wait();
  wb->wait();
  a.add_(Scalar(1.0));  // queued after the collective on the current stream (GPU), or plain (CPU)
  wa->synchronize();
  EXPECT_TRUE(wa->is_completed());
  EXPECT_EQ(get(a)[999], 3000.0 + 1);
  EXPECT_EQ(get(b)[9], 20.0);
}

TEST_P(MpiCollectives, BadTensorsAreRefusedWithTheReason) {
  Tensor t = internal::zeros({4, 4}, {.device = dev()}).transpose(0, 1);
  expect_error([&] { dist::group(dev()).all_reduce(t); }, {"all_reduce", "not contiguous", "contiguous()"});
  expect_error([&] { dist::group(dev()).all_reduce(Tensor()); }, {"undefined"});
  Tensor f8 = internal::zeros({4}, {.dtype = DType::Float8_e4m3fn, .device = dev()});
  expect_error([&] { dist::all_reduce(f8); }, {"all_reduce", "float8_e4m3fn", "not supported", "cast to"});
  if (dev().is_cpu()) {
    Tensor i = internal::zeros({2}, {.dtype = DType::Int64});
    expect_error([&] { dist::all_reduce(i, dist::ReduceOp::Average); }, {"Average", "int64"});
    if (cuda::device_count() > 0) {
      Tensor g = internal::zeros({2}, {.device = Device::cuda(0)});
      expect_error([&] { dist::group(Device::cpu()).all_reduce(g); }, {"cuda:0", "mpi"});
    }
  }
  // Every rank refused the same calls locally, so the ranks are still in step.
  dist::barrier();
}

INSTANTIATE_TEST_SUITE_P(Devices, MpiCollectives, ::testing::ValuesIn(kiln::testing::mpi_devices()),
                         kiln::testing::device_param_name);

TEST(MpiEnvironment, LauncherAndBootstrap) {
  const dist::Env& e = dist::init();
  if (e.world_size != 2) GTEST_SKIP() << "run under mpirun -np 2";
  EXPECT_EQ(e.launcher, "Open MPI");
  EXPECT_EQ(e.bootstrap, "mpi");
  EXPECT_LT(e.rank, 2);
  EXPECT_EQ(&dist::init(), &e);  // idempotent
  // Every rank sees the other's rank: the sum of ranks is 0 + 1.
  Tensor r = internal::full({1}, static_cast<double>(e.rank), {.dtype = DType::Int64});
  dist::all_reduce(r);
  EXPECT_EQ(r.item<int64_t>(), 1);
}

}  // namespace
