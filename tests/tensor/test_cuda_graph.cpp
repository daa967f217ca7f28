// cuda::Graph: capture, replay on new inputs, the capture's private memory, and the errors of steps that
// cannot be captured. References are plain eager runs of the same ops and hand-derived values.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_error;

class CudaGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  }
  const Device gpu = Device::cuda(0);
  Tensor values(const std::vector<float>& v) const {
    return internal::from_vector<float>(v, {static_cast<int64_t>(v.size())}, gpu);
  }
};

TEST(CudaGraphWithoutGpu, CaptureSaysWhy) {
  if (cuda::is_available()) GTEST_SKIP() << "a GPU is visible";
  cuda::Graph graph;
  EXPECT_FALSE(graph.captured());
  EXPECT_FALSE(cuda::Graph::capturing());
  EXPECT_THROW(graph.capture([] {}), Error);
}

TEST_F(CudaGraph, ReplaysRecomputeFromTheInputsCurrentValues) {
  Tensor x = values({1, 2, 3});
  Tensor y;
  int host_runs = 0;
  cuda::Graph graph;
  graph.capture(
      [&] {
        ++host_runs;
        y = internal::add(internal::mul(x, 2.0),
                          internal::exp(internal::zeros_like(x)));  // 2x + 1, through temporaries
      },
      /*warmup=*/2);
  EXPECT_TRUE(graph.captured());
  EXPECT_EQ(host_runs, 3);  // two warm-up runs and the captured one; replays run no host code
  x.copy_(internal::from_vector<float>({10, 20, 30}, {3}));
  graph.replay();
  EXPECT_EQ(y.cpu().to_vector<float>(), (std::vector<float>{21, 41, 61}));
  x.fill_(-1);
  graph.replay();
  graph.replay();
  EXPECT_EQ(y.cpu().to_vector<float>(), (std::vector<float>{-1, -1, -1}));
  EXPECT_EQ(host_runs, 3);
}

TEST_F(CudaGraph, ReplayIsOrderedWithTheCurrentStream) {
  // A large input rewritten on the legacy default stream right before each replay: the replay must see it.
  const int64_t n = int64_t{1} << 22;
  Tensor x = internal::zeros({n}, {.device = gpu});
  Tensor total;
  cuda::Graph graph;
  graph.capture([&] { total = internal::sum(x); }, 1);
  for (int k = 1; k <= 3; ++k) {
    x.fill_(static_cast<double>(k));
    graph.replay();
    EXPECT_EQ(total.item<float>(), static_cast<float>(k * n)) << "replay " << k;
  }
}

TEST_F(CudaGraph, TheCapturesMemoryIsReusedByEveryReplay) {
  Tensor x = internal::ones({1 << 20}, {.device = gpu});
  Tensor y;
  cuda::Graph graph;
  graph.capture([&] { y = internal::mul(internal::add(x, 1.0), internal::add(x, 2.0)); });
  cuda::synchronize();
  const cuda::MemoryStats before = cuda::memory_stats();
  for (int i = 0; i < 20; ++i) graph.replay();
  cuda::synchronize();
  const cuda::MemoryStats after = cuda::memory_stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.num_device_mallocs, before.num_device_mallocs);
  EXPECT_EQ(y.cpu().to_vector<float>()[7], 6.f);
}

TEST_F(CudaGraph, TheGraphsMemoryIsNotHandedOutWhileItLives) {
  // A temporary of the capture is freed inside it; an allocation after the capture must not get its memory,
  // or a replay would overwrite that tensor.
  Tensor x = internal::full({1 << 18}, 3.0, {.device = gpu});
  Tensor y;
  cuda::Graph graph;
  graph.capture([&] {
    Tensor t = internal::mul(x, 2.0);  // freed at the end of the lambda
    y = internal::add(t, 1.0);
  });
  Tensor other = internal::full({1 << 18}, 5.0, {.device = gpu});  // same size as the freed temporary
  graph.replay();
  EXPECT_EQ(other.cpu().to_vector<float>()[123], 5.f);
  EXPECT_EQ(y.cpu().to_vector<float>()[123], 7.f);
}

