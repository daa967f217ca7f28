// Tests of io::load_weights: torchvision's ResNet names against kiln's, BERT checkpoints of one head loaded
// into another (the "bert." prefix added or stripped), TF-era LayerNorm names, float16 files, tied weights,
// mismatches and strict mode; and, when KILN_PRETRAINED_DIR is set, logits against PyTorch's
// (tests/golden/make_golden_pretrained.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "io/torch_file_writer.h"
#include "kiln/io/pretrained.h"
#include "kiln/io/torch_file.h"
#include "kiln/layers/containers.h"
#include "kiln/layers/layers.h"
#include "kiln/layers/models/bert.h"
#include "kiln/layers/models/resnet.h"
#include "kiln/tensor/generator.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln {
namespace {

namespace kt = kiln::testing;
using nn::models::BertConfig;

class PretrainedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("kiln_pretrained_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string save(const std::string& name, const io::NamedTensors& t) {
    const std::string p = (dir_ / name).string();
    test_io::write_file(p, test_io::torch_save_bytes(t));
    return p;
  }
  std::filesystem::path dir_;
};

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

Tensor find(const nn::StateDict& sd, const std::string& name) {
  for (const auto& [n, t] : sd)
    if (n == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

// Every tensor replaced by distinct random values, so a load that copies the wrong tensor is seen.
io::NamedTensors randomized(const nn::StateDict& sd, uint64_t seed) {
  io::NamedTensors out;
  Generator gen(seed);
  for (const auto& [n, t] : sd) {
    Tensor v = t.is_floating_point() ? internal::randn(t.shape(), {}, &gen) : t.clone();
    out.emplace_back(n, v);
  }
  return out;
}

BertConfig tiny_bert() {
  return {.vocab_size = 30,
          .hidden_size = 8,
          .num_hidden_layers = 2,
          .num_attention_heads = 2,
          .intermediate_size = 16,
          .max_position_embeddings = 12};
}

TEST_F(PretrainedTest, ResNetNamesAreTorchvisions) {
  // torchvision's resnet18().state_dict(): 62 parameters + 20 BatchNorms x 3 buffers; resnet50: 161 + 53 x 3.
  auto r18 = nn::models::resnet18()->state_dict();
  auto r50 = nn::models::resnet50()->state_dict();
  EXPECT_EQ(r18.size(), 122u);
  EXPECT_EQ(r50.size(), 320u);
  std::vector<std::string> n18, n50;
  for (auto& [n, t] : r18) n18.push_back(n);
  for (auto& [n, t] : r50) n50.push_back(n);
  for (const char* k : {"conv1.weight", "bn1.running_mean", "bn1.num_batches_tracked", "layer1.0.conv1.weight",
                        "layer1.1.bn2.bias", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.running_var",
                        "layer4.1.conv2.weight", "fc.weight", "fc.bias"})
    EXPECT_TRUE(has(n18, k)) << k;
  for (const char* k : {"layer1.0.conv3.weight", "layer1.0.downsample.0.weight", "layer3.5.bn3.running_var",
                        "layer4.2.conv3.weight", "layer4.0.downsample.1.num_batches_tracked"})
    EXPECT_TRUE(has(n50, k)) << k;
  EXPECT_FALSE(has(n18, "layer1.0.downsample.0.weight"));  // BasicBlock stage 1 keeps the identity
  EXPECT_EQ(n18.front(), "conv1.weight");
  EXPECT_EQ(find(r18, "conv1.weight").shape(), (Shape{64, 3, 7, 7}));
  EXPECT_EQ(find(r18, "fc.weight").shape(), (Shape{1000, 512}));
  EXPECT_EQ(find(r50, "fc.weight").shape(), (Shape{1000, 2048}));
  EXPECT_EQ(find(r50, "layer2.0.conv2.weight").shape(), (Shape{128, 128, 3, 3}));  // v1.5: stride in conv2
}

TEST_F(PretrainedTest, ResNetRoundTripThroughATorchFileIsStrict) {
  auto src = randomized(nn::models::resnet18({.num_classes = 10})->state_dict(), 1);
  const std::string path = save("r18.pth", src);
  auto model = nn::models::resnet18({.num_classes = 10});
  io::LoadReport r = io::load_weights(*model, path, {.strict = true});
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.loaded.size(), 122u);
  EXPECT_TRUE(r.renames.empty());
  auto sd = model->state_dict();
  for (const char* k : {"conv1.weight", "layer3.1.bn1.running_var", "fc.bias"})
    EXPECT_EQ(find(sd, k).to_vector<float>(), find(src, k).to_vector<float>()) << k;
}

TEST_F(PretrainedTest, BertModelWeightsIntoBertForMaskedLMAddTheBertPrefix) {
  nn::models::BertModel base(tiny_bert(), /*add_pooling_layer=*/true);
  auto src = randomized(base.state_dict(), 10);
  nn::models::BertForMaskedLM mlm(tiny_bert());
  io::LoadReport r = io::load_weights(mlm, save("bert_model.bin", src), {.strict = false});  // the head is new
  ASSERT_EQ(r.renames.size(), 1u) << r.summary();
  EXPECT_NE(r.renames[0].find("added the prefix 'bert.'"), std::string::npos) << r.renames[0];
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"bert.pooler.dense.weight", "bert.pooler.dense.bias"}));
  EXPECT_TRUE(r.mismatched.empty());
  // The head is new; its decoder weight is the (loaded) word-embedding table, so it is not missing.
  EXPECT_TRUE(has(r.missing, "cls.predictions.bias"));
  EXPECT_TRUE(has(r.missing, "cls.predictions.transform.dense.weight"));
  EXPECT_FALSE(has(r.missing, "cls.predictions.decoder.weight"));
  auto sd = mlm.state_dict();
  EXPECT_EQ(find(sd, "bert.encoder.layer.1.attention.self.query.weight").to_vector<float>(),
            find(src, "encoder.layer.1.attention.self.query.weight").to_vector<float>());
  EXPECT_EQ(find(sd, "cls.predictions.decoder.weight").to_vector<float>(),
            find(src, "embeddings.word_embeddings.weight").to_vector<float>());
  EXPECT_NE(r.summary().find("missing"), std::string::npos);
}

