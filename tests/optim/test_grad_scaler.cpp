// amp::GradScaler: skipped steps on inf/NaN (parameters and optimizer state equal a float32 control that
// skipped the same step), the exact scale sequence of growth and backoff, misuse errors, the disabled no-op,
// state_dict round trips; on CUDA, the same against the CPU and without waiting for the GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/optim/grad_scaler.h"
#include "optim/scaler_test_optimizer.h"
#include "support/test_support.h"

#if defined(KILN_TEST_CUDA)
#include <cuda_runtime.h>  // cudaMemsetAsync: GPU work of a known length, independent of kiln's kernels

#include "kiln/tensor/cuda.h"
#endif

namespace kiln::testing {
namespace {

class GradScalerTest : public BackendTest {
 protected:
  // Parameters w (4,) and v (2, 3); loss = sum(w * a) + 0.5 * sum(v * v)  ->  grads a and v.
  void SetUp() override {
    w = make({0.5, -1, 2, 0.25}, {4}, opts()).requires_grad_();
    v = make(uniform(6, -1, 1, 21), {2, 3}, opts()).requires_grad_();
    a = make({1, -2, 0.5, 3}, {4}, opts());
  }
  Tensor loss_of(const Tensor& wp, const Tensor& vp) const { return (wp * a).sum() + (vp * vp).sum() * 0.5; }

