// The simple layer modules: parameter and buffer names and shapes, PyTorch's default initialisation,
// BatchNorm's running statistics against a hand-computed reference (also through forward_relu and
// forward_add_relu, and under checkpointing), train/eval behaviour, bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "kiln/autograd/checkpoint.h"
#include "kiln/layers/layers.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class LayersTest : public BackendTest {};

// name -> shape of each named tensor, in order.
std::vector<std::pair<std::string, Shape>> shapes_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [name, t] : named) out.emplace_back(name, t.shape());
  return out;
}

using Named = std::vector<std::pair<std::string, Shape>>;

TEST(Layers, ParameterAndBufferNamesAndShapesAreTorchs) {
  nn::Linear fc(4, 3);
  EXPECT_EQ(shapes_of(fc.named_parameters()), (Named{{"weight", {3, 4}}, {"bias", {3}}}));
  EXPECT_EQ(fc.type_name(), "Linear");
  nn::Linear no_bias(4, 3, {.bias = false});
  EXPECT_EQ(shapes_of(no_bias.named_parameters()), (Named{{"weight", {3, 4}}}));
  EXPECT_FALSE(no_bias.bias.defined());
  nn::Embedding emb(10, 6);
  EXPECT_EQ(shapes_of(emb.named_parameters()), (Named{{"weight", {10, 6}}}));
  nn::LayerNorm ln({2, 5});
  EXPECT_EQ(shapes_of(ln.named_parameters()), (Named{{"weight", {2, 5}}, {"bias", {2, 5}}}));
  EXPECT_TRUE(nn::LayerNorm({5}, {.elementwise_affine = false}).named_parameters().empty());
  nn::GroupNorm gn(2, 6);
  EXPECT_EQ(shapes_of(gn.named_parameters()), (Named{{"weight", {6}}, {"bias", {6}}}));
  nn::BatchNorm2d bn(3);
  EXPECT_EQ(shapes_of(bn.named_parameters()), (Named{{"weight", {3}}, {"bias", {3}}}));
  EXPECT_EQ(shapes_of(bn.named_buffers()),
            (Named{{"running_mean", {3}}, {"running_var", {3}}, {"num_batches_tracked", {}}}));
  EXPECT_EQ(bn.num_batches_tracked.dtype(), DType::Int64);
  EXPECT_EQ(bn.type_name(), "BatchNorm2d");
  nn::BatchNorm1d plain(3, {.affine = false, .track_running_stats = false});
  EXPECT_TRUE(plain.named_parameters().empty());
  EXPECT_TRUE(plain.named_buffers().empty());
  for (const auto& [name, p] : fc.named_parameters()) EXPECT_TRUE(p.requires_grad()) << name;
}

TEST(Layers, StateDictKeysAreTorchs) {
  nn::BatchNorm2d bn(3);
  std::vector<std::string> keys;
  for (const auto& [name, t] : bn.state_dict()) keys.push_back(name);
  EXPECT_EQ(keys, (std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}));
}

TEST(Layers, DefaultInitialisationIsTorchs) {
  nn::Linear fc(16, 200);
  const double bound = 1 / std::sqrt(16.0) * (1 + 1e-6);  // weight and bias alike (float32 rounding)
  auto w = values(fc.weight), b = values(fc.bias);
  EXPECT_LE(*std::max_element(w.begin(), w.end()), bound);
  EXPECT_GE(*std::min_element(w.begin(), w.end()), -bound);
  EXPECT_GT(*std::max_element(w.begin(), w.end()), 0.95 * bound);
  EXPECT_LE(*std::max_element(b.begin(), b.end()), bound);
  EXPECT_GT(*std::max_element(b.begin(), b.end()), 0.8 * bound);
  nn::Embedding emb(50, 40, {.padding_idx = -2});
  EXPECT_EQ(emb.padding_idx, 48);
  auto e = values(emb.weight);
  double sq = 0;
  for (double v : e) sq += v * v;
  EXPECT_NEAR(std::sqrt(sq / (49 * 40)), 1.0, 0.05);  // N(0, 1), padding row excluded
  EXPECT_EQ(values(emb.weight.select(0, 48)), std::vector<double>(40, 0.0));
  nn::BatchNorm1d bn(2);
  EXPECT_EQ(values(bn.weight), (std::vector<double>{1, 1}));
  EXPECT_EQ(values(bn.bias), (std::vector<double>{0, 0}));
  EXPECT_EQ(values(bn.running_var), (std::vector<double>{1, 1}));
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);
}

