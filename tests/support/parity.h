// tests/support/parity.h — training parity with PyTorch: the same models, starting weights, batches and optimizer
// settings as tests/golden/make_golden_parity.py, trained for 20 steps in kiln, and compared with the PyTorch run
// that the script stored (parity_<case>_<device>_<precision>.golden).
//
//   parity::Run run = parity::train(parity::Case::ResNet18Cifar, {.device = Device::cpu()});
//   parity::Report r = parity::compare(run, load_golden("parity_resnet18_cifar_cpu_f32", ...), "cpu f32");
//   EXPECT_LE(r.loss.error, 1e-4) << r.loss.where;
//
// Weights are set from a formula of each tensor's name (formula.h; no weight file), a realistic initialisation:
// kaiming-uniform convolutions, zero-initialised last BatchNorm of each residual branch, BERT's std-0.02 weights.
// The script's docstring states the cases and the formula.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "support/golden.h"

namespace kiln::testing::parity {

enum class Case { ResNet18Cifar, ResNet50, BertMaskedLM };
std::string case_name(Case c);  // "resnet18_cifar", "resnet50", "bert_mlm": the golden files' middle part

inline constexpr int kSteps = 20;

struct Config {
  Device device = Device::cpu();
  // bf16 autocast with the ResNets (model and images) channels-last, as bench/bench_train: the benchmarked
  // configuration (its fused paths are kiln's defaults).
  bool bf16 = false;
  // Steps 2..20 as replays of a cuda::Graph (step 1 eager, step 2 the capture's warm-up run); each replay is fed
  // its batch by copying it into the captured input tensors, as a training loop would.
  bool graph = false;
};

struct Run {
  std::vector<double> losses;                        // kSteps, each step's loss before its update
  std::map<std::string, std::vector<double>> grad1;  // the first step's gradient of every parameter
  std::map<std::string, std::vector<double>> delta;  // final - initial (float64) of every float tensor of
                                                     // state_dict(), tied names each
};

// The model of `c` from the formula's weights, trained kSteps steps on the formula's batches.
Run train(Case c, const Config& config);

// The largest error of one kind of value, and where.
struct Worst {
  double error = 0;
  std::string where;
  void take(double e, const std::string& w) {
    if (!(e <= error)) error = e, where = w;  // NaN wins
  }
};

// How far a run is from a reference (the PyTorch golden file, or another kiln run):
//   loss   max over steps of |loss - ref| / |ref|; loss_early the same over the first half of the steps (rounding
//          differences grow as training carries them forward: the early steps are held to a tighter bound)
//   grad1  max over parameters of the first step's gradient error, relative to the reference's scale: the
//          larger of |norm - ref norm| / ref norm, |sum - ref sum| / (|ref sum| + ref norm), and over the 32
//          sampled elements max |g_i - ref_i| / ref rms
//   delta  the same for the change over all the steps (final - initial weights and running statistics)
//   grad1_global, delta_global  the relative L2 error over the whole model, each sampled element standing for n / 32
//          of its tensor: what bf16 runs are held to, where single small tensors (a BatchNorm bias's gradient, a
//          sum of many terms that nearly cancel) are off by their whole size
// Errors are relative to the reference's scale but at least `noise_floor` times the largest reference rms of the
// same kind (a tensor that barely moves is compared on that absolute floor). Tensors whose exact gradient is zero
// (the attention key bias: softmax ignores a shift shared by all keys) carry rounding noise only, which AdamW
// magnifies to steps of up to lr: their rms need only stay below 0.1 of the largest reference rms.
struct Report {
  Worst loss, loss_early, grad1, delta;
  double grad1_global = 0, delta_global = 0;  // whole model: ||run - ref|| / ||ref|| over all tensors' samples
  std::string summary(const std::string& label) const;
};
Report compare(const Run& run, const Golden& golden, double noise_floor = 1e-3);
Report compare(const Run& run, const Run& reference, double noise_floor = 1e-3);

// load_golden for parity_<case>_<suffix> ("cpu_f32", "cuda_bf16"), failing with the script's command line.
Golden load_parity_golden(Case c, const std::string& suffix);

}  // namespace kiln::testing::parity