  Tensor w, v, a;
};

// Runs `steps` iterations; at step `bad` one gradient element of w becomes inf after backward.
void train(TestSgd& opt, amp::GradScaler* scaler, const std::function<Tensor()>& loss_fn, const Tensor& w, int steps,
           int bad) {
  for (int s = 0; s < steps; ++s) {
    opt.zero_grads();
    Tensor loss = loss_fn();
    (scaler != nullptr ? scaler->scale(loss) : loss).backward();
    if (s == bad) {
      NoGradGuard no_grad;
      Tensor g = w.grad();
      g.select(0, 1).fill_(INFINITY);
    }
    if (scaler != nullptr) {
      scaler->step(opt);
      scaler->update();
    } else if (s != bad) {
      opt.step();  // the control skips the bad step by hand
    }
  }
}

TEST_P(GradScalerTest, InfGradientSkipsTheStepLikeAFloat32Control) {
  Tensor w2 = w.detach().clone().requires_grad_(), v2 = v.detach().clone().requires_grad_();
  TestSgd opt({w, v}, 0.1, 0.9), control({w2, v2}, 0.1, 0.9);
  amp::GradScaler scaler({.growth_interval = 2});
  train(
      opt, &scaler, [&] { return loss_of(w, v); }, w, 5, 2);
  train(
      control, nullptr, [&] { return loss_of(w2, v2); }, w2, 5, 2);
  // Scaling by powers of two and unscaling is exact: the results are equal, not just close.
  expect_values(w, {4}, values(w2), 0, 0);
  expect_values(v, {2, 3}, values(v2), 0, 0);
  expect_values(opt.bufs()[0], {4}, values(control.bufs()[0]), 0, 0);
  expect_values(opt.bufs()[1], {2, 3}, values(control.bufs()[1]), 0, 0);
  // A sanity check that the control itself moved: 4 real steps happened.
  EXPECT_NE(values(w2)[0], 0.5);
  if (dev().is_cpu()) {
    EXPECT_EQ(opt.steps, 4);  // CPU: the scaler reads found_inf and does not call step() at all
    EXPECT_EQ(opt.step_with_calls, 0);
  } else {
    EXPECT_EQ(opt.steps, 0);  // GPU: always step_with(), which skips on the device
    EXPECT_EQ(opt.step_with_calls, 5);
  }
  // steps 0,1 grow (interval 2): 2^17; step 2 inf: 2^16; steps 3,4 grow: 2^17.
  EXPECT_EQ(scaler.get_scale(), 131072.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
}

TEST_P(GradScalerTest, ScaleFollowsGrowthAndBackoffExactly) {
  TestSgd opt({w, v}, 0.01, 0.0);
  amp::GradScaler scaler({.init_scale = 65536.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 3});
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  // Pattern of steps (true = inf) and the expected (scale, tracker) after each update.
  const std::vector<bool> bad = {false, false, false, false, true, true, false, false, false, false};
  const std::vector<std::pair<double, int64_t>> expected = {{65536, 1}, {65536, 2}, {131072, 0}, {131072, 1},
                                                            {65536, 0}, {32768, 0}, {32768, 1},  {32768, 2},
                                                            {65536, 0}, {65536, 1}};
  for (size_t s = 0; s < bad.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    opt.zero_grads();
    scaler.scale(loss_of(w, v)).backward();
    if (bad[s]) {
      NoGradGuard no_grad;
      Tensor g = v.grad();
      g.select(0, 0).select(0, 2).fill_(NAN);  // NaN counts as inf
    }
    scaler.step(opt);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), expected[s].first);
    EXPECT_EQ(scaler.get_growth_tracker(), expected[s].second);
  }
}

TEST_P(GradScalerTest, UnscaleGivesTheTrueGradients) {
  amp::GradScaler scaler;
  TestSgd opt({w, v}, 0.1, 0.0);
  Tensor loss = scaler.scale(loss_of(w, v));
  EXPECT_EQ(loss.dim(), 0) << "scale() keeps a 0-d loss 0-d";
  loss.backward();
  expect_values(w.grad(), {4}, {65536.0, -131072.0, 32768.0, 196608.0}, 0, 0);
  scaler.unscale_(opt);
  expect_values(w.grad(), {4}, {1, -2, 0.5, 3}, 0, 0);
  expect_values(v.grad(), {2, 3}, values(v), 0, 0);
}

TEST_P(GradScalerTest, Float16GradientsUnscaleInFloat32) {
  // 1 / 2^26 is below float16's smallest subnormal (2^-24): multiplying in float16 would give 0.
  Tensor h = make({1, 2}, {2}, opts(DType::Float16)).requires_grad_();
  TestSgd opt({h}, 0.5, 0.0);
  amp::GradScaler scaler({.init_scale = 67108864.0});  // 2^26
  scaler.scale((h.to(DType::Float32) * std::ldexp(1.0, -12)).sum()).backward();
  expect_values(h.grad(), {2}, {16384, 16384}, 0, 0);  // 2^-12 * 2^26 = 2^14, finite in float16
  scaler.unscale_(opt);
  expect_values(h.grad(), {2}, {std::ldexp(1.0, -12), std::ldexp(1.0, -12)}, 0, 0);
}

TEST_P(GradScalerTest, Float16GradientOverflowIsDetectedAndBacksOff) {
  // 2 * 2^16 overflows float16 (max 65504): the scaled gradient is inf, the step is skipped, the scale halves.
  Tensor h = make({1, 2}, {2}, opts(DType::Float16)).requires_grad_();
  TestSgd opt({h}, 0.5, 0.0);
  amp::GradScaler scaler;
  scaler.scale((h * 2.0).sum().to(DType::Float32)).backward();
  scaler.step(opt);
  scaler.update();
  expect_values(h, {2}, {1, 2}, 0, 0);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  opt.zero_grads();
  scaler.scale((h * 2.0).sum().to(DType::Float32)).backward();  // 2 * 2^15 = 65536: still inf in float16
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 16384.0);
  opt.zero_grads();
  scaler.scale((h * 2.0).sum().to(DType::Float32)).backward();  // 2 * 2^14 = 32768: finite
  scaler.step(opt);
  scaler.update();
  expect_values(h, {2}, {0, 1}, 0, 0);  // p - 0.5 * 2
}

TEST_P(GradScalerTest, MisuseIsAnError) {
  TestSgd opt({w, v}, 0.1, 0.0);
  amp::GradScaler scaler;
  expect_error([&] { scaler.unscale_(opt); }, {"GradScaler::unscale_", "scale(loss)"});
  expect_error([&] { scaler.update(); }, {"GradScaler::update", "scale(loss)"});
  scaler.scale(loss_of(w, v)).backward();
  scaler.unscale_(opt);
  expect_error([&] { scaler.unscale_(opt); }, {"GradScaler::unscale_", "already called", "TestSgd"});
  scaler.step(opt);  // after an explicit unscale_: no second unscale
  expect_values(w.grad(), {4}, {1, -2, 0.5, 3}, 0, 0);
  expect_error([&] { scaler.step(opt); }, {"GradScaler::step", "already called", "update()"});
  expect_error([&] { scaler.unscale_(opt); }, {"GradScaler::unscale_", "after step()"});
  scaler.update();
  // A new iteration is allowed again; an optimizer without gradients is an error.
  Tensor lone = make({1}, {1}, opts()).requires_grad_();
  TestSgd other({lone}, 0.1, 0.0);
  scaler.scale(loss_of(w, v)).backward();
  expect_error([&] { scaler.step(other); }, {"GradScaler::step", "no gradient", "backward()"});
}