// Per-channel mean, and the variance with the given divisor offset, of x (N, C, L).
void channel_moments(const std::vector<double>& x, int64_t n, int64_t c, int64_t l, std::vector<double>& m,
                     std::vector<double>& v_unbiased) {
  m.assign(static_cast<size_t>(c), 0);
  v_unbiased.assign(static_cast<size_t>(c), 0);
  for (int64_t k = 0; k < c; ++k) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < l; ++j) m[k] += x[(i * c + k) * l + j];
    m[k] /= static_cast<double>(n * l);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < l; ++j) v_unbiased[k] += std::pow(x[(i * c + k) * l + j] - m[k], 2);
    v_unbiased[k] /= static_cast<double>(n * l - 1);
  }
}

TEST_P(LayersTest, BatchNormRunningStatisticsAfterTwoStepsAndEvalUsesThem) {
  const int64_t n = 2, c = 3, h = 2, w = 2;
  auto x1 = uniform(n * c * h * w, -2, 2, 1), x2 = uniform(n * c * h * w, -1, 3, 2);
  std::vector<double> m1, v1, m2, v2;
  channel_moments(x1, n, c, h * w, m1, v1);
  channel_moments(x2, n, c, h * w, m2, v2);
  for (bool cumulative : {false, true}) {
    SCOPED_TRACE(cumulative ? "momentum none" : "momentum 0.1");
    nn::BatchNormOptions o;
    if (cumulative) o.momentum = std::nullopt;
    auto bn = std::make_shared<nn::BatchNorm2d>(c, o);
    bn->to(dev());
    (*bn)(make(x1, {n, c, h, w}, opts()));
    (*bn)(make(x2, {n, c, h, w}, opts()));
    std::vector<double> rm(c), rv(c);
    for (int64_t k = 0; k < c; ++k) {
      if (cumulative) {  // factors 1, then 1/2
        rm[k] = (m1[k] + m2[k]) / 2;
        rv[k] = (v1[k] + v2[k]) / 2;
      } else {
        rm[k] = 0.9 * (0.9 * 0 + 0.1 * m1[k]) + 0.1 * m2[k];
        rv[k] = 0.9 * (0.9 * 1 + 0.1 * v1[k]) + 0.1 * v2[k];
      }
    }
    expect_values(bn->running_mean, {c}, rm, 1e-5, 1e-6);
    expect_values(bn->running_var, {c}, rv, 1e-5, 1e-6);
    EXPECT_EQ(bn->num_batches_tracked.cpu().item<int64_t>(), 2);
    // Eval: normalised by the running statistics, which stay put.
    bn->eval();
    Tensor y = (*bn)(make(x1, {n, c, h, w}, opts()));
    std::vector<double> ref(x1.size());
    for (size_t i = 0; i < x1.size(); ++i) {
      const size_t k = (i / (h * w)) % c;
      ref[i] = (x1[i] - rm[k]) / std::sqrt(rv[k] + 1e-5);
    }
    expect_values(y, {n, c, h, w}, ref, 1e-5, 1e-5);
    expect_values(bn->running_mean, {c}, rm, 1e-5, 1e-6);
    EXPECT_EQ(bn->num_batches_tracked.cpu().item<int64_t>(), 2);
  }
}

TEST_P(LayersTest, BatchNormUnderCheckpointingUpdatesRunningStatisticsOnce) {
  // Backward recomputes the checkpointed block in training mode; the running statistics, and the batch counter,
  // must be those of one forward, as without checkpointing: hand-derived from the batch's moments.
  const int64_t n = 2, c = 3, h = 2, w = 2;
  const auto xv = uniform(n * c * h * w, -2, 2, 4);
  std::vector<double> m, v;
  channel_moments(xv, n, c, h * w, m, v);
  const Tensor residual = make(uniform(n * c * h * w, -1, 1, 5), {n, c, h, w}, opts());
  for (bool cumulative : {false, true}) {
    for (int fused : {0, 1, 2}) {  // plain, forward_relu, forward_add_relu
      SCOPED_TRACE(std::string(cumulative ? "momentum none" : "momentum 0.1") + (fused == 1   ? ", fused relu"
                                                                                 : fused == 2 ? ", fused add + relu"
                                                                                              : ""));
      nn::BatchNormOptions o;
      if (cumulative) o.momentum = std::nullopt;
      auto bn = std::make_shared<nn::BatchNorm2d>(c, o);
      bn->to(dev());
      Tensor x = make(xv, {n, c, h, w}, opts()).requires_grad_();
      Tensor y = autograd::checkpoint(
          [&](const Tensor& in) {
            return fused == 2 ? bn->forward_add_relu(in, residual) : fused == 1 ? bn->forward_relu(in) : (*bn)(in);
          },
          x);
      sum(y * y).backward();
      ASSERT_TRUE(x.grad().defined());
      std::vector<double> rm(c), rv(c);
      for (int64_t k = 0; k < c; ++k) {
        rm[k] = cumulative ? m[k] : 0.1 * m[k];
        rv[k] = cumulative ? v[k] : 0.9 + 0.1 * v[k];
      }
      expect_values(bn->running_mean, {c}, rm, 1e-5, 1e-6);
      expect_values(bn->running_var, {c}, rv, 1e-5, 1e-6);
      EXPECT_EQ(bn->num_batches_tracked.cpu().item<int64_t>(), 1);
      EXPECT_FALSE(autograd::in_recomputation());
    }
  }
}

