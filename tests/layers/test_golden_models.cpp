// Whole models against PyTorch: torchvision's ResNet-18 (train and eval mode) and Hugging Face's BERT
// (BertForMaskedLM, BertForSequenceClassification), from the golden files resnet18, bert_mlm and bert_cls
// that tests/golden/make_golden.py writes. No weights are stored: both sides set every floating-point
// parameter and buffer from the same formula of its name (formula_values below, `formula_values` in the
// script), so these tests also check that kiln's names and shapes are torchvision's and Hugging Face's.
// Where a file is absent the test fails, saying how to make it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/autograd/grad_mode.h"  // NoGradGuard
#include "kiln/layers/loss.h"         // nn::cross_entropy
#include "kiln/layers/models/bert.h"
#include "kiln/layers/models/resnet.h"
#include "support/formula.h"  // fnv1a64, splitmix64, uniform
#include "support/golden.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

// ------------------------------------------------------------------ the parameter formula (as the script's)

using formula::fnv1a64;
using formula::splitmix64;
double formula_uniform(uint64_t hash, int64_t i) { return formula::uniform(hash, i); }

// The float32-rounded values of the tensor `name` (see make_golden.py for the table of cases).
std::vector<double> formula_values(const std::string& name, const Shape& shape) {
  const int64_t n = kiln::numel(shape);
  const uint64_t h = fnv1a64(name);
  const std::string last = name.substr(name.rfind('.') == std::string::npos ? 0 : name.rfind('.') + 1);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double u = formula_uniform(h, i);
    double v = 0;
    if (name == "input") {
      v = u;
    } else if (last == "running_var") {
      v = 1.0 + 0.5 * u;
    } else if (last == "running_mean") {
      v = 0.1 * u;
    } else if (shape.size() >= 2) {
      v = u * std::sqrt(3.0 / static_cast<double>(n / shape[0]));
    } else if (last.ends_with("weight")) {
      v = 1.0 + 0.25 * u;
    } else {
      v = 0.1 * u;
    }
    out[static_cast<size_t>(i)] = static_cast<double>(static_cast<float>(v));
  }
  return out;
}

Tensor formula_tensor(const std::string& name, const Shape& shape, const TensorOptions& options) {
  return make(formula_values(name, shape), shape, options);
}

// Every floating-point parameter and buffer from the formula; a tied tensor once, under its first name.
void set_formula(nn::Module& model) {
  NoGradGuard no_grad;
  auto set = [](const std::string& name, Tensor t) {
    if (t.is_floating_point()) t.copy_(formula_tensor(name, t.shape(), {.dtype = t.dtype(), .device = t.device()}));
  };
  for (auto& [name, p] : model.named_parameters()) set(name, p);
  for (auto& [name, b] : model.named_buffers()) set(name, b);
}

