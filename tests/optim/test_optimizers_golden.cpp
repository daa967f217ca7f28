// tests/optim/test_optimizers_golden.cpp — SGD, Adam and AdamW against trajectories computed by torch.optim
// (tests/golden/make_golden_optim.py; files tests/golden/data/optim_<case>.golden). A missing file fails
// the test, naming the script (the same cases are also checked against the float64 references of optim_reference.h).
#include <gtest/gtest.h>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "optim/optim_reference.h"
#include "support/golden.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using namespace optim_ref;

// The golden file of a case, or nothing when it has not been made yet.
// Replays a case's golden trajectory with parameters on `dev` in `dtype`.
void check_golden_case(const Case& c, const Golden& g, Device dev, DType dtype, double rtol, double atol) {
  SCOPED_TRACE(c.name + " on " + dev.str());
  std::vector<Tensor> p, a, b;
  // GCC 12 warns (-Wrestrict, a false positive) on chains of std::string additions here: names are spelled out.
  const char* const kNames[2][3] = {{"p0.init", "p0.a", "p0.b"}, {"p1.init", "p1.a", "p1.b"}};
  for (int i = 0; i < 2; ++i) {
    p.push_back(internal::to(g.get(kNames[i][0]), dev, dtype).requires_grad_());
    a.push_back(internal::to(g.get(kNames[i][1]), dev, dtype));
    b.push_back(internal::to(g.get(kNames[i][2]), dev, dtype));
  }
  auto opt = make_optimizer(c.options, p[0], p[1]);
  for (int k = 1; k <= 5; ++k) {
    for (int i = 0; i < 2; ++i) p[i].mutable_grad() = internal::add(internal::mul(a[i], p[i].detach()), b[i]);
    opt->step();
    for (int i = 0; i < 2; ++i) {
      std::string key = "p";
      key += std::to_string(i);
      key += ".step";
      key += std::to_string(k);
      expect_golden(p[i], g, key, rtol, atol);
    }
  }
}

// Every case's golden file; a missing one fails the test, naming the script that makes it.
void run_golden(Device dev, DType dtype, double rtol, double atol) {
  for (const Case& c : torch_cases()) {
    const Golden g = load_golden("optim_" + c.name, "python3 tests/golden/make_golden_optim.py tests/golden/data");
    check_golden_case(c, g, dev, dtype, rtol, atol);
  }
}

TEST(OptimizersGolden, TorchTrajectoriesFloat64) { run_golden(Device::cpu(), DType::Float64, 1e-10, 1e-12); }

TEST(CudaOptimizersGolden, TorchTrajectoriesFloat32) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  run_golden(Device::cuda(0), DType::Float32, 5e-5, 5e-6);
}

}  // namespace
}  // namespace kiln::testing