TEST_F(PretrainedTest, BertForMaskedLMWeightsIntoBertModelStripTheBertPrefix) {
  nn::models::BertForMaskedLM mlm(tiny_bert());
  auto src = randomized(mlm.state_dict(), 20);
  nn::models::BertModel base(tiny_bert(), /*add_pooling_layer=*/false);
  io::LoadReport r = io::load_weights(base, save("mlm.bin", src), {.strict = false});  // the head is dropped
  ASSERT_EQ(r.renames.size(), 1u) << r.summary();
  EXPECT_NE(r.renames[0].find("stripped the prefix 'bert.'"), std::string::npos) << r.renames[0];
  EXPECT_TRUE(r.missing.empty()) << r.summary();
  EXPECT_FALSE(r.unexpected.empty());
  for (const auto& n : r.unexpected) EXPECT_EQ(n.rfind("cls.", 0), 0u) << n;
  EXPECT_EQ(find(base.state_dict(), "embeddings.LayerNorm.bias").to_vector<float>(),
            find(src, "bert.embeddings.LayerNorm.bias").to_vector<float>());
}

TEST_F(PretrainedTest, TiedWeightsSavedOnceLoadStrictly) {
  // save_pretrained keeps one copy of the tied decoder weight and bias.
  nn::models::BertForMaskedLM mlm(tiny_bert());
  io::NamedTensors src;
  for (auto& [n, t] : randomized(mlm.state_dict(), 30))
    if (n != "cls.predictions.decoder.weight" && n != "cls.predictions.decoder.bias") src.emplace_back(n, t);
  nn::models::BertForMaskedLM dst(tiny_bert());
  io::LoadReport r = io::load_weights(dst, save("tied.bin", src), {.strict = true});
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(find(dst.state_dict(), "cls.predictions.decoder.bias").to_vector<float>(),
            find(src, "cls.predictions.bias").to_vector<float>());
}