// The formula and its hash against values computed by hand and by the script's own code (numpy), so a
// change on one side shows here even before the golden files exist.
TEST(GoldenModelFormula, MatchesTheScriptsValues) {
  // FNV-1a 64 and splitmix64 published test vectors.
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ULL);
  EXPECT_EQ(splitmix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(splitmix64(0x9e3779b97f4a7c15ULL), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(fnv1a64("conv1.weight"), 0x69a29a2cee47d254ULL);
  EXPECT_EQ(fnv1a64("bert.embeddings.word_embeddings.weight"), 0x4b7e64761fa81b3fULL);
  // u before rounding, then float32-rounded values of each kind (elements 0, 1, 7), from make_golden.py.
  EXPECT_EQ(formula_uniform(fnv1a64("conv1.weight"), 0), 0.09014995783428947);
  EXPECT_EQ(formula_uniform(fnv1a64("conv1.weight"), 1), -0.8503704580602125);
  EXPECT_EQ(formula_uniform(fnv1a64("bert.embeddings.word_embeddings.weight"), 2), 0.19118996801056998);
  const std::map<std::string, std::pair<Shape, std::vector<double>>> expected = {
      {"conv1.weight", {{64, 3, 7, 7}, {0.01287856511771679, -0.12148149311542511, -0.037443771958351135}}},
      {"bn1.running_var", {{64}, {1.1423076391220093, 0.9848067164421082, 0.6651532053947449}}},
      {"bn1.running_mean", {{64}, {0.04688999429345131, -0.02610040083527565, 0.06580211967229843}}},
      {"bn1.weight", {{64}, {0.9301019906997681, 0.9801400303840637, 0.8126415014266968}}},
      {"fc.bias", {{1000}, {-0.004469738807529211, -0.05491572991013527, -0.03520330786705017}}},
  };
  for (const auto& [name, case_] : expected) {
    SCOPED_TRACE(name);
    const std::vector<double> v = formula_values(name, case_.first);
    EXPECT_EQ(v[0], case_.second[0]);
    EXPECT_EQ(v[1], case_.second[1]);
    EXPECT_EQ(v[7], case_.second[2]);
  }
  // The image is u itself, rounded.
  EXPECT_EQ(formula_values("input", {2, 3, 64, 64})[0],
            static_cast<double>(static_cast<float>(formula_uniform(fnv1a64("input"), 0))));
}

// ------------------------------------------------------------------ reading the golden files

// The golden file; a missing one fails the test, saying how to make it.
Golden load_model_golden(const std::string& name) {
  return load_golden(name,
                     "python3 tests/golden/make_golden.py tests/golden/data models (needs torch, torchvision, "
                     "transformers)");
}

// The names and shapes listed under `prefix` ("param.", "state.", "saved."), in the file's order.
std::vector<std::pair<std::string, Shape>> golden_list(const Golden& g, const std::string& prefix) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [key, t] : g.tensors) {  // std::map: ordered by the zero-padded index after the prefix
    if (key.rfind(prefix, 0) != 0) continue;
    Shape shape;
    for (double d : t.to_vector<double>()) shape.push_back(static_cast<int64_t>(d));
    out.emplace_back(key.substr(prefix.size() + 5), shape);  // "param.0007.<name>"
  }
  return out;
}

std::vector<std::string> describe(const std::vector<std::pair<std::string, Shape>>& list) {
  std::vector<std::string> out;
  for (const auto& [name, shape] : list) {
    std::ostringstream line;
    line << name << " " << shape;
    out.push_back(line.str());
  }
  return out;
}

template <typename List>
std::vector<std::pair<std::string, Shape>> shapes_of(const List& named) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [name, t] : named) out.emplace_back(name, t.shape());
  return out;
}

// kiln's named_parameters() and state_dict() against PyTorch's: the same names, shapes and order.
void expect_same_names(const nn::Module& model, const Golden& g) {
  const auto params = golden_list(g, "param."), state = golden_list(g, "state.");
  ASSERT_FALSE(params.empty());
  EXPECT_EQ(describe(shapes_of(model.named_parameters())), describe(params));
  EXPECT_EQ(describe(shapes_of(model.state_dict())), describe(state));
}

// A whole tensor (logits, loss) against the golden one: |actual - expected| <= rtol * max |expected|.
void expect_output(const Tensor& actual, const Golden& g, const std::string& key, double rtol) {
  const std::vector<double> e = g.get(key).to_vector<double>();
  double scale = 0;
  for (double v : e) scale = std::max(scale, std::abs(v));
  expect_golden(actual, g, key, rtol, rtol * scale);
}

// The sum, L2 norm and first elements of t against the golden summary (make_golden.py's stats()), within
// rtol relative to the expected values (the norm for the sum, the root mean square for elements) plus atol.
void expect_stats(const Tensor& t, const Golden& g, const std::string& key, double rtol, double atol = 0) {
  SCOPED_TRACE("golden '" + g.name + "', " + key);
  ASSERT_TRUE(t.defined()) << "kiln has no tensor (gradient) for " << key;
  const std::vector<double> v = values(t);
  const std::vector<double> e = g.get(key).to_vector<double>();
  const size_t k = std::min<size_t>(16, v.size());
  ASSERT_EQ(e.size(), 2 + k);
  double sum = 0, squares = 0;
  for (double x : v) sum += x, squares += x * x;
  const double norm = std::sqrt(squares), rms = e[1] / std::sqrt(static_cast<double>(v.size()));
  EXPECT_NEAR(norm, e[1], rtol * e[1] + atol) << "L2 norm";
  EXPECT_NEAR(sum, e[0], rtol * (std::abs(e[0]) + e[1]) + atol) << "sum";
  for (size_t i = 0; i < k; ++i)
    EXPECT_NEAR(v[i], e[2 + i], rtol * (std::abs(e[2 + i]) + rms) + atol) << "element " << i;
}

