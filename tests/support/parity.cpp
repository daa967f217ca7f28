#include "support/parity.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <sstream>

#include "kiln/tensor/cuda.h"  // cuda::Graph
#include "support/formula.h"   // fnv1a64, splitmix64, uniform
#include "support/test_support.h"

namespace kiln::testing::parity {
namespace {

constexpr int kNumBatches = 4;
constexpr int kSamples = 32;

// The script's RESNET, SGD, BERT and ADAMW tables.
struct ResNetCase {
  int64_t batch, size, classes;
  double lr;
};
ResNetCase resnet_case(Case c) {
  return c == Case::ResNet18Cifar ? ResNetCase{8, 32, 10, 0.01} : ResNetCase{4, 64, 10, 0.005};
}
constexpr double kMomentum = 0.9, kSgdWeightDecay = 5e-4;
constexpr int64_t kVocab = 1000, kBertBatch = 4, kSeq = 32;

nn::models::BertConfig bert_config() {
  return {.vocab_size = kVocab,
          .hidden_size = 128,
          .num_hidden_layers = 2,
          .num_attention_heads = 4,
          .intermediate_size = 512,
          .max_position_embeddings = 64,
          .type_vocab_size = 2,
          .hidden_dropout_prob = 0,
          .attention_probs_dropout_prob = 0};
}

std::vector<double> uniform_values(const std::string& name, int64_t n, double scale) {
  const uint64_t h = formula::fnv1a64(name);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<double>(static_cast<float>(formula::uniform(h, i) * scale));
  return v;
}

std::vector<int64_t> ints(const std::string& name, int64_t n, uint64_t m) {
  const uint64_t h = formula::fnv1a64(name);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<int64_t>(formula::splitmix64(h + static_cast<uint64_t>(i)) % m);
  return v;
}

bool ends_with(const std::string& s, const std::string& tail) { return s.ends_with(tail); }

// The script's init_value: the float32 starting value of a parameter or buffer.
std::vector<double> init_value(Case c, const std::string& name, const Shape& shape) {
  const int64_t n = kiln::numel(shape);
  const std::string last = name.substr(name.rfind('.') == std::string::npos ? 0 : name.rfind('.') + 1);
  if (last == "running_var") return std::vector<double>(static_cast<size_t>(n), 1.0);
  if (last == "running_mean") return std::vector<double>(static_cast<size_t>(n), 0.0);
  if (shape.size() >= 2) {
    if (c == Case::BertMaskedLM) return uniform_values(name, n, 0.02 * std::sqrt(3.0));
    if (shape.size() == 4)
      return uniform_values(name, n, std::sqrt(6.0 / static_cast<double>(shape[0] * shape[2] * shape[3])));
    return uniform_values(name, n, 1.0 / std::sqrt(static_cast<double>(shape[1])));
  }
  if (last == "weight") {
    const bool zero = (c == Case::ResNet18Cifar && ends_with(name, ".bn2.weight")) ||
                      (c == Case::ResNet50 && ends_with(name, ".bn3.weight"));
    return std::vector<double>(static_cast<size_t>(n), zero ? 0.0 : 1.0);
  }
  return std::vector<double>(static_cast<size_t>(n), 0.0);
}

void set_init(Case c, nn::Module& model) {
  NoGradGuard no_grad;
  auto set = [&](const std::string& name, Tensor t) {
    if (t.is_floating_point())
      t.copy_(make(init_value(c, name, t.shape()), t.shape(), {.dtype = t.dtype(), .device = t.device()}));
  };
  for (auto& [name, p] : model.named_parameters()) set(name, p);
  for (auto& [name, b] : model.named_buffers()) set(name, b);
}

// One batch's tensors, on the CPU: ResNet {images, labels}; BERT {input_ids, token_type_ids, attention_mask,
// labels}.
std::vector<Tensor> make_batch(Case c, int k) {
  const std::string p = "batch." + std::to_string(k) + ".";
  if (c != Case::BertMaskedLM) {
    const ResNetCase r = resnet_case(c);
    const Shape shape{r.batch, 3, r.size, r.size};
    const Tensor x = make(uniform_values(p + "input", kiln::numel(shape), std::sqrt(3.0)), shape);
    const std::vector<int64_t> y = ints(p + "labels", r.batch, static_cast<uint64_t>(r.classes));
    return {x, make(std::vector<double>(y.begin(), y.end()), {r.batch}, {.dtype = DType::Int64})};
  }
  const int64_t b = kBertBatch, s = kSeq, n = b * s;
  std::vector<int64_t> ids = ints(p + "input_ids", n, kVocab - 5);
  const std::vector<int64_t> draw = ints(p + "mask", n, 100);
  std::vector<double> id(static_cast<size_t>(n)), types(static_cast<size_t>(n)), mask(static_cast<size_t>(n)),
      labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t t = 0; t < s; ++t) {
      const size_t j = static_cast<size_t>(i * s + t);
      const bool token = !(i % 2 == 1 && t >= s - 8);  // odd sequences end in 8 padding tokens
      const bool pick = token && t > 0 && draw[j] < 15;
      const int64_t original = t == 0 ? 2 : ids[j] + 5;  // [CLS] first; 0 padding, 1-4 special
      mask[j] = token ? 1 : 0;
      labels[j] = pick ? static_cast<double>(original) : -100.0;
      id[j] = !token ? 0.0 : pick ? 4.0 : static_cast<double>(original);  // 4: [MASK]
      types[j] = token && t >= s / 2 ? 1 : 0;
    }
  }
  const TensorOptions i64{.dtype = DType::Int64};
  return {make(id, {b, s}, i64), make(types, {b, s}, i64), make(mask, {b, s}, i64), make(labels, {b, s}, i64)};
}