TEST_F(PretrainedTest, TfLayerNormNamesAndFloat16FileIntoFloat32Model) {
  nn::models::BertModel ref(tiny_bert(), true);
  io::NamedTensors src;
  for (auto& [n, t] : randomized(ref.state_dict(), 40)) {
    std::string name = n;
    if (name.size() > 16 && name.substr(name.size() - 16) == "LayerNorm.weight")
      name = name.substr(0, name.size() - 6) + "gamma";
    else if (name.size() > 14 && name.substr(name.size() - 14) == "LayerNorm.bias")
      name = name.substr(0, name.size() - 4) + "beta";
    src.emplace_back("bert." + name, t.to(DType::Float16));
  }
  nn::models::BertModel dst(tiny_bert(), true);
  io::LoadReport r = io::load_weights(dst, save("tf.bin", src), {.strict = true});
  EXPECT_TRUE(r.ok()) << r.summary();
  ASSERT_EQ(r.renames.size(), 2u);
  EXPECT_NE(r.renames[0].find("LayerNorm.gamma"), std::string::npos);
  EXPECT_NE(r.renames[1].find("stripped the prefix 'bert.'"), std::string::npos);
  Tensor g = find(dst.state_dict(), "encoder.layer.0.output.LayerNorm.weight");
  EXPECT_EQ(g.dtype(), DType::Float32);
  EXPECT_EQ(g.to_vector<float>(), find(src, "bert.encoder.layer.0.output.LayerNorm.gamma").to_vector<float>());
  // Without conversion, the float16 values are mismatches: nothing loads, which is an error even when not strict.
  nn::models::BertModel strict_dtype(tiny_bert(), true);
  const std::vector<float> before = find(strict_dtype.state_dict(), "pooler.dense.bias").to_vector<float>();
  kt::expect_error(
      [&] { io::load_weights(strict_dtype, (dir_ / "tf.bin").string(), {.strict = false, .convert_dtype = false}); },
      {"tf.bin", "nothing", "another shape or dtype", "mismatched " + std::to_string(src.size()), "float16"});
  EXPECT_EQ(find(strict_dtype.state_dict(), "pooler.dense.bias").to_vector<float>(), before);
}

TEST_F(PretrainedTest, ShapeMismatchesAreReportedAndStrictRefusesThem) {
  auto src = randomized(nn::models::resnet18({.num_classes = 1000})->state_dict(), 50);
  const std::string path = save("r18_1000.pth", src);
  auto model = nn::models::resnet18({.num_classes = 10});
  const std::vector<float> fc_before = find(model->state_dict(), "fc.weight").to_vector<float>();
  const std::vector<float> conv_before = find(model->state_dict(), "conv1.weight").to_vector<float>();
  kt::expect_error([&] { io::load_weights(*model, path, {.strict = true}); },
                   {"r18_1000.pth", "strict", "mismatched 2", "fc.weight file (1000, 512) float32, model (10, 512)"});
  EXPECT_EQ(find(model->state_dict(), "conv1.weight").to_vector<float>(), conv_before);  // nothing loaded
  kt::expect_error([&] { io::load_weights(*model, path); }, {"r18_1000.pth", "strict", "mismatched 2"});  // default
  EXPECT_EQ(find(model->state_dict(), "conv1.weight").to_vector<float>(), conv_before);
  io::LoadReport r = io::load_weights(*model, path, {.strict = false});  // fine-tuning: everything but the classifier
  EXPECT_EQ(r.loaded.size(), 120u);
  ASSERT_EQ(r.mismatched.size(), 2u);
  EXPECT_EQ(r.mismatched[0].name, "fc.weight");
  EXPECT_EQ(r.mismatched[0].file_shape, (Shape{1000, 512}));
  EXPECT_EQ(r.mismatched[0].model_shape, (Shape{10, 512}));
  EXPECT_EQ(find(model->state_dict(), "fc.weight").to_vector<float>(), fc_before);
  EXPECT_EQ(find(model->state_dict(), "conv1.weight").to_vector<float>(), find(src, "conv1.weight").to_vector<float>());
}