// Every parameter's gradient (by PyTorch's parameter names) against "<prefix>grad.<name>". Some gradients
// are zero in exact arithmetic (a key bias: softmax ignores a shift shared by all keys) and rounding noise
// in both runs: the absolute floor is rtol / 10 of the largest gradient's root mean square.
void expect_grads(const nn::Module& model, const Golden& g, const std::string& prefix, double rtol) {
  std::map<std::string, Tensor> params;
  for (const auto& [name, p] : model.named_parameters()) params[name] = p;
  double scale = 0;
  for (const auto& [name, shape] : golden_list(g, "param."))
    scale = std::max(scale, g.get(prefix + "grad." + name).to_vector<double>()[1] /
                                std::sqrt(static_cast<double>(kiln::numel(shape))));
  for (const auto& [name, shape] : golden_list(g, "param.")) {
    auto it = params.find(name);
    if (it == params.end()) {
      ADD_FAILURE() << "kiln has no parameter " << name;
      continue;
    }
    expect_stats(it->second.grad(), g, prefix + "grad." + name, rtol, 0.1 * rtol * scale);
  }
}

// Tolerances: float64 runs differ from PyTorch's float64 only in summation order; float32 runs are
// compared with the float64 truth (relative 1e-4 on outputs, 1e-3 on gradients).
struct Tolerance {
  double out, grad;
};
Tolerance tolerance(DType dtype) { return dtype == DType::Float64 ? Tolerance{1e-8, 1e-7} : Tolerance{1e-4, 1e-3}; }

// float64 and float32 on the CPU; float32 (TF32 off) on a GPU.
std::vector<DType> dtypes_for(const Device& dev) {
  if (dev.is_cpu()) return {DType::Float64, DType::Float32};
  return {DType::Float32};
}

class GoldenModelsTest : public ExactFloat32Test {};

// ------------------------------------------------------------------ ResNet-18 (torchvision)

TEST_P(GoldenModelsTest, ResNet18NamesAndShapesAreTorchvisions) {
  const Golden g = load_model_golden("resnet18");
  expect_same_names(*nn::models::resnet18(), g);
}

// One training step's forward and backward (BatchNorm on batch statistics, running statistics updated),
// then an eval-mode forward and backward (running statistics), each from the formula's weights.
TEST_P(GoldenModelsTest, ResNet18TrainAndEvalMatchTorchvision) {
  const Golden g = load_model_golden("resnet18");
  for (DType dtype : dtypes_for(dev())) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tolerance tol = tolerance(dtype);
    auto model = nn::models::resnet18();
    model->to(dev(), dtype);
    const Tensor labels = g.get("labels", DType::Int64).to(dev());
    for (const std::string mode : {"train", "eval"}) {
      SCOPED_TRACE(mode);
      set_formula(*model);
      model->zero_grad();
      model->train(mode == "train");
      Tensor x = formula_tensor("input", {2, 3, 64, 64}, opts(dtype)).requires_grad_();
      Tensor logits = (*model)(x);
      Tensor loss = nn::cross_entropy(logits, labels);
      loss.backward();
      expect_output(logits, g, mode + ".logits", tol.out);
      expect_output(loss, g, mode + ".loss", tol.out);
      expect_stats(x.grad(), g, mode + ".grad_input", tol.grad);
      expect_grads(*model, g, mode + ".", tol.grad);
      if (mode == "train") {
        for (const auto& [name, b] : model->named_buffers())
          if (b.is_floating_point()) expect_stats(b, g, "train.buffer." + name, tol.out);
      }
    }
  }
}

// ------------------------------------------------------------------ BERT (Hugging Face)

