// BERT: shapes of a tiny model, parameter counts (tiny by hand, base and large against Hugging Face's),
// Hugging Face's parameter names and initialisation, the tied decoder weight and its gradient, the masked-LM
// loss under a few SGD steps, the head on listed positions, gradient checkpointing, padding independence, sequence
// classification, bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/autograd/autocast.h"  // autocast::Guard, CacheRegion
#include "kiln/layers/attention.h"   // the unstacked reference of the self-attention
#include "kiln/layers/functional.h"  // nn::linear
#include "kiln/layers/models/bert.h"
#include "kiln/profiler/profiler.h"  // counts the layers' forward calls
#include "kiln/tensor/cuda.h"        // cuda::Graph: the listed head in a captured step
#include "support/test_support.h"

namespace kiln::testing {
namespace {

models::BertConfig tiny_config(double dropout = 0.1) {
  return {.vocab_size = 50,
          .hidden_size = 16,
          .num_hidden_layers = 2,
          .num_attention_heads = 2,
          .intermediate_size = 32,
          .max_position_embeddings = 16,
          .hidden_dropout_prob = dropout,
          .attention_probs_dropout_prob = dropout};
}

Tensor ids(const std::vector<double>& v, const Shape& shape) { return make(v, shape, {.dtype = DType::Int64}); }

TEST(Bert, ForwardShapes) {
  manual_seed(1);
  const int64_t N = 2, S = 5;
  Tensor input = ids({2, 7, 9, 11, 3, 2, 41, 8, 0, 0}, {N, S});
  Tensor types = ids({0, 0, 0, 1, 1, 0, 0, 1, 1, 1}, {N, S});
  Tensor mask = ids({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {N, S});
  models::BertModel model(tiny_config());
  auto out = model.forward(input, types, mask);
  EXPECT_EQ(out.sequence_output.shape(), (Shape{N, S, 16}));
  EXPECT_EQ(out.pooled_output.shape(), (Shape{N, 16}));
  // The pooled output is tanh(dense([CLS])).
  std::vector<double> pooled = values(out.pooled_output);
  EXPECT_TRUE(std::all_of(pooled.begin(), pooled.end(), [](double x) { return std::abs(x) < 1; }));
  EXPECT_EQ(model.forward(input, {}, {}).sequence_output.shape(), (Shape{N, S, 16}));
  models::BertForMaskedLM mlm(tiny_config());
  EXPECT_EQ(mlm.forward(input, types, mask).logits.shape(), (Shape{N, S, 50}));
  EXPECT_FALSE(mlm.forward(input, types, mask).loss.defined());
  models::BertForSequenceClassification clf(tiny_config(), 3);
  EXPECT_EQ(clf.forward(input, types, mask).logits.shape(), (Shape{N, 3}));
}

TEST(Bert, ParameterCountsMatchTheFormulaAndHuggingFace) {
  // Tiny, by hand: embeddings (50 + 16 + 2) * 16 + LayerNorm 32 = 1120; per layer: q, k, v, out 4 * 272 +
  // LayerNorm 32 = 1120, intermediate 16 * 32 + 32 = 544, output 32 * 16 + 16 = 528, LayerNorm 32: 2224;
  // pooler 272. 1120 + 2 * 2224 + 272 = 5840.
  models::BertConfig tiny = tiny_config();
  EXPECT_EQ(tiny.num_parameters(), 5840);
  EXPECT_EQ(models::BertModel(tiny).num_parameters(), 5840);
  EXPECT_EQ(models::BertModel(tiny, false).num_parameters(), 5840 - 272);
  EXPECT_EQ(tiny.num_parameters(false), 5840 - 272);
  // Masked LM: no pooler; transform dense 272 + LayerNorm 32, decoder bias 50, decoder weight tied (not counted).
  EXPECT_EQ(models::BertForMaskedLM(tiny).num_parameters(), 5840 - 272 + 272 + 32 + 50);
  EXPECT_EQ(models::BertForSequenceClassification(tiny, 3).num_parameters(), 5840 + 16 * 3 + 3);
  // Hugging Face's bert-base-uncased and bert-large-uncased BertModel.
  EXPECT_EQ(models::BertConfig::base().num_parameters(), 109482240);
  EXPECT_EQ(models::BertConfig::large().num_parameters(), 335141888);
  models::BertConfig c = models::BertConfig::custom(100, 32, 3, 4, 64, 20);
  EXPECT_EQ(models::BertModel(c).num_parameters(), c.num_parameters());
}

TEST(Bert, ParameterNamesAreHuggingFaces) {
  models::BertForMaskedLM mlm(tiny_config());
  std::set<std::string> names;
  for (const auto& [name, p] : mlm.named_parameters()) names.insert(name);
  const std::vector<std::string> expected = {
      "bert.embeddings.word_embeddings.weight",
      "bert.embeddings.position_embeddings.weight",
      "bert.embeddings.token_type_embeddings.weight",
      "bert.embeddings.LayerNorm.weight",
      "bert.embeddings.LayerNorm.bias",
      "bert.encoder.layer.0.attention.self.query.weight",
      "bert.encoder.layer.0.attention.self.query.bias",
      "bert.encoder.layer.0.attention.self.key.weight",
      "bert.encoder.layer.0.attention.self.value.bias",
      "bert.encoder.layer.0.attention.output.dense.weight",
      "bert.encoder.layer.0.attention.output.LayerNorm.weight",
      "bert.encoder.layer.0.attention.output.LayerNorm.bias",
      "bert.encoder.layer.1.intermediate.dense.weight",
      "bert.encoder.layer.1.intermediate.dense.bias",
      "bert.encoder.layer.1.output.dense.weight",
      "bert.encoder.layer.1.output.LayerNorm.weight",
      "cls.predictions.bias",
      "cls.predictions.transform.dense.weight",
      "cls.predictions.transform.dense.bias",
      "cls.predictions.transform.LayerNorm.weight",
      "cls.predictions.transform.LayerNorm.bias",
  };
  for (const auto& n : expected) EXPECT_TRUE(names.count(n)) << n;
  EXPECT_EQ(names.size(), 5u + 2 * 16 + 5);
  EXPECT_FALSE(names.count("bert.pooler.dense.weight"));  // HF's masked LM has no pooler
  EXPECT_FALSE(names.count("bert.encoder.layer.2.output.dense.weight"));
  // state_dict() lists the tied decoder under its own names too, as PyTorch's.
  std::set<std::string> keys;
  for (const auto& [name, t] : mlm.state_dict()) keys.insert(name);
  EXPECT_TRUE(keys.count("cls.predictions.decoder.weight"));
  EXPECT_TRUE(keys.count("cls.predictions.decoder.bias"));

  models::BertForSequenceClassification clf(tiny_config(), 2);
  std::vector<std::string> clf_names;
  for (const auto& [name, p] : clf.named_parameters()) clf_names.push_back(name);
  for (const char* n : {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight", "classifier.bias"})
    EXPECT_NE(std::find(clf_names.begin(), clf_names.end(), n), clf_names.end()) << n;
  EXPECT_EQ(clf_names.front(), "bert.embeddings.word_embeddings.weight");
  EXPECT_EQ(clf_names.back(), "classifier.bias");
}

TEST(Bert, InitialisationIsHuggingFaces) {
  manual_seed(3);
  models::BertForSequenceClassification clf(tiny_config(), 2);
  for (const auto& [name, p] : clf.named_parameters()) {
    std::vector<double> v = values(p);
    const bool is_ln = name.find("LayerNorm") != std::string::npos;
    const bool is_bias = name.size() > 5 && name.substr(name.size() - 5) == ".bias";
    if (is_ln && !is_bias) {
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](double x) { return x == 1; })) << name;
    } else if (is_bias) {
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](double x) { return x == 0; })) << name;
    } else {
      double sq = 0;
      for (double x : v) sq += x * x;
      const double std = std::sqrt(sq / static_cast<double>(v.size()));
      EXPECT_GT(std, 0.013) << name;  // N(0, 0.02^2); the smallest has 32 values
      EXPECT_LT(std, 0.027) << name;
    }
  }
  // The padding row (id 0) of the word embeddings starts at zero.
  std::vector<double> row0 = values(clf.bert->embeddings->word_embeddings->weight.select(0, 0));
  EXPECT_TRUE(std::all_of(row0.begin(), row0.end(), [](double x) { return x == 0; }));
}

