// tests/distributed/mpi_test_util.h — what the 2-process tests (test_mpi_*.cpp) share.
#pragma once

#include <vector>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

namespace kiln::testing {

// cpu, plus this rank's GPU when every rank of the node has its own (NCCL refuses two ranks on one GPU).
inline std::vector<Device> mpi_devices() {
  std::vector<Device> out = {Device::cpu()};
  const dist::Env& e = dist::init();
  if (cuda::device_count() >= e.local_world_size && e.device().is_cuda()) out.push_back(e.device());
  return out;
}

// The other rank's value of t (2 ranks): all_gather both, keep the other's block.
inline Tensor the_other_ranks(const Tensor& t) {
  Tensor both = internal::empty({2, t.numel()}, {.dtype = t.dtype(), .device = t.device()});
  dist::all_gather(both, t.contiguous());
  return both.select(0, 1 - dist::rank()).view(t.shape());
}

}  // namespace kiln::testing
