#include "support/golden.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "support/test_support.h"

namespace kiln::testing {

Tensor Golden::get(const std::string& key) const {
  auto it = tensors.find(key);
  KILN_CHECK(it != tensors.end(), "golden file '", name, "' has no tensor '", key,
             "'; regenerate the files with tests/golden/make_golden.py");
  return it->second;
}

Tensor Golden::leaf(const std::string& key) const { return get(key).clone().requires_grad_(); }

Tensor Golden::get(const std::string& key, DType dtype) const { return get(key).to(dtype); }

Golden load_golden(const std::string& name, const std::string& made_by) {
  const std::string path = std::string(KILN_GOLDEN_DIR) + "/" + name + ".golden";
  std::ifstream in(path);
  KILN_CHECK(in.good(), "cannot open the golden file ", path, "; make it with: ", made_by,
             " (where PyTorch is installed), and commit it");
  Golden g;
  g.name = name;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream header(line);
    std::string word, key;
    int64_t ndim = 0;
    header >> word >> key >> ndim;
    KILN_CHECK(word == "tensor" && ndim >= 0, path, ": expected a 'tensor <name> <ndim> <dims...>' line, got '", line,
               "'");
    Shape shape(static_cast<size_t>(ndim));
    for (auto& s : shape) header >> s;
    std::getline(in, line);
    std::istringstream body(line);
    std::vector<double> values;
    double v = 0;
    while (body >> v) values.push_back(v);
    KILN_CHECK(static_cast<int64_t>(values.size()) == kiln::numel(shape), path, ": tensor '", key, "' has ",
               values.size(), " values for shape ", shape);
    g.tensors[key] = from_vector(values, shape);
  }
  return g;
}

void expect_golden(const Tensor& actual, const Golden& golden, const std::string& key, double rtol, double atol) {
  SCOPED_TRACE("golden '" + golden.name + "', tensor '" + key + "'");
  const Tensor expected = golden.get(key);
  expect_values(actual, expected.shape(), expected.to_vector<double>(), rtol, atol);
}

}  // namespace kiln::testing
