// tests/optim/test_optim_cuda.cpp — the optimizers' fused CUDA path (kiln/optim/cuda) against the float64
// references and against the CPU path: float32, 16-bit, non-contiguous parameters, mixed dtypes in a group,
// the AMP hooks (grad_scale, found_inf on the device), and state_dict across devices. Skips without a GPU.
#include <gtest/gtest.h>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "optim/optim_reference.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using namespace optim_ref;

#define KILN_REQUIRE_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible"

const Device kGpu = Device::cuda(0);

TEST(CudaOptimizers, TrajectoriesMatchReferenceFloat32) {
  KILN_REQUIRE_GPU();
  for (const Case& c : all_cases()) run_trajectory(c, {.dtype = DType::Float32, .device = kGpu}, 5e-5, 5e-6);
}

TEST(CudaOptimizers, SixteenBitParameters) {
  KILN_REQUIRE_GPU();
  const std::vector<Case> cases = {
      {"sgd", optim::SGDOptions{.lr = 0.2, .momentum = 0.9, .weight_decay = 0.1}},
      {"adam", optim::AdamOptions{.lr = 0.1, .amsgrad = true}},
      {"adamw", optim::AdamWOptions{.lr = 0.1, .weight_decay = 0.1}},
      {"lamb", optim::LAMBOptions{.lr = 0.1}},
  };
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    for (const Case& c : cases) run_trajectory(c, {.dtype = dtype, .device = kGpu}, 1e-2, 2e-2, 3);
  }
}

// The CPU and the GPU path given the same gradients: the same parameters and states up to float32 rounding.
TEST(CudaOptimizers, MatchCpu) {
  KILN_REQUIRE_GPU();
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    Problem pb;
    std::vector<Tensor> pc, pg;
    for (size_t i = 0; i < 2; ++i) {
      pc.push_back(make(pb.init[i], pb.shapes[i], {.dtype = DType::Float32}).requires_grad_());
      pg.push_back(make(pb.init[i], pb.shapes[i], {.dtype = DType::Float32, .device = kGpu}).requires_grad_());
    }
    auto oc = make_optimizer(c.options, pc[0], pc[1]);
    auto og = make_optimizer(c.options, pg[0], pg[1]);
    for (int k = 0; k < 5; ++k) {
      for (size_t i = 0; i < 2; ++i) {
        pb.set_grad(i, pc[i]);
        pg[i].mutable_grad() = pc[i].grad().to(kGpu);
      }
      oc->step();
      og->step();
      for (size_t i = 0; i < 2; ++i) expect_values(pg[i], pb.shapes[i], values(pc[i]), 1e-5, 1e-6);
    }
    const auto sc = oc->state_dict(), sg = og->state_dict();
    ASSERT_EQ(sc.tensors.size(), sg.tensors.size());
    for (const auto& [key, t] : sc.tensors) {
      SCOPED_TRACE(key);
      ASSERT_TRUE(sg.tensors.count(key));
      EXPECT_TRUE(sg.tensors.at(key).is_cuda());
      expect_values(sg.tensors.at(key), t.shape(), values(t), 1e-5, 1e-7);
    }
  }
}