TEST_F(CudaGraph, DestroyingTheGraphGivesItsMemoryBack) {
  Tensor x = internal::ones({1 << 22}, {.device = gpu});  // 16 MiB
  cuda::synchronize();
  const int64_t reserved_before = cuda::memory_stats().reserved_bytes;
  {
    cuda::Graph graph;
    graph.capture([&] { (void)internal::mul(internal::add(x, 1.0), 3.0); }, 0);  // temporaries only
    graph.replay();
    EXPECT_GT(cuda::memory_stats().reserved_bytes, reserved_before);
  }
  EXPECT_EQ(cuda::memory_stats().reserved_bytes, reserved_before);
}

TEST_F(CudaGraph, AStepThatSynchronisesCannotBeCapturedAndLeavesNoTrace) {
  Tensor x = values({1, 2});
  cuda::Graph graph;
  expect_error([&] { graph.capture([&] { (void)internal::add(x, 1.0).cpu(); }, 0); },
               {"Graph::capture", "captured", "synchronise"});
  EXPECT_FALSE(graph.captured());
  EXPECT_FALSE(cuda::Graph::capturing());
  // Eager work goes on, and the graph can capture a proper step after all.
  EXPECT_EQ(internal::add(x, 1.0).cpu().to_vector<float>(), (std::vector<float>{2, 3}));
  Tensor y;
  graph.capture([&] { y = internal::add(x, 1.0); }, 0);
  graph.replay();
  EXPECT_EQ(y.cpu().to_vector<float>(), (std::vector<float>{2, 3}));
}

TEST_F(CudaGraph, RandomOpsDrawNewNumbersOnEveryReplay) {
  // Each replay takes fresh draws from the generator: the same numbers as eager ops from the generator's state
  // just before that replay.
  Generator& gen = default_generator(gpu);
  Tensor x = internal::full({4096}, 2.0, {.device = gpu});
  Tensor out, mask, u;
  const uint64_t before_capture = gen.state().offset;
  cuda::Graph graph;
  graph.capture(
      [&] {
        std::tie(out, mask) = internal::dropout(x, 0.3);
        u = internal::rand({1000}, {.device = gpu});
      },
      1);
  // The warm-up step took its 2 draws; the recorded step, which did not run, none.
  EXPECT_EQ(gen.state().offset, before_capture + 2);
  std::vector<float> previous;
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(k);
    const GeneratorState before = gen.state();
    graph.replay();
    const std::vector<float> got_mask = mask.cpu().to_vector<float>(), got_u = u.cpu().to_vector<float>();
    const GeneratorState after = gen.state();
    EXPECT_EQ(after.offset, before.offset + 2);  // one draw per random op and replay, as eager steps take
    gen.set_state(before);
    auto [want_out, want_mask] = internal::dropout(x, 0.3);
    const Tensor want_u = internal::rand({1000}, {.device = gpu});
    EXPECT_EQ(got_mask, want_mask.cpu().to_vector<float>());
    EXPECT_EQ(out.cpu().to_vector<float>(), want_out.cpu().to_vector<float>());
    EXPECT_EQ(got_u, want_u.cpu().to_vector<float>());
    EXPECT_EQ(gen.state().offset, after.offset);
    EXPECT_NE(got_mask, previous) << "a replay repeated the previous replay's mask";
    previous = got_mask;
  }
}

TEST_F(CudaGraph, DrawsAfterARewindAndReseedingAreRefused) {
  Generator& gen = default_generator(gpu);
  Tensor x = internal::ones({64}, {.device = gpu});
  cuda::Graph rewinding;
  // What gradient checkpointing does to recompute a region: rewind the generator, then draw again.
  expect_error(
      [&] {
        rewinding.capture(
            [&] {
              const GeneratorState st = gen.state();
              (void)internal::dropout(x, 0.5);
              gen.set_state(st);
              (void)internal::dropout(x, 0.5);
            },
            0);
      },
      {"Graph::capture", "rewound", "checkpointing"});
  (void)internal::dropout(x, 0.5);  // an eager draw clears the rewind
  cuda::Graph graph;
  graph.capture([&] { (void)internal::dropout(x, 0.5); }, 0);
  graph.replay();
  manual_seed(4321);
  expect_error([&] { graph.replay(); }, {"replay", "seeded again", "capture the step again"});
}