// forward_add_relu = relu(bn(x) + residual) by hand, in training (batch statistics, running ones updated once)
// and in eval (running statistics, unchanged), with the gradients reaching x, the residual, weight and bias.
TEST_P(LayersTest, BatchNormForwardAddReluIsTheReluOfTheNormalisedInputPlusTheResidual) {
  const int64_t n = 2, c = 3, h = 2, w = 2, l = h * w;
  const auto xv = uniform(n * c * l, -2, 2, 11), rv = uniform(n * c * l, -1.5, 1.5, 12);
  std::vector<double> m, v;  // v unbiased
  channel_moments(xv, n, c, l, m, v);
  auto bn = std::make_shared<nn::BatchNorm2d>(c);
  bn->to(dev());
  {
    NoGradGuard no_grad;
    bn->weight.copy_(make({0.5, 1.0, 1.5}, {c}, opts()));
    bn->bias.copy_(make({0.25, -0.5, 0.0}, {c}, opts()));
  }
  const double wv[3] = {0.5, 1.0, 1.5}, bv[3] = {0.25, -0.5, 0.0};
  Tensor x = make(xv, {n, c, h, w}, opts()).requires_grad_();
  Tensor res = make(rv, {n, c, h, w}, opts()).requires_grad_();
  Tensor y = bn->forward_add_relu(x, res);
  std::vector<double> ref(xv.size()), mask(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t k = (i / l) % c;
    const double biased = v[k] * static_cast<double>(n * l - 1) / static_cast<double>(n * l);
    ref[i] = std::max(0.0, (xv[i] - m[k]) / std::sqrt(biased + 1e-5) * wv[k] + bv[k] + rv[i]);
    mask[i] = ref[i] > 0 ? 1 : 0;
  }
  expect_values(y, {n, c, h, w}, ref, 1e-5, 1e-5);
  std::vector<double> rm(c), rvar(c);
  for (int64_t k = 0; k < c; ++k) {
    rm[k] = 0.1 * m[k];
    rvar[k] = 0.9 + 0.1 * v[k];
  }
  expect_values(bn->running_mean, {c}, rm, 1e-5, 1e-6);
  expect_values(bn->running_var, {c}, rvar, 1e-5, 1e-6);
  EXPECT_EQ(bn->num_batches_tracked.cpu().item<int64_t>(), 1);
  // d/d residual of sum(y) is the ReLU's mask; d/d bias per channel is the mask's count.
  sum(y).backward();
  expect_values(res.grad(), {n, c, h, w}, mask, 0, 0);
  std::vector<double> count(c, 0);
  for (size_t i = 0; i < xv.size(); ++i) count[(i / l) % c] += mask[i];
  expect_values(bn->bias.grad(), {c}, count, 1e-6, 1e-6);
  ASSERT_TRUE(x.grad().defined());
  ASSERT_TRUE(bn->weight.grad().defined());

  bn->eval();
  Tensor ye = bn->forward_add_relu(make(xv, {n, c, h, w}, opts()), make(rv, {n, c, h, w}, opts()));
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t k = (i / l) % c;
    ref[i] = std::max(0.0, (xv[i] - rm[k]) / std::sqrt(rvar[k] + 1e-5) * wv[k] + bv[k] + rv[i]);
  }
  expect_values(ye, {n, c, h, w}, ref, 1e-5, 1e-5);
  expect_values(bn->running_mean, {c}, rm, 1e-5, 1e-6);
  EXPECT_EQ(bn->num_batches_tracked.cpu().item<int64_t>(), 1);
}