TEST(Bert, TiedDecoderWeightIsOneTensorWithOneGradientFromBothUses) {
  manual_seed(4);
  models::BertForMaskedLM mlm(tiny_config(0.0));
  Tensor w = mlm.bert->embeddings->word_embeddings->weight;
  EXPECT_TRUE(mlm.predictions->decoder_weight.is_same(w));
  int64_t listed = 0;
  for (const auto& p : mlm.parameters()) listed += p.is_same(w);
  EXPECT_EQ(listed, 1);

  Tensor input = ids({2, 7, 9, 11, 3, 2, 41, 8, 5, 4}, {2, 5});
  Tensor labels = ids({-100, 7, -100, 12, -100, 30, -100, -100, 5, -100}, {2, 5});
  auto grad_of_w = [&] {
    mlm.zero_grad();
    mlm.forward(input, {}, {}, labels).loss.backward();
    return w.grad().clone();
  };
  Tensor both = grad_of_w();
  // The same loss with one use at a time (the other sees a detached copy of the same values).
  mlm.predictions->decoder_weight = w.detach();
  Tensor from_embedding = grad_of_w();
  mlm.predictions->decoder_weight = w;
  mlm.bert->embeddings->word_embeddings->weight = w.detach();
  Tensor from_decoder = grad_of_w();
  mlm.bert->embeddings->word_embeddings->weight = w;
  expect_values(both, {50, 16}, values(from_embedding + from_decoder), 1e-5, 1e-7);
  // Token 45 is not in the input: only the decoder gives it a gradient; both uses give one to token 7.
  EXPECT_EQ(values(from_embedding.select(0, 45).abs().sum())[0], 0.0);
  EXPECT_GT(values(from_decoder.select(0, 45).abs().sum())[0], 0.0);
  EXPECT_GT(values(from_embedding.select(0, 7).abs().sum())[0], 0.0);
}