// A non-contiguous parameter (a transposed view) is updated through a contiguous copy and written back; a
// channels-last 4-d weight, which is dense, in place.
TEST(CudaOptimizers, NonContiguousParameters) {
  KILN_REQUIRE_GPU();
  const Vec init = uniform(24, -1, 1, 5), grad = uniform(24, -1, 1, 6);
  for (const Case& c : {Case{"sgd", optim::SGDOptions{.lr = 0.1, .momentum = 0.9}},
                        Case{"adamw", optim::AdamWOptions{.lr = 0.01}}, Case{"lamb", optim::LAMBOptions{.lr = 0.01}}}) {
    SCOPED_TRACE(c.name);
    Tensor t = internal::transpose(make(init, {4, 6}, {.dtype = DType::Float32, .device = kGpu}), 0, 1);  // (6, 4)
    Tensor cl = make(init, {2, 3, 2, 2}, {.dtype = DType::Float32, .device = kGpu}).to(MemoryFormat::ChannelsLast);
    ASSERT_FALSE(t.is_contiguous());
    ASSERT_FALSE(cl.is_contiguous());
    t.requires_grad_();
    cl.requires_grad_();
    Tensor rt = internal::to(t.detach(), Device::cpu()).requires_grad_(),
           rcl = internal::to(cl.detach(), Device::cpu()).requires_grad_();
    auto og = make_optimizer(c.options, t, cl);
    auto oc = make_optimizer(c.options, internal::contiguous(rt).requires_grad_(),
                             internal::contiguous(rcl).requires_grad_());
    const auto cpu_params = oc->all_params();
    for (int k = 0; k < 3; ++k) {
      t.mutable_grad() = make(grad, {6, 4}, {.dtype = DType::Float32, .device = kGpu});
      cl.mutable_grad() = make(grad, {2, 3, 2, 2}, {.dtype = DType::Float32, .device = kGpu});
      Tensor c0 = cpu_params[0], c1 = cpu_params[1];
      c0.mutable_grad() = make(grad, {6, 4}, {.dtype = DType::Float32});
      c1.mutable_grad() = make(grad, {2, 3, 2, 2}, {.dtype = DType::Float32});
      og->step();
      oc->step();
      expect_values(t, {6, 4}, values(c0), 1e-5, 1e-6);
      expect_values(cl, {2, 3, 2, 2}, values(c1), 1e-5, 1e-6);
    }
    EXPECT_FALSE(t.is_contiguous());  // still the same view
  }
}

// Channels-last conv weights (as in a channels-last model) are updated in place by the fused kernels: the same
// values as a contiguous CPU copy, whichever layout the gradient comes in; the optimizer's state is kept in the
// weight's layout, also when it was loaded from a state_dict in the contiguous one.
TEST(CudaOptimizers, ChannelsLastParametersUpdatedInPlace) {
  KILN_REQUIRE_GPU();
  const Shape shape{4, 6, 3, 3};
  const Vec init = uniform(216, -1, 1, 15), grad = uniform(216, -1, 1, 16);
  for (const Case& c : {Case{"sgd", optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}},
                        Case{"adamw", optim::AdamWOptions{.lr = 0.01}}, Case{"lamb", optim::LAMBOptions{.lr = 0.01}}}) {
    for (bool grad_channels_last : {true, false}) {
      SCOPED_TRACE(c.name + (grad_channels_last ? ", channels-last gradient" : ", contiguous gradient"));
      Tensor w = make(init, shape, {.dtype = DType::Float32, .device = kGpu}).to(MemoryFormat::ChannelsLast);
      Tensor b = make(Vec(init.begin(), init.begin() + 4), {4}, {.dtype = DType::Float32, .device = kGpu});
      ASSERT_FALSE(w.is_contiguous());
      w.requires_grad_();
      b.requires_grad_();
      const void* storage = w.data_ptr();
      Tensor wc = make(init, shape, {.dtype = DType::Float32}).requires_grad_();
      Tensor bc = make(Vec(init.begin(), init.begin() + 4), {4}, {.dtype = DType::Float32}).requires_grad_();
      auto og = make_optimizer(c.options, w, b);
      auto oc = make_optimizer(c.options, wc, bc);
      auto set_grads = [&](int k) {
        Vec g = grad;
        for (double& v : g) v *= 1 + 0.5 * k;
        Tensor gw = make(g, shape, {.dtype = DType::Float32, .device = kGpu});
        w.mutable_grad() = grad_channels_last ? gw.to(MemoryFormat::ChannelsLast) : gw;
        b.mutable_grad() = make(Vec(g.begin(), g.begin() + 4), {4}, {.dtype = DType::Float32, .device = kGpu});
        wc.mutable_grad() = make(g, shape, {.dtype = DType::Float32});
        bc.mutable_grad() = make(Vec(g.begin(), g.begin() + 4), {4}, {.dtype = DType::Float32});
      };
      for (int k = 0; k < 3; ++k) {
        set_grads(k);
        og->step();
        oc->step();
        expect_values(w, shape, values(wc), 1e-5, 1e-6);
        expect_values(b, {4}, values(bc), 1e-5, 1e-6);
      }
      EXPECT_EQ(w.data_ptr(), storage) << "updated in place";
      EXPECT_TRUE(w.is_contiguous(MemoryFormat::ChannelsLast));
      for (const auto& [name, t] : og->state(w)) {
        if (name != "step") {
          EXPECT_TRUE(t.is_contiguous(MemoryFormat::ChannelsLast)) << name;
        }
      }
      // A state saved in the contiguous layout (the CPU optimizer's), loaded for the channels-last weight.
      auto og2 = make_optimizer(c.options, w, b);
      og2->load_state_dict(oc->state_dict());
      for (int k = 3; k < 5; ++k) {
        set_grads(k);
        og2->step();
        oc->step();
        expect_values(w, shape, values(wc), 1e-5, 1e-6);
      }
      for (const auto& [name, t] : og2->state(w)) {
        if (name != "step") {
          EXPECT_TRUE(t.is_contiguous(MemoryFormat::ChannelsLast)) << name;
        }
      }
    }
  }
}