TEST_P(LayersTest, BatchNormWithoutRunningStatisticsUsesTheBatchInEval) {
  auto xv = uniform(8, -2, 2, 3);  // (4, 2)
  auto bn = std::make_shared<nn::BatchNorm1d>(2, nn::BatchNormOptions{.track_running_stats = false});
  bn->to(dev());
  bn->eval();
  Tensor y = (*bn)(make(xv, {4, 2}, opts()));
  std::vector<double> m, v;
  channel_moments({xv[0], xv[2], xv[4], xv[6], xv[1], xv[3], xv[5], xv[7]}, 1, 2, 4, m, v);
  std::vector<double> ref(8);
  for (int i = 0; i < 8; ++i) ref[i] = (xv[i] - m[i % 2]) / std::sqrt(v[i % 2] * 3 / 4 + 1e-5);
  expect_values(y, {4, 2}, ref, 1e-5, 1e-5);
}

TEST_P(LayersTest, DropoutIsTheIdentityInEval) {
  auto drop = std::make_shared<nn::Dropout>(0.5);
  Tensor x = ones({1000}, opts());
  Tensor y = (*drop)(x);
  auto v = values(y);
  EXPECT_GT(std::count(v.begin(), v.end(), 0.0), 350);
  EXPECT_GT(std::count(v.begin(), v.end(), 2.0), 350);
  drop->eval();
  EXPECT_TRUE((*drop)(x).is_same(x));
}

TEST_P(LayersTest, ForwardsMatchTheFunctions) {
  auto xv = uniform(24, -2, 2, 4);
  Tensor x = make(xv, {2, 3, 4}, opts());
  auto fc = std::make_shared<nn::Linear>(4, 5);
  fc->to(dev());
  Tensor y = (*fc)(x);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
  expect_values(y, {2, 3, 5}, values(matmul(x, fc->weight.t()) + fc->bias));
  expect_values(nn::ReLU()(x), {2, 3, 4}, values(relu(x)));
  expect_values(nn::GELU({.tanh_approximation = true})(x), {2, 3, 4}, values(gelu(x, true)));
  expect_values(nn::GELU()(x), {2, 3, 4}, values(gelu(x)));
  expect_values(nn::SiLU()(x), {2, 3, 4}, values(silu(x)));
  expect_values(nn::Tanh()(x), {2, 3, 4}, values(kiln::tanh(x)));
  expect_values(nn::Sigmoid()(x), {2, 3, 4}, values(sigmoid(x)));
  expect_values(nn::Softmax(1)(x), {2, 3, 4}, values(softmax(x, 1)));
  EXPECT_TRUE(nn::Identity()(x).is_same(x));
  EXPECT_EQ(nn::Flatten()(x).shape(), (Shape{2, 12}));
  EXPECT_EQ(nn::Flatten({.start_dim = 0, .end_dim = 1})(x).shape(), (Shape{6, 4}));
  auto emb = std::make_shared<nn::Embedding>(5, 3, nn::EmbeddingOptions{.padding_idx = 0});
  emb->to(dev());
  Tensor e = (*emb)(from_vector<int64_t>({4, 0}, {2}, dev()));
  expect_values(e, {2, 3}, {values(emb->weight)[12], values(emb->weight)[13], values(emb->weight)[14], 0, 0, 0});
  auto ln = std::make_shared<nn::LayerNorm>(Shape{4});
  ln->to(dev());
  Tensor z = (*ln)(x);
  expect_values(z.mean({-1}), {2, 3}, std::vector<double>(6, 0.0), 1e-5, 1e-5);
  auto gn = std::make_shared<nn::GroupNorm>(3, 3);
  gn->to(dev());
  expect_values((*gn)(x).mean({-1}), {2, 3}, std::vector<double>(6, 0.0), 1e-5, 1e-5);
}

