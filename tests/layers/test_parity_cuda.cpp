// Training parity with PyTorch on a GPU, in the benchmarked configuration (bench/bench_train): bf16 autocast,
// the ResNets channels-last, cuDNN benchmark mode, every fused path kiln has on by default (batch norm + add +
// ReLU, convolutions' input gradients added into the residual sums by the backward-data pass, autocast's up-front
// weight casts, the fused optimizer updates), eagerly and with steps 2..20 replayed from a cuda::Graph. The same
// cases as test_parity.cpp (20 steps from the formula's weights on the formula's batches), against PyTorch's bf16
// run on the GPU (parity_<case>_cuda_bf16.golden, made on the GPU machine by
// `python3 tests/golden/make_golden_parity.py tests/golden/data --device cuda --bf16`), and the replayed run
// against the eager one. Without a GPU the tests skip; with one, a missing golden file fails them.
//
// The tolerances. bf16 keeps 8 significant bits: one rounding is off by up to 2^-9 (0.2%) relatively, and training
// carries such differences forward as it does float32's, only from a 65536 times larger start. Two bf16
// implementations round different intermediates (which ops autocast runs in bf16, where partial sums stay float32,
// fused kernels that skip a rounding), so they differ by up to about twice one bf16 run's distance from float32.
// That distance was measured with PyTorch on the CPU (make_golden_parity.py --bf16: CPU autocast bf16, the same
// cases, against the float32 goldens):
//                    loss steps 1-10   loss all steps   first-step gradients   change over 20 steps (whole model)
//   ResNet-18 CIFAR  6.8e-4            8.5e-4           4.0e-2                 2.2e-3
//   ResNet-50        2.0e-2            4.3e-2           9.6e-2                 4.6e-2
//   BERT MLM         1.9e-4            2.0e-4           5.0e-3                 5.7e-3
// (ResNet-50 at batch 4 is the least stable: BatchNorm over 16 values per channel in its last stage.) The bounds are
// 3 to 10 times those (more for BERT, whose attention runs through different fused kernels on a GPU: cuDNN's in
// kiln, PyTorch's own scaled_dot_product_attention backends). Single tensors are not bounded in bf16: the gradient of a
// BatchNorm bias, a sum of many terms that nearly cancel, is off by its whole size in PyTorch's own bf16 run. Graph
// replays run the eager step's kernels with its plans; where they are not bit for bit the eager steps (atomic additions
// in a library kernel), a difference in one rounding grows as any other: they are held to the same bounds, and the
// figures printed show how close they are.
#include <gtest/gtest.h>

#include <cstdio>

#include "kiln/layers/cuda/conv_cudnn_graph.h"  // nn::cuda_impl::conv2d_graph_accumulations_run
#include "kiln/tensor/cuda.h"
#include "support/golden.h"
#include "support/parity.h"
#include "support/test_support.h"

// The CUDA layer internals these tests call (nn::cuda_impl) exist only in a CUDA build.
#if KILN_TEST_CUDA
namespace kiln::testing {
namespace {

using parity::Case;

struct Tolerance {
  double loss_early, loss, grad1, delta;  // steps 1-10, all steps; whole-model first-step gradients and changes
};
Tolerance bf16_tolerance(Case c) {
  switch (c) {
    case Case::ResNet18Cifar: return {3e-3, 4e-3, 0.15, 1e-2};
    case Case::ResNet50: return {8e-2, 0.2, 0.4, 0.2};
    case Case::BertMaskedLM: return {2e-3, 2e-3, 3e-2, 3e-2};
  }
  return {};
}

// The per-tensor figures printed use a floor of 3% of the largest tensor's rms (bf16's noise level).
constexpr double kNoiseFloor = 3e-2;

class ParityCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
    benchmark_ = nn::cudnn_benchmark();
    nn::set_cudnn_benchmark(true);  // as bench_train
  }
  void TearDown() override {
    if (cuda::is_available()) nn::set_cudnn_benchmark(benchmark_);
  }

 private:
  bool benchmark_ = false;
};

void expect_within(const parity::Report& r, const Tolerance& tol, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_LE(r.loss_early.error, tol.loss_early) << "loss at " << r.loss_early.where;
  EXPECT_LE(r.loss.error, tol.loss) << "loss at " << r.loss.where;
  EXPECT_LE(r.grad1_global, tol.grad1) << "first-step gradients (worst tensor: " << r.grad1.where << ")";
  EXPECT_LE(r.delta_global, tol.delta) << "changes over the steps (worst tensor: " << r.delta.where << ")";
}

void check_parity(Case c) {
  const Golden g = parity::load_parity_golden(c, "cuda_bf16");
  const std::string name = parity::case_name(c);
  const Device gpu = Device::cuda(0);
  const int64_t accumulations = nn::cuda_impl::conv2d_graph_accumulations_run();
  const parity::Run eager = parity::train(c, {.device = gpu, .bf16 = true});
  // ResNet-18's basic blocks add a convolution's input gradient into the block input's gradient sum inside the
  // backward-data graph (the shortcut's 1x1 stride-2 convolution and the 3x3 stride-1 ones). ResNet-50 took no
  // such path on an H200 (the count did not move over its 20 steps): each bottleneck input feeds a 1x1 stride-1
  // convolution, which runs as a matrix product, and the engine offers the sum to the node that reaches it last.
  if (c == Case::ResNet18Cifar && nn::cuda_impl::conv2d_graph_api_compiled()) {
    EXPECT_GT(nn::cuda_impl::conv2d_graph_accumulations_run(), accumulations)
        << "no convolution input gradient was added into a residual sum by the backward-data pass";
  }
  const parity::Run graphed = parity::train(c, {.device = gpu, .bf16 = true, .graph = true});
  const parity::Report eager_vs_torch = parity::compare(eager, g, kNoiseFloor);
  const parity::Report graph_vs_torch = parity::compare(graphed, g, kNoiseFloor);
  const parity::Report graph_vs_eager = parity::compare(graphed, eager, kNoiseFloor);
  std::printf("%s\n%s\n%s\n", eager_vs_torch.summary(name + " cuda bf16 eager against PyTorch").c_str(),
              graph_vs_torch.summary(name + " cuda bf16 graph replay against PyTorch").c_str(),
              graph_vs_eager.summary(name + " cuda bf16 graph replay against kiln eager").c_str());
  const Tolerance tol = bf16_tolerance(c);
  expect_within(eager_vs_torch, tol, "eager against PyTorch");
  expect_within(graph_vs_torch, tol, "graph replay against PyTorch");
  expect_within(graph_vs_eager, tol, "graph replay against eager");
}

TEST_F(ParityCuda, ResNet18CifarSgdBf16ChannelsLastTracksPyTorch) { check_parity(Case::ResNet18Cifar); }
TEST_F(ParityCuda, ResNet50SgdBf16ChannelsLastTracksPyTorch) { check_parity(Case::ResNet50); }
TEST_F(ParityCuda, BertMaskedLMAdamWBf16TracksPyTorch) { check_parity(Case::BertMaskedLM); }

}  // namespace
}  // namespace kiln::testing

#else
TEST(ParityCuda, NeedsACudaBuild) { GTEST_SKIP() << "kiln was built without CUDA (KILN_CUDA=OFF)"; }
#endif
