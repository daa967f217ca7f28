// Layers and losses against golden values computed by PyTorch (tests/golden/make_golden.py): outputs and
// the gradients of sum(out * grad_out), in float64 on the CPU, and the same through cuda:0 where a GPU
// is visible (looser tolerances there: different summation orders).
#include <gtest/gtest.h>

#include "kiln/layers/functional.h"
#include "kiln/layers/loss.h"
#include "support/golden.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class GoldenTest : public GoldenBackendTest {};

TEST_P(GoldenTest, Linear) {
  const Golden g = load_golden("linear");
  Tensor x = in(g, "x"), w = in(g, "weight"), b = in(g, "bias");
  Tensor y = nn::linear(x, w, b);
  expect(y, g, "out");
  (y * plain(g, "grad_out")).sum().backward();
  expect(x.grad(), g, "grad_x");
  expect(w.grad(), g, "grad_weight");
  expect(b.grad(), g, "grad_bias");
}

TEST_P(GoldenTest, LayerNorm) {
  const Golden g = load_golden("layer_norm");
  Tensor x = in(g, "x"), w = in(g, "weight"), b = in(g, "bias");
  Tensor y = nn::layer_norm(x, {4}, w, b, 1e-5);
  expect(y, g, "out");
  (y * plain(g, "grad_out")).sum().backward();
  expect(x.grad(), g, "grad_x");
  expect(w.grad(), g, "grad_weight");
  expect(b.grad(), g, "grad_bias");
}

TEST_P(GoldenTest, BatchNormTrainingUpdatesRunningStatistics) {
  const Golden g = load_golden("batch_norm_train");
  Tensor x = in(g, "x"), w = in(g, "weight"), b = in(g, "bias");
  Tensor rm = plain(g, "running_mean_before").clone(), rv = plain(g, "running_var_before").clone();
  Tensor y = nn::batch_norm(x, rm, rv, w, b, /*training=*/true, 0.1, 1e-5);
  expect(y, g, "out");
  expect(rm, g, "running_mean_after");
  expect(rv, g, "running_var_after");
  (y * plain(g, "grad_out")).sum().backward();
  expect(x.grad(), g, "grad_x");
  expect(w.grad(), g, "grad_weight");
  expect(b.grad(), g, "grad_bias");
}

TEST_P(GoldenTest, BatchNormEval) {
  const Golden g = load_golden("batch_norm_eval");
  Tensor x = in(g, "x");
  Tensor y = nn::batch_norm(x, plain(g, "running_mean"), plain(g, "running_var"), plain(g, "weight"), plain(g, "bias"),
                            /*training=*/false, 0.1, 1e-5);
  expect(y, g, "out");
  (y * plain(g, "grad_out")).sum().backward();
  expect(x.grad(), g, "grad_x");
}

TEST_P(GoldenTest, CrossEntropyWithIndicesWeightsIgnoreIndexAndSmoothing) {
  const Golden g = load_golden("cross_entropy_indices");
  Tensor logits = in(g, "logits");
  Tensor target = g.get("target", DType::Int64).to(dev());
  Tensor y =
      nn::cross_entropy(logits, target, {.weight = plain(g, "weight"), .ignore_index = -100, .label_smoothing = 0.1});
  expect(y, g, "out");
  (y * plain(g, "grad_out")).sum().backward();
  expect(logits.grad(), g, "grad_logits");
}

TEST_P(GoldenTest, CrossEntropyWithProbabilitiesOverExtraDims) {
  const Golden g = load_golden("cross_entropy_probabilities");
  Tensor logits = in(g, "logits");
  Tensor y = nn::cross_entropy(logits, plain(g, "target"), {.reduction = nn::Reduction::Sum, .label_smoothing = 0.2});
  expect(y, g, "out");
  (y * plain(g, "grad_out")).sum().backward();
  expect(logits.grad(), g, "grad_logits");
}

KILN_INSTANTIATE_BACKENDS(GoldenTest);

}  // namespace
}  // namespace kiln::testing
