// tests/optim/test_sparse_fused_cuda.cpp — the fused CUDA update of row-sparse gradients (kiln/optim/cuda/sparse.cu)
// against the unfused kiln-op path on the CPU, given the same tables and gradients: SGD (also with momentum,
// dampening and Nesterov: every row ever touched moves) and SparseAdam bit for bit in float32 (each operation rounded
// once on both sides), row-wise Adagrad within float32 rounding (its row mean may add in another order), 16-bit
// tables within one 16-bit rounding; repeated and unsorted rows, maximize, grad_scale and a found_inf that skips the
// step, untouched rows keeping their bits, and the step counters; also for a table in page-locked host memory whose
// gradient is held on the GPU (updated through the mapping). The CPU path itself is checked against float64
// references in test_sparse_optimizers.cpp. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/autograd/sparse_grad.h"
#include "kiln/kiln.h"
#include "kiln/optim/rowwise_adagrad.h"
#include "kiln/optim/sparse_adam.h"
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

#define KILN_REQUIRE_GPU() \
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible"

const Device kGpu = Device::cuda(0);
constexpr int64_t kRows = 300, kWidth = 40;  // a width that is not a multiple of the 32 lanes

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(const Tensor&)>;

struct Case {
  std::string name;
  MakeOpt make;
  bool exact;  // bit-equal in float32
};

// An optimizer of type Opt over one parameter, with `options`.
template <typename Opt, typename Options>
MakeOpt maker(Options options) {
  return [options](const Tensor& p) { return std::make_unique<Opt>(std::vector<Tensor>{p}, options); };
}

std::vector<Case> cases() {
  using optim::SGD, optim::SGDOptions, optim::SparseAdam, optim::SparseAdamOptions;
  return {
      {"sgd", maker<SGD>(SGDOptions{.lr = 0.3}), true},
      {"sgd_maximize", maker<SGD>(SGDOptions{.lr = 0.05, .maximize = true}), true},
      {"sparse_adam", maker<SparseAdam>(SparseAdamOptions{.lr = 0.01}), true},
      {"sparse_adam_maximize",
       maker<SparseAdam>(SparseAdamOptions{.lr = 0.02, .betas = {0.8, 0.99}, .eps = 1e-6, .maximize = true}), true},
      {"sgd_momentum", maker<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.25}), true},
      {"sgd_nesterov_maximize", maker<SGD>(SGDOptions{.lr = 0.05, .momentum = 0.8, .nesterov = true, .maximize = true}),
       true},
      {"rowwise_adagrad", maker<optim::RowWiseAdagrad>(optim::RowWiseAdagradOptions{.lr = 0.1}), false},
  };
}

// Step s's gradient: 700 entries over a few hundred rows, drawn so that some rows repeat many times (as Zipf ids do)
// and the entries are in no order.
SparseRowGrad step_grad(int64_t step, DType dtype, Device device, int64_t width = kWidth) {
  const int64_t k = 700;
  std::vector<double> rows(k);
  const std::vector<double> u = uniform(k, 0, 1, 100 + step);
  for (int64_t i = 0; i < k; ++i) rows[i] = std::floor(kRows * std::pow(u[i], 3.0));  // dense near row 0
  return SparseRowGrad{
      .indices = make(rows, {k}, {.dtype = DType::Int64, .device = device}),
      .values = make(uniform(k * width, -2, 2, 200 + step), {k, width}, {.dtype = dtype, .device = device}),
      .dense_shape = {kRows, width}};
}

