// io::export_onnx's refusals and guarantees: the op and module named when something cannot be exported, dtypes
// ONNX cannot hold, bad options, paths that cannot be written (no partial file, an earlier file untouched), the
// training-mode warning and the modes restored, batch norm folding, and what capture records. The exported models'
// values are checked in ONNX Runtime by io.onnx_runtime (onnx_models.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kiln/kiln.h"
#include "kiln/tensor/capture.h"

namespace {

using namespace kiln;
namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kiln_onnx_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Expects export_onnx to throw a kiln::Error whose message holds every one of `parts`.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    FAIL() << "expected a kiln::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

// A block whose forward calls an op with no ONNX translation (var) inside a named child.
class VarBlock : public nn::Module {
 public:
  VarBlock() : Module("VarBlock") {}
  Tensor forward(const Tensor& x) override { return var(x, {1}, 1, true) + x; }
};

TEST(OnnxExport, AnOpWithoutTranslationNamesTheOpAndTheModule) {
  const fs::path dir = fresh_dir("var");
  auto model = nn::make<nn::Sequential>(nn::Linear(4, 4));
  model->append(std::make_shared<VarBlock>());
  model->eval();
  const fs::path path = dir / "model.onnx";
  expect_error(
      [&] {
        io::export_onnx(*model, randn({2, 4}), path.string());
      },
      {"'var'", "in module 1", "no ONNX translation"});
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir)) << "a temporary file was left behind";
}

// argmax is one of kiln's raw ops (no record of its own): reading a value computed from the inputs through it is
// refused, rather than exported as a constant.
class ArgmaxHead : public nn::Module {
 public:
  ArgmaxHead() : Module("ArgmaxHead") {}
  Tensor forward(const Tensor& x) override { return cast(argmax(x, 1), DType::Float32) + sum(x, {1}); }
};