TEST_F(PretrainedTest, DataParallelPrefixAndPrefixMap) {
  auto model = nn::models::resnet18({.num_classes = 4});
  auto sd = randomized(model->state_dict(), 60);
  io::NamedTensors ddp, custom;
  for (auto& [n, t] : sd) ddp.emplace_back("module." + n, t);
  for (auto& [n, t] : sd) custom.emplace_back("backbone.net." + n, t);
  io::LoadReport r = io::load_weights(*model, save("ddp.pth", ddp), {.strict = true});
  ASSERT_EQ(r.renames.size(), 1u);
  EXPECT_NE(r.renames[0].find("'module.'"), std::string::npos);
  io::LoadReport r2 = io::load_weights(*model, save("custom.pth", custom),
                                       {.strict = true, .prefix_map = {{"backbone.net.", ""}}, .auto_prefix = false});
  EXPECT_TRUE(r2.ok());
  EXPECT_EQ(r2.loaded.size(), 122u);
  kt::expect_error(
      [&] { io::load_weights(*model, (dir_ / "custom.pth").string(), {.strict = true, .auto_prefix = false}); },
      {"custom.pth", "none of its 122 names is one of the model's 122", "the file's names: backbone.net.conv1.weight",
       "the model's names: conv1.weight", "prefix_map"});
}

TEST_F(PretrainedTest, StrictByDefaultAsLoadStateDict) {
  EXPECT_TRUE(io::LoadOptions{}.strict);
  // A file without the classifier's bias: one model tensor missing.
  auto model = nn::models::resnet18({.num_classes = 10});
  io::NamedTensors src;
  for (auto& [n, t] : randomized(model->state_dict(), 70))
    if (n != "fc.bias") src.emplace_back(n, t);
  const std::string path = save("no_fc_bias.pth", src);
  const std::vector<float> conv_before = find(model->state_dict(), "conv1.weight").to_vector<float>();
  kt::expect_error([&] { io::load_weights(*model, path); }, {"no_fc_bias.pth", "strict", "missing 1", "fc.bias"});
  EXPECT_EQ(find(model->state_dict(), "conv1.weight").to_vector<float>(), conv_before);  // nothing loaded
  io::LoadReport r = io::load_weights(*model, path, {.strict = false});
  EXPECT_EQ(r.loaded.size(), 121u);
  EXPECT_EQ(r.missing, (std::vector<std::string>{"fc.bias"}));
  EXPECT_EQ(find(model->state_dict(), "conv1.weight").to_vector<float>(), find(src, "conv1.weight").to_vector<float>());
}

TEST_F(PretrainedTest, NothingMatchedIsAnErrorEvenWhenNotStrict) {
  // 4 tensors in the model ("0.weight", "0.bias", "1.weight", "1.bias"), 4 in the file, no name in common.
  nn::Sequential model({std::make_shared<nn::Linear>(3, 2), std::make_shared<nn::Linear>(2, 1)});
  ASSERT_EQ(model.state_dict().size(), 4u);
  const std::vector<float> w_before = find(model.state_dict(), "0.weight").to_vector<float>();
  io::NamedTensors src;
  Generator gen(80);
  for (const char* n : {"encoder.dense.weight", "encoder.dense.bias", "decoder.dense.weight", "decoder.dense.bias"})
    src.emplace_back(n, internal::randn({2, 3}, {}, &gen));
  const std::string path = save("other_model.pth", src);
  for (bool strict : {false, true}) {
    kt::expect_error(
        [&] { io::load_weights(model, path, {.strict = strict}); },
        {"io::load_weights", "nothing of", "other_model.pth", "none of its 4 names is one of the model's 4",
         "the file's names: encoder.dense.weight, encoder.dense.bias, decoder.dense.weight",
         "the model's names: 0.weight, 0.bias, 1.weight, 1.bias", "prefix_map"});
  }
  EXPECT_EQ(find(model.state_dict(), "0.weight").to_vector<float>(), w_before);
  // An empty file loads nothing either.
  kt::expect_error([&] { io::load_weights(model, save("empty.pth", {}), {.strict = false}); },
                   {"empty.pth", "holds no tensors", "0.weight"});
}

TEST_F(PretrainedTest, FormatDetection) {
  const std::string h5 = (dir_ / "ckpt.h5").string();
  test_io::write_file(h5, std::string("\x89HDF\r\n\x1a\n", 8) + std::string(100, '\0'));
  kt::expect_error([&] { io::read_weights(h5); }, {"ckpt.h5", "HDF5", "load_checkpoint"});
  const std::string txt = (dir_ / "notes.txt").string();
  test_io::write_file(txt, "hello, these are not weights");
  kt::expect_error([&] { io::read_weights(txt); }, {"notes.txt", "not a weights file"});
  kt::expect_error([&] { io::read_weights((dir_ / "none.pth").string()); }, {"none.pth", "cannot open"});
}