// Under autocast the stacked query/key/value projection casts each parameter on its own (the region's weight-cast
// cache) and stacks the casts: its output and every gradient equal those of three separate projections, as
// Hugging Face computes them, under the same autocast region, and each parameter's gradient is a float32 tensor
// of its own rather than a view of one stacked gradient.
TEST(Bert, StackedProjectionUnderAutocastEqualsThreeProjections) {
  manual_seed(11);
  models::BertSelfAttention attn(tiny_config(0.0));
  const Tensor x = randn({2, 5, 16});
  const Tensor probe = randn({2, 5, 16});  // weights the output so that every gradient is non-trivial
  const std::vector<Tensor> params = {attn.query->weight, attn.key->weight, attn.value->weight,
                                      attn.query->bias,   attn.key->bias,   attn.value->bias};
  auto run = [&](bool stacked) {
    attn.zero_grad();
    Tensor hidden = x.clone().requires_grad_();
    Tensor out;
    {
      autocast::Guard cast(DeviceType::CPU, DType::BFloat16);
      autocast::CacheRegion cache;
      if (stacked) {
        out = attn.forward(hidden, Tensor());
      } else {
        auto heads = [](const Tensor& t) { return permute(reshape(t, {2, 5, 2, 8}), {0, 2, 1, 3}); };
        const Tensor q = nn::linear(hidden, attn.query->weight, attn.query->bias);
        const Tensor k = nn::linear(hidden, attn.key->weight, attn.key->bias);
        const Tensor v = nn::linear(hidden, attn.value->weight, attn.value->bias);
        out =
            reshape(permute(nn::scaled_dot_product_attention(heads(q), heads(k), heads(v)), {0, 2, 1, 3}), {2, 5, 16});
      }
    }
    EXPECT_EQ(out.dtype(), DType::BFloat16);
    (out.to(DType::Float32) * probe).sum().backward();
    std::vector<Tensor> got = {out.to(DType::Float32), hidden.grad()};
    for (const Tensor& p : params) got.push_back(p.grad());
    return got;
  };
  const std::vector<Tensor> stacked = run(true), separate = run(false);
  for (size_t i = 0; i < stacked.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "result " << i);
    ASSERT_TRUE(stacked[i].defined());
    EXPECT_EQ(stacked[i].dtype(), DType::Float32);
    expect_values(stacked[i], separate[i].shape(), values(separate[i]), 2e-2, 2e-2);
  }
  for (size_t i = 2; i < stacked.size(); ++i) {
    for (size_t j = i + 1; j < stacked.size(); ++j) {
      EXPECT_NE(stacked[i].impl().storage().get(), stacked[j].impl().storage().get()) << i << " " << j;
    }
  }
}