// The GradScaler's fused unscale reads channels-last 16-bit gradients as they are: divided by the scale, and an
// inf among them found.
TEST(CudaOptimizers, GradScalerUnscalesChannelsLastGradients) {
  KILN_REQUIRE_GPU();
  const Shape shape{4, 6, 3, 3};
  const Vec init = uniform(216, -1, 1, 17), grad = uniform(216, -1, 1, 18);
  Tensor w = make(init, shape, {.dtype = DType::Float16, .device = kGpu}).to(MemoryFormat::ChannelsLast);
  w.requires_grad_();
  optim::SGD opt({w}, {.lr = 1.0});
  amp::GradScaler scaler({.init_scale = 1024.0});
  Vec scaled = grad;
  for (double& v : scaled) v *= 1024;
  // A scaled loss for this iteration (the scaler insists), then the gradient set to the values wanted.
  scaler.scale(w.to(DType::Float32).sum()).backward();
  w.mutable_grad() = make(scaled, shape, {.dtype = DType::Float16, .device = kGpu}).to(MemoryFormat::ChannelsLast);
  scaler.unscale_(opt);
  EXPECT_TRUE(w.grad().is_contiguous(MemoryFormat::ChannelsLast));
  expect_values(w.grad(), shape, grad, 2e-3, 1e-3);
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1024.0);  // finite: kept (growth after 2000 such steps)
  // An inf in the gradient (at a channel other than 0, so the memory order matters for where it sits): the
  // step is skipped and the scale backs off.
  Vec bad = scaled;
  bad[100] = std::numeric_limits<double>::infinity();
  const Vec before = values(w);
  scaler.scale(w.to(DType::Float32).sum()).backward();
  w.mutable_grad() = make(bad, shape, {.dtype = DType::Float16, .device = kGpu}).to(MemoryFormat::ChannelsLast);
  scaler.step(opt);
  scaler.update();
  expect_values(w, shape, before, 0, 0);
  EXPECT_EQ(scaler.get_scale(), 512.0);  // backoff_factor 0.5
}

// One group holding float32 and bfloat16 CUDA parameters (two fused calls) and a parameter without gradient.
TEST(CudaOptimizers, MixedDtypesInOneGroup) {
  KILN_REQUIRE_GPU();
  const Vec init = uniform(8, -1, 1, 7), grad = uniform(8, -1, 1, 8);
  Tensor a = make(init, {8}, {.dtype = DType::Float32, .device = kGpu}).requires_grad_();
  Tensor b = make(init, {8}, {.dtype = DType::BFloat16, .device = kGpu}).requires_grad_();
  Tensor idle = make(init, {8}, {.dtype = DType::Float32, .device = kGpu}).requires_grad_();
  Tensor ac = make(init, {8}, {.dtype = DType::Float32}).requires_grad_();
  Tensor bc = make(init, {8}, {.dtype = DType::BFloat16}).requires_grad_();
  optim::Adam og({a, b, idle}, {.lr = 0.05});
  optim::Adam oc({ac, bc}, {.lr = 0.05});
  for (int k = 0; k < 3; ++k) {
    a.mutable_grad() = make(grad, {8}, a.options());
    b.mutable_grad() = make(grad, {8}, b.options());
    ac.mutable_grad() = make(grad, {8}, ac.options());
    bc.mutable_grad() = make(grad, {8}, bc.options());
    og.step();
    oc.step();
  }
  expect_values(a, {8}, values(ac), 1e-5, 1e-6);
  expect_values(b, {8}, values(bc), 1e-2, 1e-2);
  EXPECT_EQ(og.state(b).at("exp_avg").dtype(), DType::Float32);
  EXPECT_EQ(og.state(b).at("step").item<float>(), 3.0f);
  expect_values(idle, {8}, init, 1e-6, 1e-7);
  EXPECT_EQ(og.find_state(idle), nullptr);
}

