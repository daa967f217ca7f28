// tests/support/golden.h — reading the golden files that tests/golden/make_golden.py writes with PyTorch.
//
//   Golden g = load_golden("linear");             // tests/golden/data/linear.golden
//   Tensor x = g.leaf("x");                       // float64 CPU, requires grad
//   expect_golden(kiln_out, g, "out");            // shape and values, float64 tolerances
#pragma once

#include <map>
#include <string>

#include "kiln/kiln.h"
#include "support/test_support.h"  // BackendTest

namespace kiln::testing {

struct Golden {
  std::string name;
  std::map<std::string, Tensor> tensors;                  // float64, CPU
  Tensor get(const std::string& key) const;               // throws naming the file and key when absent
  Tensor leaf(const std::string& key) const;              // a fresh copy that requires grad
  Tensor get(const std::string& key, DType dtype) const;  // converted, e.g. Int64 targets
};

// Reads tests/golden/data/<name>.golden (the folder is compiled in as KILN_GOLDEN_DIR). A missing or unreadable
// file throws (so the test fails rather than skips), naming the file and `made_by`: the command that makes it.
Golden load_golden(const std::string& name, const std::string& made_by = "python3 tests/golden/make_golden.py");

// actual (any dtype/device) against the golden tensor `key`: same shape, values within rtol/atol.
void expect_golden(const Tensor& actual, const Golden& golden, const std::string& key, double rtol = 1e-9,
                   double atol = 1e-12);

// A golden test on each test device: golden tensors moved to dev(), compared with float64 tolerances
// (looser on a GPU: other summation orders).
class GoldenBackendTest : public BackendTest {
 protected:
  Tensor in(const Golden& g, const std::string& key) { return g.get(key).to(dev()).requires_grad_(); }
  Tensor plain(const Golden& g, const std::string& key) { return g.get(key).to(dev()); }
  void expect(const Tensor& t, const Golden& g, const std::string& key) {
    expect_golden(t, g, key, dev().is_cpu() ? 1e-9 : 1e-7, 1e-10);
  }
};

}  // namespace kiln::testing