TEST(Bert, MaskedLmLossIsFiniteAndDecreasesUnderSgd) {
  manual_seed(5);
  models::BertForMaskedLM mlm(tiny_config(0.0));
  Tensor input = ids({2, 7, 1, 11, 3, 2, 41, 8, 1, 4, 2, 9, 9, 1, 6, 2, 17, 1, 22, 4}, {4, 5});  // 1 = [MASK]
  Tensor labels = ids(
      {-100, -100, 9, -100, -100, -100, -100, -100, 13, -100, -100, -100, -100, 40, -100, -100, -100, 33, -100, -100},
      {4, 5});
  Tensor types = zeros({4, 5}, {.dtype = DType::Int64});
  Tensor mask = ones({4, 5}, {.dtype = DType::Int64});
  std::vector<double> losses;
  for (int step = 0; step < 8; ++step) {
    mlm.zero_grad();
    Tensor loss = mlm.forward(input, types, mask, labels).loss;
    ASSERT_EQ(loss.dim(), 0);
    losses.push_back(loss.item<float>());
    loss.backward();
    NoGradGuard no_grad;
    for (Tensor& p : mlm.parameters())
      if (p.grad().defined()) sub_(p, p.grad(), 0.1);
  }
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_NEAR(losses.front(), std::log(50.0), 0.5);  // near-uniform predictions at initialisation
  for (size_t i = 1; i < losses.size(); ++i) EXPECT_LT(losses[i], losses[i - 1]) << "step " << i;
}

// The head on the listed positions only: the same loss and parameter gradients as on every position, logits that
// are the full logits' rows at those positions, padding entries (position 0, label -100) left out of the loss.
TEST(Bert, MaskedPositionsGiveTheFullHeadsLossAndGradients) {
  Tensor input = ids({2, 7, 1, 11, 3, 2, 41, 8, 1, 4, 2, 9, 9, 1, 6, 2, 17, 1, 22, 4}, {4, 5});
  Tensor labels =
      ids({-100, -100, 9, -100, 5, -100, 6, -100, 13, -100, -100, -100, -100, 40, -100, -100, -100, 33, -100, -100},
          {4, 5});
  Tensor positions = ids({2, 4, 0, 1, 3, 0, 3, 0, 0, 2, 0, 0}, {4, 3});  // 0: padding ([CLS], label -100)
  Tensor types = zeros({4, 5}, {.dtype = DType::Int64});
  Tensor mask = ids({1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {4, 5});
  auto run = [&](const Tensor& listed) {
    manual_seed(21);
    models::BertForMaskedLM mlm(tiny_config(0.0));
    auto out = mlm.forward(input, types, mask, labels, listed);
    out.loss.backward();
    std::vector<std::vector<double>> grads;
    for (const auto& [name, p] : mlm.named_parameters()) grads.push_back(values(p.grad()));
    return std::make_tuple(out.logits, out.loss.item<double>(), grads);
  };
  const auto [all_logits, all_loss, all_grads] = run({});
  const auto [some_logits, some_loss, some_grads] = run(positions);
  ASSERT_EQ(some_logits.shape(), (Shape{4, 3, 50}));
  const std::vector<double> full = values(all_logits), part = values(some_logits), pos = values(positions);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      const auto at = static_cast<int64_t>(pos[static_cast<size_t>(i * 3 + j)]);
      for (int64_t v = 0; v < 50; ++v) {
        ASSERT_NEAR(part[static_cast<size_t>((i * 3 + j) * 50 + v)], full[static_cast<size_t>((i * 5 + at) * 50 + v)],
                    1e-5)
            << "sequence " << i << ", entry " << j;
      }
    }
  }
  EXPECT_NEAR(some_loss, all_loss, 1e-6 * std::abs(all_loss));
  ASSERT_EQ(some_grads.size(), all_grads.size());
  for (size_t k = 0; k < all_grads.size(); ++k) {
    double scale = 1e-3, err = 0;
    for (size_t e = 0; e < all_grads[k].size(); ++e) {
      scale = std::max(scale, std::abs(all_grads[k][e]));
      err = std::max(err, std::abs(all_grads[k][e] - some_grads[k][e]));
    }
    EXPECT_LE(err, 1e-5 * scale) << "parameter " << k;
  }
  // A labelled position left out of the list is not predicted: the loss is the mean over the listed ones.
  manual_seed(21);
  models::BertForMaskedLM mlm(tiny_config(0.0));
  const double without_last = mlm.forward(input, types, mask, labels, narrow(positions, 1, 0, 1)).loss.item<double>();
  EXPECT_NE(without_last, all_loss);
  EXPECT_TRUE(std::isfinite(without_last));
}