// ---------------------------------------------------------------- golden: PyTorch's own files and logits

std::string pretrained_dir() {
  const char* d = std::getenv("KILN_PRETRAINED_DIR");
  return d == nullptr ? std::string() : std::string(d);
}
#define SKIP_WITHOUT_PRETRAINED_DIR()                                                                       \
  if (pretrained_dir().empty())                                                                             \
  GTEST_SKIP() << "KILN_PRETRAINED_DIR is not set: run tests/golden/make_golden_pretrained.py <dir> where " \
                  "PyTorch, torchvision and transformers are installed, then set KILN_PRETRAINED_DIR=<dir>"

Tensor golden(const std::string& name) {
  static io::NamedTensors all = io::load_torch_file(pretrained_dir() + "/expected.pth");
  for (auto& [n, t] : all)
    if (n == name) return t;
  ADD_FAILURE() << "expected.pth has no " << name;
  return {};
}

BertConfig golden_bert() {
  return {.vocab_size = 100,
          .hidden_size = 64,
          .num_hidden_layers = 2,
          .num_attention_heads = 4,
          .intermediate_size = 128,
          .max_position_embeddings = 32};
}

void expect_bert_logits(nn::models::BertForMaskedLM& mlm) {
  mlm.eval();
  Tensor logits =
      mlm.forward(golden("bert.input_ids"), golden("bert.token_type_ids"), golden("bert.attention_mask")).logits;
  Tensor want = golden("bert.logits");
  kt::expect_values(logits, want.shape(), kt::values(want), 1e-4, 1e-4);
}

TEST(PretrainedGolden, TorchvisionResNet18Logits) {
  SKIP_WITHOUT_PRETRAINED_DIR();
  auto model = nn::models::resnet18({.num_classes = 10});
  io::LoadReport r = io::load_weights(*model, pretrained_dir() + "/resnet18.pth", {.strict = true});
  EXPECT_EQ(r.loaded.size(), 122u) << r.summary();
  model->eval();
  Tensor logits = (*model)(golden("resnet.input"));
  Tensor want = golden("resnet.logits");
  kt::expect_values(logits, want.shape(), kt::values(want), 1e-4, 1e-4);
}

TEST(PretrainedGolden, TransformersBertForMaskedLMLogitsFromPth) {
  SKIP_WITHOUT_PRETRAINED_DIR();
  nn::models::BertForMaskedLM mlm(golden_bert());
  // Not strict: transformers versions differ in the buffers they save (position_ids), which kiln has no use for.
  io::LoadReport r = io::load_weights(mlm, pretrained_dir() + "/bert_mlm.pth", {.strict = false});
  EXPECT_TRUE(r.missing.empty() && r.mismatched.empty()) << r.summary();
  expect_bert_logits(mlm);
}

TEST(PretrainedGolden, TransformersBertForMaskedLMLogitsFromSafetensors) {
  SKIP_WITHOUT_PRETRAINED_DIR();
  nn::models::BertForMaskedLM mlm(golden_bert());
  // Not strict: transformers versions differ in the buffers they save (position_ids), which kiln has no use for.
  io::LoadReport r = io::load_weights(mlm, pretrained_dir() + "/bert_mlm/model.safetensors", {.strict = false});
  EXPECT_TRUE(r.missing.empty() && r.mismatched.empty()) << r.summary();
  expect_bert_logits(mlm);
}

TEST(PretrainedGolden, TransformersBertModelIntoBertForMaskedLM) {
  SKIP_WITHOUT_PRETRAINED_DIR();
  // The encoder's weights alone (BertModel's state dict, no "bert." prefix): the head stays as initialised.
  nn::models::BertForMaskedLM mlm(golden_bert());
  io::LoadReport r = io::load_weights(mlm, pretrained_dir() + "/bert_model.pth", {.strict = false});
  ASSERT_FALSE(r.renames.empty()) << r.summary();
  EXPECT_NE(r.renames.back().find("'bert.'"), std::string::npos);
  EXPECT_TRUE(r.mismatched.empty()) << r.summary();
  EXPECT_TRUE(has(r.loaded, "bert.encoder.layer.1.output.dense.weight"));
}

}  // namespace
}  // namespace kiln