nn::models::BertConfig small_bert() {
  return {.vocab_size = 100,
          .hidden_size = 64,
          .num_hidden_layers = 2,
          .num_attention_heads = 4,
          .intermediate_size = 128,
          .max_position_embeddings = 64,
          .type_vocab_size = 2};
}

struct BertInputs {
  Tensor input_ids, token_type_ids, attention_mask, labels;
};
BertInputs bert_inputs(const Golden& g, const Device& dev) {
  auto ids = [&](const char* key) { return g.get(key, DType::Int64).to(dev); };
  return {ids("input_ids"), ids("token_type_ids"), ids("attention_mask"), ids("labels")};
}

TEST_P(GoldenModelsTest, BertMaskedLMMatchesHuggingFace) {
  const Golden g = load_model_golden("bert_mlm");
  for (DType dtype : dtypes_for(dev())) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tolerance tol = tolerance(dtype);
    nn::models::BertForMaskedLM model(small_bert());
    if (dev().is_cpu() && dtype == DType::Float64) expect_same_names(model, g);
    // Hugging Face ties the decoder to the word embeddings (and its bias to cls.predictions.bias); so does kiln.
    EXPECT_EQ(g.get("tied.decoder_weight").item<double>(), 1.0);
    EXPECT_EQ(g.get("tied.decoder_bias").item<double>(), 1.0);
    EXPECT_TRUE(model.predictions->decoder_weight.is_same(model.bert->embeddings->word_embeddings->weight));
    model.eval();
    model.to(dev(), dtype);
    set_formula(model);
    const BertInputs in = bert_inputs(g, dev());
    auto out = model.forward(in.input_ids, in.token_type_ids, in.attention_mask, in.labels);
    out.loss.backward();
    expect_output(out.logits, g, "logits", tol.out);
    expect_output(out.loss, g, "loss", tol.out);
    // The tied weight's gradient sums the embedding lookup's and the decoder's, as PyTorch's.
    expect_grads(model, g, "", tol.grad);
  }
}

TEST_P(GoldenModelsTest, BertSequenceClassificationMatchesHuggingFace) {
  const Golden g = load_model_golden("bert_cls");
  for (DType dtype : dtypes_for(dev())) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tolerance tol = tolerance(dtype);
    nn::models::BertForSequenceClassification model(small_bert(), /*num_labels=*/3);
    if (dev().is_cpu() && dtype == DType::Float64) expect_same_names(model, g);
    model.eval();
    model.to(dev(), dtype);
    set_formula(model);
    const BertInputs in = bert_inputs(g, dev());
    auto out = model.forward(in.input_ids, in.token_type_ids, in.attention_mask, in.labels);
    out.loss.backward();
    expect_output(out.logits, g, "logits", tol.out);
    expect_output(out.loss, g, "loss", tol.out);
    expect_grads(model, g, "", tol.grad);
  }
}

// A state dict with exactly Hugging Face's keys and shapes, each filled from the formula under its own name.
nn::StateDict state_with_keys(const std::vector<std::pair<std::string, Shape>>& keys) {
  nn::StateDict state;
  for (const auto& [key, shape] : keys) state.emplace_back(key, formula_tensor(key, shape, {}));
  return state;
}

void expect_formula(const Tensor& t, const std::string& name) {
  SCOPED_TRACE(name);
  expect_values(t, t.shape(), formula_values(name, t.shape()), 0, 0);
}