// The same on a GPU, eagerly and as replays of a captured step: the listed rows' loss and gradients against the
// full head's (float32 products: TF32 may round each product differently, hence the tolerance), and a position
// past the sequence reported as index_select's error by the next synchronisation.
TEST(BertCuda, MaskedPositionsMatchTheFullHeadEagerAndGraphed) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  const Device gpu = Device::cuda(0);
  Tensor input = ids({2, 7, 1, 11, 3, 2, 41, 8, 1, 4, 2, 9, 9, 1, 6, 2, 17, 1, 22, 4}, {4, 5}).to(gpu);
  Tensor labels =
      ids({-100, -100, 9, -100, 5, -100, 6, -100, 13, -100, -100, -100, -100, 40, -100, -100, -100, 33, -100, -100},
          {4, 5})
          .to(gpu);
  Tensor positions = ids({2, 4, 0, 1, 3, 0, 3, 0, 0, 2, 0, 0}, {4, 3}).to(gpu);
  Tensor types = zeros({4, 5}, {.dtype = DType::Int64, .device = gpu});
  Tensor mask = ones({4, 5}, {.dtype = DType::Int64, .device = gpu});
  auto run = [&](const Tensor& listed, bool graphed) {
    manual_seed(21);
    models::BertForMaskedLM mlm(tiny_config(0.0));
    mlm.to(gpu);
    Tensor loss;
    auto step = [&] {
      mlm.zero_grad(false);
      loss = mlm.forward(input, types, mask, labels, listed).loss;
      loss.backward();
    };
    step();  // eager (and the warm-up of a capture)
    cuda::Graph graph;
    if (graphed) {
      graph.capture(step);
      graph.replay();
    }
    std::vector<double> out{loss.item<double>()};
    for (const auto& [name, p] : mlm.named_parameters()) {
      const std::vector<double> g = values(p.grad());
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  };
  const std::vector<double> full = run({}, false);
  for (bool graphed : {false, true}) {
    const std::vector<double> listed = run(positions, graphed);
    ASSERT_EQ(listed.size(), full.size());
    double scale = 1e-3, err = 0;
    for (size_t i = 0; i < full.size(); ++i) {
      scale = std::max(scale, std::abs(full[i]));
      err = std::max(err, std::abs(full[i] - listed[i]));
    }
    EXPECT_LE(err, 5e-3 * scale) << (graphed ? "graph replay" : "eager");
  }
  manual_seed(21);
  models::BertForMaskedLM mlm(tiny_config(0.0));
  mlm.to(gpu);
  expect_error(
      [&] {
        (void)mlm.forward(input, types, mask, labels, ids({0, 1, 5, 2, 0, 0, 0, 0}, {4, 2}).to(gpu))
            .loss.item<double>();
      },
      {"index_select", "out of range"});
}