std::vector<double> float64_values(const Tensor& t) { return values(t.detach()); }

// The script's stats(): sum, L2 norm, then kSamples elements at (j * n) // k.
struct Stats {
  double sum = 0, norm = 0;
  std::vector<double> samples;
};
Stats stats_of(const std::vector<double>& v) {
  Stats s;
  double squares = 0;
  for (double x : v) s.sum += x, squares += x * x;
  s.norm = std::sqrt(squares);
  const size_t n = v.size(), k = std::min<size_t>(kSamples, n);
  for (size_t j = 0; j < k; ++j) s.samples.push_back(v[(j * n) / k]);
  return s;
}
Stats stats_from_golden(const std::vector<double>& e) {
  Stats s;
  s.sum = e.at(0);
  s.norm = e.at(1);
  s.samples.assign(e.begin() + 2, e.end());
  return s;
}

bool exact_zero_gradient(const std::string& name) { return name.ends_with("attention.self.key.bias"); }

// The error of `a` against reference `r` (n elements), relative to the reference's scale, with an absolute floor.
double stats_error(const Stats& a, const Stats& r, size_t n, double floor) {
  if (a.samples.size() != r.samples.size()) return kInf;
  const double rms = r.norm / std::sqrt(static_cast<double>(std::max<size_t>(n, 1)));
  auto rel = [&](double diff, double scale) {
    if (std::isnan(diff)) return kNaN;
    return std::abs(diff) / std::max(scale, floor);
  };
  double e = std::max(rel(a.norm - r.norm, r.norm), rel(a.sum - r.sum, std::abs(r.sum) + r.norm));
  for (size_t i = 0; i < r.samples.size(); ++i) e = std::max(e, rel(a.samples[i] - r.samples[i], rms));
  return e;
}

// One kind of tensor (grad1 or delta) against the reference's stats: the largest error, floors as compare() says,
// and the relative L2 error over the whole model (from the sampled elements, each standing for n / k of its tensor).
Worst compare_kind(const std::map<std::string, std::vector<double>>& run,
                   const std::map<std::string, std::pair<Stats, size_t>>& ref, double noise_floor, double* global) {
  double scale = 0;
  for (const auto& [name, s] : ref)
    if (!exact_zero_gradient(name)) scale = std::max(scale, s.first.norm / std::sqrt(static_cast<double>(s.second)));
  const double floor = noise_floor * scale;
  Worst w;
  double squared_error = 0, squared_ref = 0;
  for (const auto& [name, s] : ref) {
    auto it = run.find(name);
    if (it == run.end()) {
      w.take(kInf, name + " (absent from kiln's run)");
      continue;
    }
    if (it->second.size() != s.second) {
      w.take(kInf, name + " (another size)");
      continue;
    }
    if (exact_zero_gradient(name)) {  // rounding noise in both runs: it need only stay small
      const double rms = stats_of(it->second).norm / std::sqrt(static_cast<double>(s.second));
      w.take(rms <= 0.1 * scale ? 0.0 : rms / scale, name + " (rounding noise, should stay below 0.1 of the largest)");
      continue;
    }
    const Stats a = stats_of(it->second);
    w.take(stats_error(a, s.first, s.second, floor), name);
    const double weight = static_cast<double>(s.second) / static_cast<double>(s.first.samples.size());
    for (size_t i = 0; i < s.first.samples.size() && i < a.samples.size(); ++i) {
      squared_error += weight * (a.samples[i] - s.first.samples[i]) * (a.samples[i] - s.first.samples[i]);
      squared_ref += weight * s.first.samples[i] * s.first.samples[i];
    }
  }
  *global = squared_ref > 0 ? std::sqrt(squared_error / squared_ref) : (squared_error > 0 ? kInf : 0.0);
  // A tensor the reference does not have is a mismatch too.
  for (const auto& [name, v] : run)
    if (!ref.count(name)) w.take(kInf, name + " (absent from the reference)");
  return w;
}