TEST_F(CudaGraph, MisuseIsReported) {
  cuda::Graph graph;
  expect_error([&] { graph.replay(); }, {"Graph::replay", "capture(step) first"});
  expect_error([] { cuda::Graph::on_replay([] {}); }, {"on_replay", "no CUDA graph is being captured"});
  expect_error([&] { graph.capture([] {}, -1); }, {"warmup", "-1"});
  Tensor x = values({1});
  graph.capture([&] { (void)internal::add(x, 1.0); }, 0);
  expect_error([&] { graph.capture([] {}); }, {"Graph::capture", "make a new Graph"});
  cuda::Graph inner;
  cuda::Graph outer;
  expect_error([&] { outer.capture([&] { inner.capture([] {}, 0); }, 0); }, {"do not nest"});
}

TEST_F(CudaGraph, ReplayHooksRunBeforeEveryReplay) {
  Tensor scale = values({1});
  Tensor x = values({1, 2});
  Tensor y;
  double host_scale = 2;
  cuda::Graph graph;
  graph.capture(
      [&] {
        y = internal::mul(x, scale);
        if (cuda::Graph::capturing()) cuda::Graph::on_replay([&] { scale.fill_(host_scale); });
      },
      0);
  graph.replay();
  EXPECT_EQ(y.cpu().to_vector<float>(), (std::vector<float>{2, 4}));
  host_scale = -3;
  graph.replay();
  EXPECT_EQ(y.cpu().to_vector<float>(), (std::vector<float>{-3, -6}));
}

TEST_F(CudaGraph, ReplayInputsKeepWhatTheHookWrote) {
  // A temporary of the capture, written by a kernel of the graph and freed, leaves memory that the capture's
  // next allocation of its size gets. A value that a hook writes before each replay must not live there: the
  // graph's fill of the temporary would overwrite it on every replay, before the product reads it.
  Tensor x = values({1, 2});
  Tensor y, scale;
  double host_scale = 2;
  const void* temporary = nullptr;
  const void* plain = nullptr;
  cuda::Graph graph;
  graph.capture(
      [&] {
        {
          const Tensor t = internal::full({1}, 100.0, {.dtype = DType::Float32, .device = gpu});
          temporary = t.data_ptr();
          y = internal::add(x, t);  // the temporary is used, then freed
        }
        if (!cuda::Graph::capturing()) return;
        scale = cuda::Graph::replay_input({1}, {.dtype = DType::Float32, .device = gpu});
        cuda::Graph::on_replay([s = scale, &host_scale]() mutable { s.fill_(host_scale); });
        // The hazard: a plain allocation of that size gets the temporary's memory.
        plain = internal::empty({1}, {.dtype = DType::Float32, .device = gpu}).data_ptr();
        y = internal::mul(x, scale);
      },
      0);
  EXPECT_NE(scale.data_ptr(), temporary);
  EXPECT_EQ(plain, temporary) << "the capture did not reuse the temporary's memory; this test no longer shows "
                                 "the case replay inputs are for";
  graph.replay();
  EXPECT_EQ(y.cpu().to_vector<float>(), (std::vector<float>{2, 4}));
  host_scale = -3;
  graph.replay();
  EXPECT_EQ(y.cpu().to_vector<float>(), (std::vector<float>{-3, -6}));
}

TEST_F(CudaGraph, ReplayInputsAreMadeInsideACaptureOnly) {
  expect_error([&] { (void)cuda::Graph::replay_input({1}, {.dtype = DType::Float32, .device = gpu}); },
               {"replay_input", "no CUDA graph is being captured"});
  cuda::Graph graph;
  expect_error([&] { graph.capture([&] { (void)cuda::Graph::replay_input({1}, {.dtype = DType::Float32}); }, 0); },
               {"replay_input", "CUDA tensor"});
}

}  // namespace
}  // namespace kiln