TEST(Bert, GradientCheckpointingGivesTheSameLossAndGradients) {
  // With dropout on: the recomputation in backward must replay forward's dropout masks. Padding in the second
  // sequence, so the attention mask takes part in the recomputation too.
  Tensor input = ids({2, 7, 1, 11, 3, 2, 41, 8, 1, 4}, {2, 5});
  Tensor labels = ids({-100, 7, 9, -100, 3, -100, 41, -100, 13, -100}, {2, 5});
  Tensor types = zeros({2, 5}, {.dtype = DType::Int64});
  Tensor mask = ids({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 5});
  auto run = [&](bool checkpointing) {
    manual_seed(11);
    models::BertForMaskedLM mlm(tiny_config(0.1));
    mlm.bert->set_gradient_checkpointing(checkpointing);
    EXPECT_EQ(mlm.bert->encoder->gradient_checkpointing, checkpointing);
    manual_seed(12);         // the dropout masks
    profiler::Profile prof;  // to count the layers' forward calls: recomputed ones run a second time in backward
    Tensor loss = mlm.forward(input, types, mask, labels).loss;
    loss.backward();
    prof.stop();
    int64_t layer_calls = 0;
    for (const profiler::Event& e : prof.result().events()) layer_calls += e.name == "BertLayer";
    EXPECT_EQ(layer_calls, checkpointing ? 4 : 2);
    std::vector<std::vector<double>> grads;
    for (const auto& [name, p] : mlm.named_parameters()) grads.push_back(values(p.grad()));
    return std::make_pair(loss.item<double>(), grads);
  };
  const auto plain = run(false);
  const auto recomputed = run(true);
  EXPECT_EQ(plain.first, recomputed.first);
  ASSERT_EQ(plain.second.size(), recomputed.second.size());
  for (size_t i = 0; i < plain.second.size(); ++i)
    EXPECT_EQ(plain.second[i], recomputed.second[i]) << "parameter " << i;
  // Without gradients (evaluation) it changes nothing and records nothing.
  manual_seed(11);
  models::BertForMaskedLM mlm(tiny_config(0.0));
  mlm.bert->set_gradient_checkpointing();
  NoGradGuard no_grad;
  EXPECT_FALSE(mlm.forward(input, types, mask, labels).loss.requires_grad());
}

TEST(Bert, RealTokensAreIndependentOfPaddedTokens) {
  manual_seed(6);
  models::BertModel model(tiny_config());
  model.eval();
  Tensor mask = ids({1, 1, 1, 0, 0, 1, 1, 1, 1, 1}, {2, 5});
  Tensor a = ids({2, 7, 9, 0, 0, 2, 41, 8, 5, 4}, {2, 5});
  Tensor b = ids({2, 7, 9, 33, 12, 2, 41, 8, 5, 4}, {2, 5});  // other ids where sample 0 pads
  Tensor types_b = ids({0, 0, 0, 1, 1, 0, 0, 1, 1, 1}, {2, 5});
  auto oa = model.forward(a, {}, mask), ob = model.forward(b, types_b.masked_fill(eq(mask, 1), 0), mask);
  // Sample 0's real tokens (positions 0..2) and its pooled output are unchanged.
  expect_values(narrow(oa.sequence_output, 1, 0, 3), {2, 3, 16}, values(narrow(ob.sequence_output, 1, 0, 3)), 1e-6,
                1e-6);
  expect_values(oa.pooled_output, {2, 16}, values(ob.pooled_output), 1e-6, 1e-6);
  // Without the mask the padded ids do change the real tokens' outputs.
  auto ua = model.forward(a, {}, {}), ub = model.forward(b, {}, {});
  EXPECT_GT(values((select(ua.sequence_output, 0, 0) - select(ub.sequence_output, 0, 0)).abs().max())[0], 1e-4);
  // A Bool mask is the same as the 0/1 mask.
  expect_values(model.forward(a, {}, ne(mask, 0)).sequence_output, {2, 5, 16}, values(oa.sequence_output), 1e-6, 1e-7);
}

TEST(Bert, DropoutOnlyInTraining) {
  manual_seed(7);
  models::BertModel model(tiny_config(0.3));
  Tensor input = ids({2, 7, 9, 11, 3}, {1, 5});
  model.eval();
  Tensor e1 = model.forward(input, {}, {}).sequence_output, e2 = model.forward(input, {}, {}).sequence_output;
  expect_values(e1, e1.shape(), values(e2));
  model.train();
  Tensor t1 = model.forward(input, {}, {}).sequence_output;
  EXPECT_GT(values((t1 - e1).abs().max())[0], 1e-3);
}