Worst compare_losses(const std::vector<double>& run, const std::vector<double>& ref, size_t steps) {
  Worst w;
  if (run.size() != ref.size()) {
    w.take(kInf, "the number of steps");
    return w;
  }
  for (size_t i = 0; i < std::min(steps, ref.size()); ++i)
    w.take(std::abs(run[i] - ref[i]) / std::abs(ref[i]), "step " + std::to_string(i + 1));
  return w;
}

using RefStats = std::map<std::string, std::pair<Stats, size_t>>;

RefStats stats_map(const std::map<std::string, std::vector<double>>& m) {
  RefStats out;
  for (const auto& [name, v] : m) out[name] = {stats_of(v), v.size()};
  return out;
}

}  // namespace

std::string case_name(Case c) {
  switch (c) {
    case Case::ResNet18Cifar: return "resnet18_cifar";
    case Case::ResNet50: return "resnet50";
    case Case::BertMaskedLM: return "bert_mlm";
  }
  return "?";
}

Golden load_parity_golden(Case c, const std::string& suffix) {
  const bool gpu = suffix.starts_with("cuda");
  return load_golden(
      "parity_" + case_name(c) + "_" + suffix,
      gpu ? "python3 tests/golden/make_golden_parity.py tests/golden/data --device cuda --bf16 on the GPU "
            "machine (needs torch, torchvision, transformers)"
          : "python3 tests/golden/make_golden_parity.py tests/golden/data (needs torch, torchvision, "
            "transformers)");
}