void expect_close(const Tensor& gpu, const Tensor& cpu, bool exact, double tol, const std::string& what) {
  const std::vector<double> a = values(gpu), b = values(cpu);
  ASSERT_EQ(a.size(), b.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool ok = exact ? a[i] == b[i] : std::abs(a[i] - b[i]) <= tol * std::max(1.0, std::abs(b[i]));
    if (!ok && bad++ < 3) ADD_FAILURE() << what << "[" << i << "]: GPU " << a[i] << ", CPU " << b[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size() << " elements differ";
}

// Four steps on the GPU (fused) and on the CPU (kiln ops) from the same table, with step_with's grad_scale on
// steps 2 and 3 and a found_inf on step 3 (skipped on both sides). mapped: the fused side's table is in page-locked
// host memory with its gradients held on the GPU (sparse_grad.h), updated through the mapping, its state made there.
void run_case(const Case& c, DType dtype, bool exact, double tol, bool mapped = false, int64_t width = kWidth) {
  SCOPED_TRACE(c.name + " " + std::string(dtype_name(dtype)) + (mapped ? " (mapped)" : "") + ", width " +
               std::to_string(width));
  const Tensor start = make(uniform(kRows * width, -1, 1, 7), {kRows, width}, {.dtype = dtype});
  Tensor cpu = start.clone().requires_grad_();
  Tensor gpu = (mapped ? start.pin_memory() : start.to(kGpu)).requires_grad_();
  auto cpu_opt = c.make(cpu);
  auto gpu_opt = c.make(gpu);
  ASSERT_TRUE(gpu_opt->supports_step_with());
  for (int64_t s = 0; s < 4; ++s) {
    autograd::set_sparse_grad(cpu, step_grad(s, dtype, Device::cpu(), width));
    autograd::set_sparse_grad(gpu, step_grad(s, dtype, kGpu, width));
    if (s == 0 || s == 1) {
      cpu_opt->step();
      gpu_opt->step();
    } else {
      const Tensor scale = make({1024.0}, {1}, {.dtype = DType::Float32});
      const Tensor inf = make({s == 3 ? 1.0 : 0.0}, {1}, {.dtype = DType::Float32});
      cpu_opt->step_with(scale, inf);
      gpu_opt->step_with(scale.to(kGpu), inf.to(kGpu));
    }
    cpu_opt->zero_grad();
    gpu_opt->zero_grad();
  }
  cuda::synchronize();
  expect_close(gpu, cpu, exact, tol, "param");
  for (const auto& [name, state] : cpu_opt->state(cpu)) {
    const auto& gpu_state = gpu_opt->state(gpu);
    ASSERT_TRUE(gpu_state.count(name)) << name;
    if (mapped && name == "momentum_mask") {
      EXPECT_TRUE(gpu_state.at(name).is_cuda()) << name << ": on the GPU that sweeps it";
    } else if (mapped) {
      EXPECT_TRUE(gpu_state.at(name).is_cpu() && gpu_state.at(name).is_pinned()) << name << ": beside its table";
    } else {
      EXPECT_TRUE(gpu_state.at(name).is_cuda()) << name;
    }
    expect_close(gpu_state.at(name), state, exact || name == "step", tol, name);
  }
  cuda::synchronize();  // the mapped side's state is written by the GPU: read it on the host after a wait
  EXPECT_EQ(values(gpu_opt->state(gpu).at("step")), std::vector<double>{3.0});  // step 3 was skipped
  // Rows no gradient touched keep their bits.
  const std::vector<double> before = values(start), after = values(gpu);
  for (int64_t r = kRows - 5; r < kRows; ++r) {
    bool touched = false;
    for (int64_t s = 0; s < 4; ++s) {
      for (double x : values(step_grad(s, dtype, Device::cpu(), width).indices)) touched |= x == static_cast<double>(r);
    }
    if (touched) continue;
    for (int64_t c2 = 0; c2 < width; ++c2) EXPECT_EQ(after[r * width + c2], before[r * width + c2]) << "row " << r;
  }
}

TEST(SparseFusedCuda, Float32MatchesTheUnfusedPath) {
  KILN_REQUIRE_GPU();
  for (const Case& c : cases()) run_case(c, DType::Float32, c.exact, 2e-6);
}

TEST(SparseFusedCuda, RowsWiderThanOnePassMatchTheUnfusedPath) {
  KILN_REQUIRE_GPU();
  // A lane sums 4 columns per pass over a run (128 per warp): 300 columns take two whole passes and a partial one, and
  // 128 exactly one.
  for (const Case& c : cases()) {
    run_case(c, DType::Float32, c.exact, 2e-6, /*mapped=*/false, /*width=*/300);
    run_case(c, DType::Float32, c.exact, 2e-6, /*mapped=*/false, /*width=*/128);
  }
  run_case(cases().back(), DType::BFloat16, false, 1e-2, /*mapped=*/false, /*width=*/300);
}

TEST(SparseFusedCuda, SixteenBitTablesMatchTheUnfusedPathWithinOneRounding) {
  KILN_REQUIRE_GPU();
  for (const Case& c : cases()) {
    run_case(c, DType::BFloat16, false, 1e-2);
    run_case(c, DType::Float16, false, 2e-3);
  }
}

TEST(SparseFusedCuda, APageLockedTableWithItsGradientOnTheGpuMatchesTheUnfusedPath) {
  KILN_REQUIRE_GPU();
  for (const Case& c : cases()) {
    run_case(c, DType::Float32, c.exact, 2e-6, /*mapped=*/true);
    run_case(c, DType::BFloat16, false, 1e-2, /*mapped=*/true);
  }
}

TEST(SparseFusedCuda, SgdMomentumStateMovesBetweenTheFusedAndTheUnfusedPaths) {
  KILN_REQUIRE_GPU();
  // The fused path keeps the rows its momentum covers as a mask on the GPU; state_dict gives them as the sorted row
  // list the unfused path saves too. Two steps on one path, the state carried over, two more on the other: the same
  // table, bit for bit, as four steps on the CPU.
  const optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .dampening = 0.1};
  const Tensor start = make(uniform(kRows * kWidth, -1, 1, 8), {kRows, kWidth});
  Tensor ref = start.clone().requires_grad_();
  optim::SGD ref_opt({ref}, o);
  for (int64_t s = 0; s < 4; ++s) {
    autograd::set_sparse_grad(ref, step_grad(s, DType::Float32, Device::cpu()));
    ref_opt.step();
    ref_opt.zero_grad();
  }
  for (const bool gpu_first : {true, false}) {
    SCOPED_TRACE(gpu_first ? "GPU, then CPU" : "CPU, then GPU");
    const Device first = gpu_first ? kGpu : Device::cpu(), second = gpu_first ? Device::cpu() : kGpu;
    Tensor a = start.to(first).requires_grad_();
    optim::SGD a_opt({a}, o);
    for (int64_t s = 0; s < 2; ++s) {
      autograd::set_sparse_grad(a, step_grad(s, DType::Float32, first));
      a_opt.step();
      a_opt.zero_grad();
    }
    const optim::OptimizerState saved = a_opt.state_dict();
    ASSERT_TRUE(saved.tensors.count("state.0.momentum_rows"));
    ASSERT_FALSE(saved.tensors.count("state.0.momentum_mask"));
    Tensor b = a.detach().to(second).requires_grad_();
    optim::SGD b_opt({b}, o);
    b_opt.load_state_dict(saved);
    for (int64_t s = 2; s < 4; ++s) {
      autograd::set_sparse_grad(b, step_grad(s, DType::Float32, second));
      b_opt.step();
      b_opt.zero_grad();
    }
    expect_close(b, ref, true, 0, "param");
    expect_close(b_opt.state(b).at("momentum_buffer"), ref_opt.state(ref).at("momentum_buffer"), true, 0, "buffer");
    EXPECT_EQ(values(b_opt.state_dict().tensors.at("state.0.momentum_rows")),
              values(ref_opt.state_dict().tensors.at("state.0.momentum_rows")));
  }
}

TEST(SparseFusedCuda, ManyEmbeddingTablesTrainAsOnTheCpu) {
  KILN_REQUIRE_GPU();
  // Twenty sparse tables in one SparseAdam, trained end to end: the fused steps give the CPU's tables bit for bit.
  manual_seed(3);
  std::vector<std::shared_ptr<nn::Embedding>> cpu_tables, gpu_tables;
  std::vector<Tensor> cpu_params, gpu_params;
  for (int t = 0; t < 20; ++t) {
    cpu_tables.push_back(std::make_shared<nn::Embedding>(50 + t, 8, nn::EmbeddingOptions{.sparse = true}));
    gpu_tables.push_back(std::make_shared<nn::Embedding>(50 + t, 8, nn::EmbeddingOptions{.sparse = true}));
    {
      NoGradGuard no_grad;
      gpu_tables.back()->weight.copy_(cpu_tables.back()->weight);
    }
    gpu_tables.back()->to(kGpu);
    cpu_params.push_back(cpu_tables.back()->weight);
    gpu_params.push_back(gpu_tables.back()->weight);
  }
  optim::SparseAdam cpu_opt(cpu_params, {.lr = 0.05});
  optim::SparseAdam gpu_opt(gpu_params, {.lr = 0.05});
  for (int step = 0; step < 3; ++step) {
    Tensor cpu_loss, gpu_loss;
    for (int t = 0; t < 20; ++t) {
      const Tensor ids = make(uniform(64, 0, 49.99, 300 + 20 * step + t), {64}, {.dtype = DType::Int64});
      const Tensor target = make(uniform(64 * 8, -1, 1, 900 + step), {64, 8});
      const Tensor c = sum(square((*cpu_tables[t])(ids)-target));
      const Tensor g = sum(square((*gpu_tables[t])(ids.to(kGpu)) - target.to(kGpu)));
      cpu_loss = cpu_loss.defined() ? cpu_loss + c : c;
      gpu_loss = gpu_loss.defined() ? gpu_loss + g : g;
    }
    cpu_loss.backward();
    gpu_loss.backward();
    cpu_opt.step();
    gpu_opt.step();
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
  }
  for (int t = 0; t < 20; ++t) expect_close(gpu_params[t], cpu_params[t], true, 0, "table " + std::to_string(t));
}

}  // namespace
}  // namespace kiln::testing