// load_state_dict(strict) takes BertForMaskedLM.state_dict()'s keys (both names of the tied tensors) and
// save_pretrained()'s (one name each); a tied tensor is loaded once, from its first name, and stays shared.
TEST(GoldenModels, BertMaskedLMLoadsHuggingFaceStateDictKeys) {
  const Golden g = load_model_golden("bert_mlm");
  const auto state_keys = golden_list(g, "state.");
  {
    nn::models::BertForMaskedLM model(small_bert());
    const auto result = model.load_state_dict(state_with_keys(state_keys), /*strict=*/true);
    EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
    EXPECT_TRUE(model.predictions->decoder_weight.is_same(model.bert->embeddings->word_embeddings->weight));
    // The first name in kiln's (and PyTorch's) order wins: the word embeddings, cls.predictions.bias.
    expect_formula(model.bert->embeddings->word_embeddings->weight, "bert.embeddings.word_embeddings.weight");
    expect_formula(model.predictions->bias, "cls.predictions.bias");
    expect_formula(model.bert->encoder->layer->at<nn::models::BertLayer>(1)->output->dense->weight,
                   "bert.encoder.layer.1.output.dense.weight");
  }
  const auto saved_keys = golden_list(g, "saved.");
  if (!saved_keys.empty()) {
    SCOPED_TRACE("save_pretrained keys");
    EXPECT_LT(saved_keys.size(), state_keys.size());  // tied copies left out
    nn::models::BertForMaskedLM model(small_bert());
    const auto result = model.load_state_dict(state_with_keys(saved_keys), /*strict=*/true);
    EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
    EXPECT_TRUE(model.predictions->decoder_weight.is_same(model.bert->embeddings->word_embeddings->weight));
    for (const auto& [key, shape] : saved_keys)
      if (key == "bert.embeddings.word_embeddings.weight" || key == "cls.predictions.decoder.weight")
        expect_formula(model.predictions->decoder_weight, key);
  }
  // Truly missing and unexpected keys are still errors.
  auto without = [&](const std::vector<std::string>& drop) {
    std::vector<std::pair<std::string, Shape>> keys;
    for (const auto& k : state_keys)
      if (std::find(drop.begin(), drop.end(), k.first) == drop.end()) keys.push_back(k);
    return keys;
  };
  nn::models::BertForMaskedLM model(small_bert());
  expect_error(
      [&] { model.load_state_dict(state_with_keys(without({"bert.encoder.layer.0.attention.self.query.weight"}))); },
      {"missing keys (1)", "bert.encoder.layer.0.attention.self.query.weight"});
  auto extra = state_with_keys(state_keys);
  extra.emplace_back("bert.embeddings.unused", zeros({3}));
  expect_error([&] { model.load_state_dict(extra); }, {"unexpected keys (1)", "bert.embeddings.unused"});
  // Both names of the tied weight absent: both reported missing.
  const auto result = model.load_state_dict(
      state_with_keys(without({"bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"})),
      /*strict=*/false);
  EXPECT_EQ(result.missing_keys,
            (std::vector<std::string>{"bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"}));
}

// Without the golden files: kiln's own state dict less the tied copies (as save_pretrained writes it)
// loads strictly, sets the shared tensors once and keeps them shared.
TEST(GoldenModels, BertMaskedLMLoadsOneCopyOfEachTiedTensor) {
  nn::models::BertForMaskedLM source(small_bert()), model(small_bert());
  set_formula(source);
  nn::StateDict state;
  for (const auto& [key, t] : source.state_dict())
    if (key != "cls.predictions.decoder.weight" && key != "cls.predictions.decoder.bias") state.emplace_back(key, t);
  ASSERT_EQ(state.size() + 2, source.state_dict().size());
  const auto result = model.load_state_dict(state, /*strict=*/true);
  EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
  EXPECT_TRUE(model.predictions->decoder_weight.is_same(model.bert->embeddings->word_embeddings->weight));
  expect_formula(model.predictions->decoder_weight, "bert.embeddings.word_embeddings.weight");
  expect_formula(model.predictions->bias, "cls.predictions.bias");
  // Only the decoder's names given: they load the shared tensors too.
  nn::StateDict decoder_names;
  for (const auto& [key, t] : source.state_dict()) {
    if (key == "bert.embeddings.word_embeddings.weight" || key == "cls.predictions.bias") continue;
    decoder_names.emplace_back(key, key == "cls.predictions.decoder.weight" ? t * 2.0 : t);
  }
  nn::models::BertForMaskedLM other(small_bert());
  EXPECT_TRUE(other.load_state_dict(decoder_names).missing_keys.empty());
  expect_values(other.bert->embeddings->word_embeddings->weight, {100, 64},
                values(source.bert->embeddings->word_embeddings->weight * 2.0), 0, 0);
  expect_formula(other.predictions->bias, "cls.predictions.bias");
}

KILN_INSTANTIATE_BACKENDS(GoldenModelsTest);

}  // namespace
}  // namespace kiln::testing