Run train(Case c, const Config& config) {
  const Device dev = config.device;
  const bool resnet = c != Case::BertMaskedLM;
  KILN_CHECK(!config.graph || dev.is_cuda(), "parity::train: graph replay needs a GPU");
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<nn::models::BertForMaskedLM> bert;
  if (c == Case::ResNet18Cifar) model = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});
  if (c == Case::ResNet50) model = nn::models::resnet50({.num_classes = 10});
  if (!resnet) model = bert = std::make_shared<nn::models::BertForMaskedLM>(bert_config());
  set_init(c, *model);
  const bool channels_last = resnet && config.bf16;
  if (channels_last) {
    model->to(dev, MemoryFormat::ChannelsLast);
  } else {
    model->to(dev);
  }
  model->train();

  std::map<std::string, std::vector<double>> initial;
  for (const auto& [name, t] : model->state_dict())
    if (t.is_floating_point()) initial[name] = float64_values(t);

  std::unique_ptr<optim::Optimizer> opt;
  if (resnet) {
    opt = std::make_unique<optim::SGD>(
        model->parameters(),
        optim::SGDOptions{.lr = resnet_case(c).lr, .momentum = kMomentum, .weight_decay = kSgdWeightDecay});
  } else {
    opt = std::make_unique<optim::AdamW>(
        model->parameters(), optim::AdamWOptions{.lr = 1e-3, .betas = {0.9, 0.999}, .eps = 1e-8, .weight_decay = 0.01});
  }
  // The batches on the device (images in the model's memory format), and the inputs the step reads: each step
  // copies its batch into them (outside a capture; before each replay).
  std::vector<std::vector<Tensor>> batches;
  for (int k = 0; k < kNumBatches; ++k) {
    std::vector<Tensor> b = make_batch(c, k);
    for (Tensor& t : b) t = t.to(dev);
    if (channels_last) b[0] = b[0].contiguous(MemoryFormat::ChannelsLast);
    batches.push_back(b);
  }
  std::vector<Tensor> in;
  for (const Tensor& t : batches[0]) in.push_back(t.clone());
  int next_step = 0;  // the step whose batch the inputs hold after feed()
  auto feed = [&] {
    const std::vector<Tensor>& b = batches[static_cast<size_t>(next_step % kNumBatches)];
    for (size_t i = 0; i < in.size(); ++i) in[i].copy_(b[i]);
  };

  Run run;
  std::vector<Tensor> losses;  // the eager steps' loss tensors (read at the end: no sync on the way)
  Tensor loss;
  auto step = [&] {
    if (!cuda::Graph::capturing()) {
      feed();
      ++next_step;
    }
    opt->zero_grad(true);
    {
      amp::Autocast cast(DType::BFloat16, /*enabled=*/config.bf16);
      loss = resnet ? nn::cross_entropy((*model)(in[0]), in[1]) : bert->forward(in[0], in[1], in[2], in[3]).loss;
    }
    loss.backward();
    if (run.grad1.empty()) {
      for (const auto& [name, p] : model->named_parameters()) {
        EXPECT_TRUE(p.grad().defined()) << name << " has no gradient after the first step";
        if (p.grad().defined()) run.grad1[name] = float64_values(p.grad());
      }
    }
    opt->step();
    if (!cuda::Graph::capturing()) losses.push_back(loss);
  };

  if (!config.graph) {
    for (int i = 0; i < kSteps; ++i) step();
  } else {
    step();  // step 1 eagerly (its gradients read), step 2 the capture's warm-up run, then replays
    cuda::Graph graph;
    graph.capture(step, /*warmup=*/1);
    std::vector<double> replayed;
    while (next_step < kSteps) {
      feed();
      ++next_step;
      graph.replay();
      replayed.push_back(loss.item<double>());
    }
    for (const Tensor& l : losses) run.losses.push_back(l.item<double>());
    run.losses.insert(run.losses.end(), replayed.begin(), replayed.end());
  }
  if (!config.graph)
    for (const Tensor& l : losses) run.losses.push_back(l.item<double>());

  for (const auto& [name, t] : model->state_dict()) {
    if (!t.is_floating_point()) continue;
    std::vector<double> v = float64_values(t);
    const std::vector<double>& v0 = initial.at(name);
    for (size_t i = 0; i < v.size(); ++i) v[i] -= v0[i];
    run.delta[name] = std::move(v);
  }
  return run;
}

Report compare(const Run& run, const Golden& golden, double noise_floor) {
  Report r;
  const std::vector<double> losses = golden.get("loss").to_vector<double>();
  r.loss = compare_losses(run.losses, losses, kSteps);
  r.loss_early = compare_losses(run.losses, losses, kSteps / 2);
  RefStats grad1, delta;
  for (const auto& [key, t] : golden.tensors) {
    const std::vector<double> e = t.to_vector<double>();
    auto numel_of = [&](const std::map<std::string, std::vector<double>>& m, const std::string& name) -> size_t {
      auto it = m.find(name);
      return it == m.end() ? 0 : it->second.size();
    };
    if (key.starts_with("grad1.")) {
      const std::string name = key.substr(6);
      grad1[name] = {stats_from_golden(e), numel_of(run.grad1, name)};
    } else if (key.starts_with("delta.")) {
      const std::string name = key.substr(6);
      delta[name] = {stats_from_golden(e), numel_of(run.delta, name)};
    }
  }
  r.grad1 = compare_kind(run.grad1, grad1, noise_floor, &r.grad1_global);
  r.delta = compare_kind(run.delta, delta, noise_floor, &r.delta_global);
  return r;
}

Report compare(const Run& run, const Run& reference, double noise_floor) {
  Report r;
  r.loss = compare_losses(run.losses, reference.losses, kSteps);
  r.loss_early = compare_losses(run.losses, reference.losses, kSteps / 2);
  r.grad1 = compare_kind(run.grad1, stats_map(reference.grad1), noise_floor, &r.grad1_global);
  r.delta = compare_kind(run.delta, stats_map(reference.delta), noise_floor, &r.delta_global);
  return r;
}

std::string Report::summary(const std::string& label) const {
  std::ostringstream s;
  s << label << ": loss max rel " << loss.error << " (" << loss.where << "; steps 1-" << kSteps / 2 << ": "
    << loss_early.error << ", " << loss_early.where << "), first-step gradient max rel " << grad1.error << " ("
    << grad1.where << "; whole model " << grad1_global << "), update max rel " << delta.error << " (" << delta.where
    << "; whole model " << delta_global << ")";
  return s.str();
}

}  // namespace kiln::testing::parity