TEST(Bert, SequenceClassificationLossAndGradients) {
  manual_seed(8);
  models::BertForSequenceClassification clf(tiny_config(), 3);
  Tensor input = ids({2, 7, 9, 11, 3, 2, 41, 8, 5, 4}, {2, 5});
  auto out = clf.forward(input, {}, {}, ids({2, 0}, {2}));
  ASSERT_EQ(out.loss.dim(), 0);
  EXPECT_TRUE(std::isfinite(out.loss.item<float>()));
  out.loss.backward();
  EXPECT_TRUE(clf.classifier->weight.grad().defined());
  EXPECT_TRUE(clf.bert->pooler->dense->weight.grad().defined());
  EXPECT_TRUE(clf.bert->encoder->layer->at<models::BertLayer>(0)->attention->self->query->weight.grad().defined());
  models::BertForSequenceClassification reg(tiny_config(), 1);
  EXPECT_EQ(reg.forward(input, {}, {}, make({0.5, -1}, {2})).loss.dim(), 0);
}

TEST(Bert, BadInput) {
  models::BertConfig bad = tiny_config();
  bad.hidden_size = 15;
  expect_error([&] { models::BertModel m(bad); }, {"BertConfig", "hidden_size (15)", "num_attention_heads (2)"});
  models::BertModel model(tiny_config());
  expect_error(
      [&] {
        model.forward(zeros({2, 17}, {.dtype = DType::Int64}), {}, {});
      },
      {"BertEmbeddings", "17", "max_position_embeddings = 16"});
  expect_error([&] { model.forward(zeros({2, 5}), {}, {}); }, {"input_ids", "integer", "float32"});
  expect_error(
      [&] {
        model.forward(zeros({2, 5}, {.dtype = DType::Int64}), zeros({2, 4}, {.dtype = DType::Int64}), {});
      },
      {"token_type_ids", "[2, 4]", "[2, 5]"});
  expect_error(
      [&] {
        model.forward(zeros({2, 5}, {.dtype = DType::Int64}), {}, ones({2, 4}));
      },
      {"attention_mask", "[2, 4]", "[2, 5]"});
  models::BertForMaskedLM mlm(tiny_config());
  expect_error(
      [&] {
        mlm.forward(zeros({2, 5}, {.dtype = DType::Int64}), {}, {}, zeros({2, 4}, {.dtype = DType::Int64}));
      },
      {"BertForMaskedLM", "labels", "[2, 4]"});
  const Tensor input = zeros({2, 5}, {.dtype = DType::Int64});
  expect_error(
      [&] {
        mlm.forward(input, {}, {}, {}, zeros({2, 3}));
      },
      {"BertForMaskedLM", "masked_positions", "Int64", "(N, P)", "float32"});
  expect_error(
      [&] {
        mlm.forward(input, {}, {}, {}, zeros({3, 3}, {.dtype = DType::Int64}));
      },
      {"masked_positions", "N = 2", "[3, 3]"});
  expect_error(
      [&] {
        mlm.forward(input, {}, {}, {}, zeros({2, 0}, {.dtype = DType::Int64}));
      },
      {"masked_positions", "P >= 1", "[2, 0]"});
  expect_error(
      [&] {
        mlm.forward(input, {}, {}, {}, ids({0, 1, 5, 2}, {2, 2}));
      },
      {"masked_positions", "[0, 5)", "from 0 to 5"});
  expect_error(
      [&] {
        mlm.forward(input, {}, {}, {}, ids({0, -1, 4, 2}, {2, 2}));
      },
      {"masked_positions", "from -1 to 4"});
  // A token id past the vocabulary: the error names the table by its place in the model, and the id.
  EXPECT_EQ(mlm.bert->encoder->layer->at<models::BertLayer>(1)->attention->self->path(),
            "bert.encoder.layer.1.attention.self");
  expect_error(
      [&] {
        mlm.forward(ids({3, 50}, {1, 2}), {}, {}, {});
      },
      {"Embedding \"bert.embeddings.word_embeddings\" (50 x 16 table)", "index 50", "out of range"});
}

}  // namespace
}  // namespace kiln::testing