TEST_P(GradScalerTest, DisabledScalerIsANoOp) {
  TestSgd opt({w, v}, 0.1, 0.0);
  amp::GradScaler scaler({.enabled = false});
  Tensor loss = loss_of(w, v);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  {
    NoGradGuard no_grad;
    Tensor g = w.grad();
    g.select(0, 0).fill_(INFINITY);
  }
  scaler.unscale_(opt);  // nothing
  scaler.step(opt);      // opt.step(), even with an inf
  scaler.update();
  EXPECT_EQ(opt.steps, 1);
  EXPECT_TRUE(std::isinf(values(w)[0]));
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_TRUE(scaler.state_dict().empty());
  EXPECT_FALSE(scaler.scale_tensor().defined());
}

TEST_P(GradScalerTest, StateDictRoundTrip) {
  TestSgd opt({w, v}, 0.01, 0.0);
  amp::GradScaler scaler({.init_scale = 1024, .growth_factor = 4, .backoff_factor = 0.25, .growth_interval = 3});
  for (int s = 0; s < 4; ++s) {  // 3 clean steps grow to 4096, one more: tracker 1
    opt.zero_grads();
    scaler.scale(loss_of(w, v)).backward();
    scaler.step(opt);
    scaler.update();
  }
  const auto sd = scaler.state_dict();
  EXPECT_EQ(sd.at("scale"), 4096.0);
  EXPECT_EQ(sd.at("_growth_tracker"), 1.0);
  EXPECT_EQ(sd.at("growth_factor"), 4.0);
  EXPECT_EQ(sd.at("backoff_factor"), 0.25);
  EXPECT_EQ(sd.at("growth_interval"), 3.0);

  amp::GradScaler fresh;  // default options, then loaded: behaves as the saved one from now on
  fresh.load_state_dict(sd);
  EXPECT_EQ(fresh.get_scale(), 4096.0);
  EXPECT_EQ(fresh.get_growth_tracker(), 1);
  EXPECT_EQ(fresh.options().growth_interval, 3);
  EXPECT_EQ(fresh.state_dict(), sd);
  for (amp::GradScaler* s : {&scaler, &fresh}) {
    for (int i = 0; i < 2; ++i) {  // 2 more clean steps: tracker reaches 3, scale * 4
      opt.zero_grads();
      s->scale(loss_of(w, v)).backward();
      s->step(opt);
      s->update();
    }
  }
  EXPECT_EQ(scaler.get_scale(), 16384.0);
  EXPECT_EQ(fresh.get_scale(), 16384.0);

  // Loading into a scaler whose tensors exist updates them in place.
  const Tensor before = scaler.scale_tensor();
  scaler.load_state_dict(sd);
  EXPECT_TRUE(scaler.scale_tensor().is_same(before));
  EXPECT_EQ(scaler.get_scale(), 4096.0);

  auto missing = sd;
  missing.erase("_growth_tracker");
  expect_error([&] { fresh.load_state_dict(missing); }, {"load_state_dict", "_growth_tracker", "missing"});
  expect_error([&] { fresh.load_state_dict({}); }, {"load_state_dict", "empty", "disabled"});
  auto bad = sd;
  bad["backoff_factor"] = 2;
  expect_error([&] { fresh.load_state_dict(bad); }, {"backoff_factor"});
  EXPECT_EQ(fresh.state_dict().at("backoff_factor"), 0.25) << "a failed load changes nothing";
}

TEST(GradScalerOptionsTest, BadOptionsAreErrors) {
  expect_error([] { amp::GradScaler s({.growth_factor = 1.0}); }, {"growth_factor"});
  expect_error([] { amp::GradScaler s({.backoff_factor = 1.0}); }, {"backoff_factor"});
  expect_error([] { amp::GradScaler s({.growth_interval = 0}); }, {"growth_interval"});
  expect_error([] { amp::GradScaler s({.init_scale = -1}); }, {"init_scale"});
}