TEST(Layers, BadInputNamesTheLayerAndTheShapes) {
  nn::Linear fc(4, 3);
  expect_error([&] { fc(zeros({2, 5})); }, {"Linear", "(..., 4)", "[2, 5]"});
  nn::BatchNorm2d bn2(3);
  expect_error([&] { bn2(zeros({2, 3, 4})); }, {"BatchNorm2d", "4-D", "[2, 3, 4]"});
  expect_error([&] { bn2(zeros({2, 4, 2, 2})); }, {"BatchNorm2d", "3 channels", "[2, 4, 2, 2]"});
  nn::BatchNorm1d bn1(3);
  expect_error([&] { bn1(zeros({2, 3, 2, 2})); }, {"BatchNorm1d", "2-D", "3-D", "[2, 3, 2, 2]"});
  expect_error(
      [&] {
        bn2.forward_add_relu(zeros({2, 3, 2, 2}), zeros({2, 3, 2, 1}));
      },
      {"BatchNorm2d", "forward_add_relu", "[2, 3, 2, 2]", "[2, 3, 2, 1]"});
  expect_error([&] { bn2.forward_add_relu(zeros({2, 3, 2, 2}), Tensor()); }, {"BatchNorm2d", "residual"});
  EXPECT_EQ(bn2.num_batches_tracked.item<int64_t>(), 0);  // a refused input leaves the statistics alone
  nn::LayerNorm ln({4});
  expect_error([&] { ln(zeros({2, 5})); }, {"LayerNorm", "[4]", "[2, 5]"});
  nn::GroupNorm gn(2, 4);
  expect_error([&] { gn(zeros({2, 6, 3})); }, {"GroupNorm", "(N, 4, *)", "[2, 6, 3]"});
  expect_error([] { nn::GroupNorm(4, 6); }, {"GroupNorm", "6", "divisible", "4"});
  nn::Embedding emb(5, 3);
  expect_error([&] { emb(zeros({2})); }, {"Embedding", "integer", "float32"});
  expect_error([] { nn::Embedding(5, 3, {.padding_idx = 5}); }, {"Embedding", "padding_idx 5"});
  expect_error([] { nn::Dropout(1.0); }, {"Dropout", "[0, 1)"});
}

// As DLRM: embedding tables in a ModuleList "tables" (a plain one, one with a padding row, one with sparse gradients).
struct Tables : nn::Module {
  nn::Handle<nn::ModuleList> tables;
  Tables() : Module("Tables") {
    tables = register_module("tables", nn::ModuleList{nn::Embedding(4, 2), nn::Embedding(5, 2, {.padding_idx = 0}),
                                                      nn::Embedding(6, 3, {.sparse = true})});
  }
};

TEST_P(LayersTest, BadEmbeddingIdsNameTheTableAndTheId) {
  auto model = nn::make<Tables>();
  model->to(dev());
  const auto ids = [&](const std::vector<double>& v) {
    return make(v, {static_cast<int64_t>(v.size())}, opts(DType::Int64));
  };
  // On the CPU the call throws (a kiln::Error); on a GPU the kernel records the bad id and a later call, here the
  // copy back, raises it (a kiln::IndexError), naming the table as the module named it at launch.
  const auto lookup = [&](int64_t table, const std::vector<double>& v) {
    return [&, table, v] { (void)model->tables->at<nn::Embedding>(table)(ids(v)).cpu(); };
  };
  expect_error(lookup(0, {1, 4}), {"Embedding \"tables.0\" (4 x 2 table)", "index 4", "out of range", "size 4"});
  expect_error(lookup(0, {-1}), {"Embedding \"tables.0\" (4 x 2 table)", "index -1", "out of range"});
  expect_error(lookup(1, {0, 5}), {"Embedding \"tables.1\" (5 x 2 table)", "index 5", "size 5"});  // padding_idx
  expect_error(lookup(2, {6}), {"Embedding \"tables.2\" (6 x 3 table)", "index 6", "size 6"});     // sparse
  expect_error(lookup(2, {-3}), {"Embedding \"tables.2\" (6 x 3 table)", "index -3"});
  if (dev().is_cpu()) {
    expect_error([&] { (void)model->tables->at<nn::Embedding>(0)(ids({4})); }, {"Embedding \"tables.0\"", "index 4"});
  } else {
    EXPECT_THROW(lookup(0, {4})(), IndexError);
  }
  // A good lookup still works, and an embedding outside any module names the op again (the module's name was
  // scoped to its call).
  auto table = model->tables->at<nn::Embedding>(0);
  expect_values(table(ids({3})), {1, 2}, values(table->weight.select(0, 3)));
  expect_error([&] { (void)nn::embedding(ids({4}), table->weight).cpu(); }, {"embedding: index 4", "size 4"});

  // A table in no model is named by its type and shape alone.
  nn::Embedding lone(5, 3);
  lone.to(dev());
  expect_error([&] { (void)lone(ids({2, 5})).cpu(); }, {"Embedding (5 x 3 table): index 5", "out of range", "size 5"});
}

KILN_INSTANTIATE_BACKENDS(LayersTest);

}  // namespace
}  // namespace kiln::testing