// GradScaler's hooks with device tensors: gradients divided by grad_scale; found_inf != 0 changes nothing.
TEST(CudaOptimizers, StepWithGradScaleAndFoundInf) {
  KILN_REQUIRE_GPU();
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    Problem pb;
    std::vector<Tensor> p, q;
    for (size_t i = 0; i < 2; ++i) {
      p.push_back(make(pb.init[i], pb.shapes[i], {.dtype = DType::Float32, .device = kGpu}).requires_grad_());
      q.push_back(make(pb.init[i], pb.shapes[i], {.dtype = DType::Float32, .device = kGpu}).requires_grad_());
    }
    auto op = make_optimizer(c.options, p[0], p[1]);
    auto oq = make_optimizer(c.options, q[0], q[1]);
    const Tensor scale = make({256}, {1}, {.dtype = DType::Float32, .device = kGpu});
    const Tensor no_inf = make({0}, {1}, {.dtype = DType::Float32, .device = kGpu});
    const Tensor inf = make({1}, {1}, {.dtype = DType::Float32, .device = kGpu});
    for (int k = 0; k < 3; ++k) {
      for (size_t i = 0; i < 2; ++i) {
        pb.set_grad(i, q[i]);
        p[i].mutable_grad() = internal::mul(q[i].grad(), 256.0);
      }
      oq->step();
      op->step_with(scale, no_inf);
      for (size_t i = 0; i < 2; ++i) expect_values(p[i], pb.shapes[i], values(q[i]), 1e-5, 1e-6);
      std::map<std::string, Vec> before;
      for (const auto& [key, t] : op->state_dict().tensors) before[key] = values(t);
      std::vector<Vec> params_before = {values(p[0]), values(p[1])};
      op->step_with(scale, inf);
      for (size_t i = 0; i < 2; ++i) expect_values(p[i], pb.shapes[i], params_before[i], 0, 0);
      for (const auto& [key, t] : op->state_dict().tensors) {
        SCOPED_TRACE(key);
        expect_values(t, t.shape(), before.at(key), 0, 0);
      }
    }
    EXPECT_EQ(op->state(p[0]).at("step").item<float>(), 3.0f);
  }
}

// A GPU optimizer's state_dict resumes a CPU optimizer, and back.
TEST(CudaOptimizers, StateDictAcrossDevices) {
  KILN_REQUIRE_GPU();
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    Problem pb;
    std::vector<Tensor> pg, pc;
    for (size_t i = 0; i < 2; ++i) {
      pg.push_back(make(pb.init[i], pb.shapes[i], {.dtype = DType::Float32, .device = kGpu}).requires_grad_());
    }
    auto og = make_optimizer(c.options, pg[0], pg[1]);
    for (int k = 0; k < 3; ++k) {
      for (size_t i = 0; i < 2; ++i) pb.set_grad(i, pg[i]);
      og->step();
    }
    for (size_t i = 0; i < 2; ++i) pc.push_back(internal::to(pg[i].detach(), Device::cpu()).requires_grad_());
    auto oc = make_optimizer(c.options, pc[0], pc[1]);
    oc->load_state_dict(og->state_dict());
    EXPECT_TRUE(oc->state(pc[0]).at("step").is_cpu());
    auto og2 = make_optimizer(c.options, pg[0], pg[1]);
    og2->load_state_dict(oc->state_dict());
    EXPECT_TRUE(og2->state(pg[0]).at("step").is_cuda());
    for (int k = 0; k < 2; ++k) {
      for (size_t i = 0; i < 2; ++i) {
        pb.set_grad(i, pc[i]);
        pg[i].mutable_grad() = pc[i].grad().to(kGpu);
      }
      oc->step();
      og2->step();
      for (size_t i = 0; i < 2; ++i) expect_values(pg[i], pb.shapes[i], values(pc[i]), 1e-5, 1e-6);
    }
  }
}

}  // namespace
}  // namespace kiln::testing