KILN_INSTANTIATE_BACKENDS(GradScalerTest);

#if defined(KILN_TEST_CUDA)

class CudaGradScaler : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  }
};

// The same scaled training with inf steps on CPU and CUDA (with float16 and non-contiguous gradients, which
// take the fused kernel and the kiln-ops path) gives the same parameters and scale.
TEST_F(CudaGradScaler, MatchesTheCpu) {
  struct Run {
    Tensor w, h, t;
    double scale;
  };
  auto run = [](Device dev) {
    const TensorOptions o{.dtype = DType::Float32, .device = dev};
    Tensor w = make(uniform(1000, -1, 1, 31), {1000}, o).requires_grad_();
    Tensor h = make(uniform(64, -1, 1, 32), {64}, {.dtype = DType::Float16, .device = dev}).requires_grad_();
    Tensor t = make(uniform(12, -1, 1, 33), {3, 4}, o).requires_grad_();
    Tensor c = make(uniform(1000, -2, 2, 34), {1000}, o);
    TestSgd opt({w, h, t}, 0.05, 0.9);
    amp::GradScaler scaler({.init_scale = 256, .growth_interval = 2});
    for (int s = 0; s < 6; ++s) {
      opt.zero_grads();
      Tensor loss = (w * c).sum() + (h.to(DType::Float32) * h.to(DType::Float32)).sum() + (t * t).sum();
      scaler.scale(loss).backward();
      {
        NoGradGuard no_grad;
        Tensor tg = t.grad();
        t.mutable_grad() = tg.transpose(0, 1).contiguous().transpose(0, 1);  // the same values, non-contiguous
        if (s == 3) {
          Tensor g = w.grad();
          g.select(0, 777).fill_(-INFINITY);
        }
      }
      scaler.step(opt);
      scaler.update();
    }
    return Run{w, h, t, scaler.get_scale()};
  };
  const Run cpu = run(Device::cpu()), gpu = run(Device::cuda(0));
  EXPECT_FALSE(gpu.t.grad().is_contiguous());
  expect_values(gpu.w, {1000}, values(cpu.w), 1e-6, 1e-6);
  expect_values(gpu.h, {64}, values(cpu.h), 1e-3, 1e-3);
  expect_values(gpu.t, {3, 4}, values(cpu.t), 1e-6, 1e-6);
  EXPECT_EQ(gpu.scale, cpu.scale);
  EXPECT_EQ(cpu.scale, 512.0);  // 256 -> 512 (after steps 0, 1) -> 256 (inf at step 3) -> 512 (after 4, 5)
}

// unscale_, step and update queue their work and return while the GPU is still busy with earlier work: no
// host synchronisation in the step path.
TEST_F(CudaGradScaler, StepPathDoesNotWaitForTheGpu) {
  const TensorOptions o{.dtype = DType::Float32, .device = Device::cuda(0)};
  Tensor w = make(uniform(4096, -1, 1, 41), {4096}, o).requires_grad_();
  TestSgd opt({w}, 0.01, 0.9);
  amp::GradScaler scaler;
  auto backward = [&] {
    opt.zero_grads();
    scaler.scale((w * w).sum()).backward();
  };
  backward();  // warm-up: the caching allocator holds every block the step path needs afterwards
  scaler.step(opt);
  scaler.update();
  backward();
  cuda::synchronize(0);
  Tensor load = empty({int64_t{1} << 30}, {.dtype = DType::UInt8, .device = Device::cuda(0)});
  const cuda::Stream stream = cuda::current_stream(0);
  for (int i = 0; i < 400; ++i) {  // about 0.2 s of memsets on kiln's current stream
    ASSERT_EQ(cudaMemsetAsync(load.data_ptr<void>(), i & 0xff, static_cast<size_t>(load.nbytes()),
                              static_cast<cudaStream_t>(stream.handle())),
              cudaSuccess);
  }
  cuda::Event busy_done;
  busy_done.record(stream);
  scaler.unscale_(opt);
  scaler.step(opt);
  scaler.update();
  EXPECT_FALSE(busy_done.query()) << "the host waited for the GPU in unscale_/step/update";
  cuda::synchronize(0);
  EXPECT_EQ(opt.step_with_calls, 2);
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 2);
}

#endif

}  // namespace
}  // namespace kiln::testing