TEST(OnnxExport, AnUnrecordedOpOnAComputedValueIsRefused) {
  const fs::path dir = fresh_dir("argmax");
  auto model = nn::make<nn::Sequential>(nn::Linear(4, 4));
  model->append(std::make_shared<ArgmaxHead>());
  model->eval();
  expect_error(
      [&] {
        io::export_onnx(*model, randn({2, 4}), (dir / "m.onnx").string());
      },
      {"argmax", "in module 1", "not called through a kiln op"});
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(OnnxExport, AFailedExportLeavesTheEarlierFileUntouched) {
  const fs::path dir = fresh_dir("keep");
  const fs::path path = dir / "model.onnx";
  { std::ofstream(path) << "the earlier model"; }
  auto model = std::make_shared<VarBlock>();
  EXPECT_THROW(io::export_onnx(*model, randn({2, 4}), path.string()), Error);
  EXPECT_EQ(read_file(path), "the earlier model");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

TEST(OnnxExport, PathsThatCannotBeWrittenAreRefusedClearly) {
  const fs::path dir = fresh_dir("paths");
  auto model = nn::make<nn::Linear>(3, 2);
  model->eval();
  expect_error(
      [&] {
        io::export_onnx(*model, randn({1, 3}), (dir / "missing" / "m.onnx").string());
      },
      {"does not exist", "create it first"});
  expect_error([&] { io::export_onnx(*model, randn({1, 3}), dir.string() + "/"); }, {"names a folder"});
  fs::create_directories(dir / "taken.onnx");  // a folder where the file should go: the rename fails
  expect_error([&] { io::export_onnx(*model, randn({1, 3}), (dir / "taken.onnx").string()); }, {"taken.onnx"});
  EXPECT_TRUE(fs::is_directory(dir / "taken.onnx"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1) << "a temporary file was left";
}

TEST(OnnxExport, Float8IsRefusedNamingTheValue) {
  const fs::path dir = fresh_dir("fp8");
  auto model = nn::make<nn::Identity>();
  expect_error(
      [&] {
        io::export_onnx(*model, randn({2, 2}).to(DType::Float8_e4m3fn), (dir / "m.onnx").string());
      },
      {"float8_e4m3fn", "input 'input_0'", "cannot hold"});
}

TEST(OnnxExport, BadOptionsAreRefused) {
  const fs::path dir = fresh_dir("options");
  auto model = nn::make<nn::Linear>(3, 2);
  model->eval();
  const std::string path = (dir / "m.onnx").string();
  expect_error(
      [&] {
        io::export_onnx(*model, randn({2, 3}), path, {.dynamic_axes = {{"x", {{0, "batch"}}}}});
      },
      {"dynamic_axes names 'x'", "'input_0'"});
  expect_error(
      [&] {
        io::export_onnx(*model, randn({2, 3}), path, {.dynamic_axes = {{"input_0", {{2, "batch"}}}}});
      },
      {"dynamic axis 2", "does not exist"});
  expect_error(
      [&] {
        io::export_onnx(*model, randn({2, 3}), path, {.input_names = {"a", "b"}});
      },
      {"2 input names for 1 example inputs"});
  expect_error(
      [&] {
        io::export_onnx(*model, randn({2, 3}), path, {.input_names = {"y"}, .output_names = {"y"}});
      },
      {"output name 'y' is also an input's name"});
  EXPECT_FALSE(fs::exists(path));
}

// A size computed on the host from the input's shape, put into a tensor by hand, cannot follow a dynamic axis.
class HostSize : public nn::Module {
 public:
  HostSize() : Module("HostSize") {}
  Tensor forward(const Tensor& x) override {
    std::vector<float> steps(static_cast<size_t>(x.size(0)), 1.0f);
    return x + unsqueeze(from_vector(steps, {x.size(0)}), 1);
  }
};

TEST(OnnxExport, AHostMadeTensorWhoseSizeFollowsADynamicAxisIsRefused) {
  const fs::path dir = fresh_dir("host");
  auto model = std::make_shared<HostSize>();
  model->eval();
  const std::string path = (dir / "m.onnx").string();
  expect_error(
      [&] {
        io::export_onnx(*model, randn({4, 3}), path, {.dynamic_axes = {{"input_0", {{0, "b"}}}}});
      },
      {"cannot follow them"});
  // Without dynamic axes it is a constant, and the export succeeds.
  EXPECT_NO_THROW(io::export_onnx(*model, randn({4, 3}), path));
  EXPECT_TRUE(fs::exists(path));
}

TEST(OnnxExport, TrainingModeWarnsAndModesAreRestored) {
  const fs::path dir = fresh_dir("train");
  auto model = nn::make<nn::Sequential>(nn::Linear(4, 4), nn::Dropout(0.5), nn::BatchNorm1d(4));
  model->train();
  const io::OnnxExportReport report = io::export_onnx(*model, randn({3, 4}), (dir / "m.onnx").string());
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("training mode"), std::string::npos);
  EXPECT_NE(report.warnings[0].find("eval()"), std::string::npos);
  for (auto& [name, m] : model->named_modules()) EXPECT_TRUE(m->is_training()) << name;
  // Dropout is gone and batch norm uses its running statistics.
  const auto& ops = report.op_types;
  EXPECT_NE(std::find(ops.begin(), ops.end(), "BatchNormalization"), ops.end());
  EXPECT_EQ(std::find(ops.begin(), ops.end(), "Dropout"), ops.end());
  model->eval();
  EXPECT_TRUE(io::export_onnx(*model, randn({3, 4}), (dir / "m.onnx").string()).warnings.empty());
  for (auto& [name, m] : model->named_modules()) EXPECT_FALSE(m->is_training()) << name;
}

TEST(OnnxExport, FoldedBatchNormLeavesNoBatchNormalizationAndNoUnusedWeights) {
  const fs::path dir = fresh_dir("fold");
  auto model = nn::models::resnet18({.num_classes = 3, .cifar_stem = true});
  model->eval();
  const auto plain = io::export_onnx(*model, randn({1, 3, 32, 32}), (dir / "plain.onnx").string());
  const auto folded =
      io::export_onnx(*model, randn({1, 3, 32, 32}), (dir / "folded.onnx").string(), {.fold_batch_norm = true});
  auto has = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  EXPECT_TRUE(has(plain.op_types, "BatchNormalization"));
  EXPECT_FALSE(has(folded.op_types, "BatchNormalization"));
  // ResNet-18's 20 convolutions: a weight and 4 batch-norm tensors each before, a folded weight and bias after.
  EXPECT_EQ(plain.initializers - folded.initializers, 20 * 5 - 20 * 2);
  EXPECT_LT(folded.bytes, plain.bytes + 20 * 512 * 4);  // no second copy of the weights
}

TEST(OnnxExport, LargeInitializersGoToExternalData) {
  const fs::path dir = fresh_dir("external");
  auto model = nn::make<nn::Linear>(64, 64);
  model->eval();
  const auto report =
      io::export_onnx(*model, randn({1, 64}), (dir / "m.onnx").string(), {.external_data_threshold = 1000});
  EXPECT_TRUE(report.external_data);
  ASSERT_TRUE(fs::exists(dir / "m.onnx.data"));
  EXPECT_GE(fs::file_size(dir / "m.onnx.data"), 64u * 64u * 4u);
  EXPECT_LT(fs::file_size(dir / "m.onnx"), 64u * 64u * 4u);
}

// What ops record under a capture::Session: their name, tensor inputs and arguments; only the outermost op.
class Collect final : public capture::Recorder {
 public:
  void record(capture::OpRecord&& op) override { ops.push_back(std::move(op)); }
  std::vector<capture::OpRecord> ops;
};

TEST(Capture, RecordsTheOutermostOpWithItsArguments) {
  const Tensor x = randn({2, 6}), w = randn({3, 6}), b = randn({3});
  Collect collect;
  Tensor y;
  {
    capture::Session session(collect);
    y = nn::linear(x, w, b);  // matmul and add inside: one record
    y = reshape(y, {3, 2});
  }
  ASSERT_EQ(collect.ops.size(), 2u);
  EXPECT_EQ(collect.ops[0].op, "linear");
  ASSERT_EQ(collect.ops[0].inputs.size(), 3u);
  EXPECT_TRUE(collect.ops[0].inputs[0].is_same(x));
  EXPECT_TRUE(collect.ops[0].inputs[2].is_same(b));
  EXPECT_EQ(collect.ops[1].op, "reshape");
  ASSERT_NE(collect.ops[1].attr("shape"), nullptr);
  EXPECT_EQ(std::get<std::vector<int64_t>>(collect.ops[1].attr("shape")->value), (std::vector<int64_t>{3, 2}));
  EXPECT_TRUE(collect.ops[1].outputs[0].is_same(y));
  // Outside a session nothing is recorded, and a second session on the thread is refused.
  (void)relu(y);
  EXPECT_EQ(collect.ops.size(), 2u);
  capture::Session session(collect);
  Collect other;
  EXPECT_THROW(capture::Session second(other), Error);
}

}  // namespace
