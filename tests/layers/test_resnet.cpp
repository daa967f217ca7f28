// The ResNet family: parameter counts, names, shapes and state_dict keys against torchvision's (numbers
// printed by torchvision 0.x: sum(p.numel()), len(state_dict())), torchvision's initialisation,
// zero_init_residual, the CIFAR stem, a forward + backward with finite gradients, train/eval BatchNorm use,
// channels-last, bad input. Inputs are small (32x32 and below) to keep the tests fast on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/layers/models/resnet.h"
#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using nn::models::ResNet;

std::map<std::string, Shape> shape_map(const nn::StateDict& state) {
  std::map<std::string, Shape> out;
  for (const auto& [name, t] : state) out[name] = t.shape();
  return out;
}

std::vector<std::string> keys_of(const nn::StateDict& state) {
  std::vector<std::string> out;
  for (const auto& [name, t] : state) out.push_back(name);
  return out;
}

// Mean and standard deviation of a tensor's elements, in double.
std::pair<double, double> mean_std(const Tensor& t) {
  const std::vector<double> v = values(t);
  double sum = 0;
  for (double x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / static_cast<double>(v.size()))};
}

Tensor image_batch(int64_t n, int64_t hw, uint64_t seed = 3) {
  return make(uniform(n * 3 * hw * hw, -1, 1, seed), {n, 3, hw, hw});
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = values(a), vb = values(b);
  EXPECT_EQ(va.size(), vb.size());
  double m = 0;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

// max |a - b| relative to the larger of 1 and max |b|: logits of an untrained net can be large.
double rel_diff(const Tensor& a, const Tensor& b) {
  double scale = 1;
  for (double v : values(b)) scale = std::max(scale, std::abs(v));
  return max_abs_diff(a, b) / scale;
}

// Constructing a model costs most of these tests' time (11.7M float32 draws for ResNet-18), so the tests that
// only read names, shapes and initial values share one model of each kind. Tests that run or change a model
// build their own.
ResNet& shared_resnet18() {
  static const std::shared_ptr<ResNet> model = nn::models::resnet18();
  return *model;
}
ResNet& shared_resnet50() {
  static const std::shared_ptr<ResNet> model = nn::models::resnet50();
  return *model;
}
ResNet& shared_zero_init_resnet18() {
  static const std::shared_ptr<ResNet> model = nn::models::resnet18({.zero_init_residual = true});
  return *model;
}

TEST(ResNet, ParameterCountsAreTorchvisions) {
  EXPECT_EQ(shared_resnet18().num_parameters(), 11689512);
  EXPECT_EQ(nn::models::resnet34()->num_parameters(), 21797672);
  EXPECT_EQ(shared_resnet50().num_parameters(), 25557032);
}

// The deep ones take a few seconds to build on the CPU (105M parameters together).
TEST(ResNet, ParameterCountsOfResNet101And152AreTorchvisions) {
  EXPECT_EQ(nn::models::resnet101()->num_parameters(), 44549160);
  EXPECT_EQ(nn::models::resnet152()->num_parameters(), 60192808);
}

TEST(ResNet, StateDictKeysAndShapesAreTorchvisionsForResNet18) {
  ResNet* model = &shared_resnet18();
  const nn::StateDict state = model->state_dict();
  EXPECT_EQ(state.size(), 122u);  // 62 parameters + 20 BatchNorms x 3 buffers
  EXPECT_EQ(model->named_parameters().size(), 62u);
  const std::vector<std::string> keys = keys_of(state);
  // PyTorch's order: a module's parameters, its buffers, then its children in registration order.
  const std::vector<std::string> first = {"conv1.weight",
                                          "bn1.weight",
                                          "bn1.bias",
                                          "bn1.running_mean",
                                          "bn1.running_var",
                                          "bn1.num_batches_tracked",
                                          "layer1.0.conv1.weight",
                                          "layer1.0.bn1.weight",
                                          "layer1.0.bn1.bias",
                                          "layer1.0.bn1.running_mean",
                                          "layer1.0.bn1.running_var",
                                          "layer1.0.bn1.num_batches_tracked",
                                          "layer1.0.conv2.weight"};
  ASSERT_GE(keys.size(), first.size());
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + static_cast<int64_t>(first.size())), first);
  EXPECT_EQ(keys[keys.size() - 2], "fc.weight");
  EXPECT_EQ(keys.back(), "fc.bias");

  const auto shapes = shape_map(state);
  const std::map<std::string, Shape> expected = {
      {"conv1.weight", {64, 3, 7, 7}},
      {"bn1.running_var", {64}},
      {"bn1.num_batches_tracked", {}},
      {"layer1.0.conv1.weight", {64, 64, 3, 3}},
      {"layer1.1.bn2.bias", {64}},
      {"layer2.0.conv1.weight", {128, 64, 3, 3}},
      {"layer2.0.conv2.weight", {128, 128, 3, 3}},
      {"layer2.0.downsample.0.weight", {128, 64, 1, 1}},
      {"layer2.0.downsample.1.weight", {128}},
      {"layer2.0.downsample.1.running_mean", {128}},
      {"layer3.1.conv2.weight", {256, 256, 3, 3}},
      {"layer4.0.downsample.0.weight", {512, 256, 1, 1}},
      {"layer4.1.conv2.weight", {512, 512, 3, 3}},
      {"layer4.1.bn2.running_var", {512}},
      {"fc.weight", {1000, 512}},
      {"fc.bias", {1000}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(shapes.count(name)) << name;
    EXPECT_EQ(shapes.at(name), shape) << name;
  }
  // layer1 keeps 64 channels at stride 1: no projection shortcut; no conv has a bias.
  EXPECT_FALSE(shapes.count("layer1.0.downsample.0.weight"));
  EXPECT_FALSE(shapes.count("layer2.1.downsample.0.weight"));
  EXPECT_FALSE(shapes.count("conv1.bias"));
  EXPECT_FALSE(shapes.count("layer1.0.conv1.bias"));
  EXPECT_EQ(model->named_buffers().size(), 60u);
  EXPECT_EQ(model->type_name(), "ResNet");
  EXPECT_EQ(model->layer1->at<nn::models::BasicBlock>(0)->type_name(), "BasicBlock");
}

TEST(ResNet, StateDictKeysAndShapesAreTorchvisionsForResNet50) {
  ResNet* model = &shared_resnet50();
  const nn::StateDict state = model->state_dict();
  EXPECT_EQ(state.size(), 320u);
  EXPECT_EQ(model->named_parameters().size(), 161u);
  const auto shapes = shape_map(state);
  const std::map<std::string, Shape> expected = {
      {"conv1.weight", {64, 3, 7, 7}},
      {"layer1.0.conv1.weight", {64, 64, 1, 1}},
      {"layer1.0.conv2.weight", {64, 64, 3, 3}},
      {"layer1.0.conv3.weight", {256, 64, 1, 1}},
      {"layer1.0.bn3.weight", {256}},
      {"layer1.0.downsample.0.weight", {256, 64, 1, 1}},  // width 64 -> 256 at stride 1
      {"layer1.0.downsample.1.running_mean", {256}},
      {"layer1.2.conv1.weight", {64, 256, 1, 1}},
      {"layer2.0.conv1.weight", {128, 256, 1, 1}},
      {"layer2.0.conv2.weight", {128, 128, 3, 3}},
      {"layer2.0.downsample.0.weight", {512, 256, 1, 1}},
      {"layer3.5.conv3.weight", {1024, 256, 1, 1}},
      {"layer4.0.downsample.0.weight", {2048, 1024, 1, 1}},
      {"layer4.2.bn3.weight", {2048}},
      {"layer4.2.bn3.num_batches_tracked", {}},
      {"fc.weight", {1000, 2048}},
      {"fc.bias", {1000}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(shapes.count(name)) << name;
    EXPECT_EQ(shapes.at(name), shape) << name;
  }
  EXPECT_FALSE(shapes.count("layer1.1.downsample.0.weight"));
  EXPECT_FALSE(shapes.count("layer3.6.conv1.weight"));  // layer3 has 6 blocks, "0".."5"
  EXPECT_EQ(model->layer3->size(), 6);
  EXPECT_EQ(model->layer1->at<nn::models::Bottleneck>(0)->type_name(), "Bottleneck");
}

TEST(ResNet, StrideSitsInTheThreeByThreeConvOfTheBottleneck) {
  ResNet* model = &shared_resnet50();
  auto block = model->layer2->at<nn::models::Bottleneck>(0);
  EXPECT_EQ(block->conv1->options.stride[0], 1);  // v1.5: the 1x1 keeps the resolution
  EXPECT_EQ(block->conv2->options.stride[0], 2);
  EXPECT_EQ(block->conv2->options.padding[0], 1);
  auto ds = block->downsample->at<nn::Conv2d>(0);
  EXPECT_EQ(ds->options.stride[0], 2);
  EXPECT_FALSE(ds->bias.defined());
  EXPECT_EQ(model->conv1->options.stride[0], 2);
  EXPECT_EQ(model->conv1->options.padding[0], 3);
  auto pool = std::dynamic_pointer_cast<nn::MaxPool2d>(model->maxpool);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->options.kernel_size[0], 3);
  EXPECT_EQ(pool->options.padding[0], 1);
  ASSERT_TRUE(pool->options.stride.has_value());
  EXPECT_EQ((*pool->options.stride)[0], 2);
}

TEST(ResNet, InitialisationIsTorchvisions) {
  ResNet* model = &shared_resnet18();
  // kaiming_normal_(fan_out, relu): std = sqrt(2 / (out * kh * kw)).
  for (const char* name : {"layer4.1.conv2.weight", "layer3.0.conv1.weight", "conv1.weight"}) {
    Tensor w;
    for (const auto& [n, p] : model->named_parameters()) {
      if (n == name) w = p;
    }
    ASSERT_TRUE(w.defined()) << name;
    const double fan_out = static_cast<double>(w.size(0) * w.size(2) * w.size(3));
    const auto [mean, sd] = mean_std(w);
    const double expected = std::sqrt(2.0 / fan_out);
    EXPECT_NEAR(sd, expected, 0.05 * expected) << name;
    EXPECT_NEAR(mean, 0.0, 0.05 * expected) << name;
  }
  for (const auto& [name, m] : model->named_modules()) {
    if (auto bn = std::dynamic_pointer_cast<nn::BatchNorm2d>(m)) {
      for (double v : values(bn->weight)) ASSERT_EQ(v, 1.0) << name;
      for (double v : values(bn->bias)) ASSERT_EQ(v, 0.0) << name;
    }
  }
  // fc keeps Linear's default U(-1/sqrt(512), 1/sqrt(512)), which is far narrower than a kaiming draw.
  const double bound = 1 / std::sqrt(512.0) * (1 + 1e-6);
  for (double v : values(model->fc->weight)) ASSERT_LE(std::abs(v), bound);
  EXPECT_GT(mean_std(model->fc->weight).second, 0.5 * bound / std::sqrt(3.0));
}

TEST(ResNet, ZeroInitResidualZeroesTheLastBatchNormOfEachBlock) {
  ResNet* plain = &shared_resnet18();
  ResNet* zero = &shared_zero_init_resnet18();
  int checked = 0;
  for (const auto& stage : {zero->layer1, zero->layer2, zero->layer3, zero->layer4}) {
    for (int64_t i = 0; i < stage->size(); ++i) {
      auto block = stage->at<nn::models::BasicBlock>(i);
      for (double v : values(block->bn2->weight)) ASSERT_EQ(v, 0.0);
      for (double v : values(block->bn1->weight)) ASSERT_EQ(v, 1.0);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 8);
  for (double v : values(plain->layer1->at<nn::models::BasicBlock>(0)->bn2->weight)) ASSERT_EQ(v, 1.0);
  // The shortcut's BatchNorm is not the residual branch's: it keeps weight 1.
  for (double v : values(zero->layer2->at<nn::models::BasicBlock>(0)->downsample->at<nn::BatchNorm2d>(1)->weight)) {
    ASSERT_EQ(v, 1.0);
  }
  // Bottleneck blocks zero bn3 (one block per stage keeps this small).
  ResNet bottlenecks(nn::models::ResNetBlock::Bottleneck, {1, 1, 1, 1}, {.num_classes = 2, .zero_init_residual = true});
  for (const auto& stage : {bottlenecks.layer1, bottlenecks.layer2, bottlenecks.layer3, bottlenecks.layer4}) {
    auto block = stage->at<nn::models::Bottleneck>(0);
    for (double v : values(block->bn3->weight)) ASSERT_EQ(v, 0.0);
    for (double v : values(block->bn2->weight)) ASSERT_EQ(v, 1.0);
    for (double v : values(block->downsample->at<nn::BatchNorm2d>(1)->weight)) ASSERT_EQ(v, 1.0);
  }
}

TEST(ResNet, ZeroInitResidualMakesAnIdentityShortcutBlockTheIdentityOnNonNegativeInput) {
  // With bn2's weight (and bias) 0 the residual branch outputs 0, so block(x) = relu(x) = x for x >= 0,
  // in training mode (batch statistics) as in eval mode.
  ResNet* zero = &shared_zero_init_resnet18();
  ResNet* plain = &shared_resnet18();
  const Tensor x = make(uniform(2 * 64 * 4 * 4, 0, 1, 11), {2, 64, 4, 4});
  auto zero_block = zero->layer1->at<nn::models::BasicBlock>(0);
  expect_values((*zero_block)(x), {2, 64, 4, 4}, values(x));
  zero_block->eval();
  expect_values((*zero_block)(x), {2, 64, 4, 4}, values(x));
  zero_block->train();
  auto plain_block = plain->layer1->at<nn::models::BasicBlock>(0);
  EXPECT_GT(max_abs_diff((*plain_block)(x), x), 0.1);
}

TEST(ResNet, CifarStemKeepsThirtyTwoByThirtyTwoUntilLayerOne) {
  auto model = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});
  EXPECT_EQ(model->conv1->weight.shape(), (Shape{64, 3, 3, 3}));  // instead of (64, 3, 7, 7)
  EXPECT_EQ(model->fc->weight.shape(), (Shape{10, 512}));
  EXPECT_EQ(model->conv1->options.stride[0], 1);
  EXPECT_EQ(model->conv1->options.padding[0], 1);
  EXPECT_NE(std::dynamic_pointer_cast<nn::Identity>(model->maxpool), nullptr);
  EXPECT_EQ(model->state_dict().size(), 122u);  // the Identity holds nothing
  model->eval();
  const Tensor x = image_batch(1, 32);
  EXPECT_EQ(model->forward_features(x).shape(), (Shape{1, 512, 4, 4}));  // 32 -> 32 -> 16 -> 8 -> 4
  EXPECT_EQ((*model)(x).shape(), (Shape{1, 10}));
  // The ImageNet stem divides by 32: a 64x64 image ends at 2x2.
  ResNet& imagenet = shared_resnet18();
  imagenet.eval();
  EXPECT_EQ(imagenet.forward_features(image_batch(1, 64)).shape(), (Shape{1, 512, 2, 2}));
  imagenet.train();
}

TEST(ResNet, ForwardAndBackwardGiveFiniteGradientsOnEveryParameter) {
  auto model = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});
  const Tensor x = image_batch(1, 32);
  const Tensor logits = (*model)(x);
  ASSERT_EQ(logits.shape(), (Shape{1, 10}));
  for (double v : values(logits)) ASSERT_TRUE(std::isfinite(v));
  // A fixed, uneven weighting of the logits so that no gradient cancels by symmetry.
  const Tensor w = make(uniform(10, -1, 1, 5), {1, 10});
  (logits * w).sum().backward();
  int64_t nonzero_params = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    ASSERT_EQ(p.grad().shape(), p.shape()) << name;
    double norm = 0;
    for (double g : values(p.grad())) {
      ASSERT_TRUE(std::isfinite(g)) << name;
      norm += g * g;
    }
    nonzero_params += norm > 0 ? 1 : 0;
  }
  // Every parameter takes part in the loss; with one sample some BN weights may still get tiny gradients,
  // but conv and fc weights must not be all zero.
  EXPECT_GE(nonzero_params, 50);
  for (double g : values(model->fc->bias.grad())) EXPECT_NE(g, 0.0);
  model->zero_grad();
  EXPECT_FALSE(model->conv1->weight.grad().defined());
}

// The blocks compose differentiable ops; gradcheck in float64 on the input, through the projection shortcut and
// training-mode BatchNorm (batch statistics depend on every sample).
TEST(ResNet, BlockGradientsMatchFiniteDifferences) {
  auto basic = std::make_shared<nn::models::BasicBlock>(
      2, 3, 2,
      std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
          std::make_shared<nn::Conv2d>(2, 3, 1, nn::Conv2dOptions{.stride = 2, .bias = false}),
          std::make_shared<nn::BatchNorm2d>(3)}));
  basic->to(DType::Float64);
  check_gradients(
      [&](const TensorList& in) {
        basic->to(in[0].device());
        return TensorList{(*basic)(in[0])};
      },
      {make_input({2, 2, 4, 4})});

  auto bottleneck = std::make_shared<nn::models::Bottleneck>(
      2, 1, 2,
      std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
          std::make_shared<nn::Conv2d>(2, 4, 1, nn::Conv2dOptions{.stride = 2, .bias = false}),
          std::make_shared<nn::BatchNorm2d>(4)}));
  bottleneck->to(DType::Float64);
  check_gradients(
      [&](const TensorList& in) {
        bottleneck->to(in[0].device());
        return TensorList{(*bottleneck)(in[0])};
      },
      {make_input({2, 2, 4, 4}, -1, 1, 9)});
}

TEST(ResNet, TrainUsesBatchStatisticsAndEvalTheRunningOnes) {
  auto model = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});
  const Tensor x = image_batch(2, 16, 21);
  const Tensor x0 = x.narrow(0, 0, 1), x1 = x.narrow(0, 1, 1);

  // Training: the running statistics move and a sample's output depends on the rest of the batch.
  EXPECT_TRUE(model->is_training());
  const Tensor train_pair = (*model)(x);
  EXPECT_EQ(model->bn1->num_batches_tracked.item<int64_t>(), 1);
  EXPECT_GT(max_abs_diff(model->bn1->running_mean, zeros({64})), 0.0);
  const Tensor train_alone = (*model)(x0);
  EXPECT_GT(rel_diff(train_pair.narrow(0, 0, 1), train_alone), 1e-3);

  // Eval: every module switches, the running statistics stay put, and samples are independent.
  model->eval();
  for (const auto& [name, m] : model->named_modules()) EXPECT_FALSE(m->is_training()) << name;
  const std::vector<double> mean_before = values(model->layer3->at<nn::models::BasicBlock>(1)->bn2->running_mean);
  const Tensor eval_pair = (*model)(x);
  EXPECT_EQ(values(model->layer3->at<nn::models::BasicBlock>(1)->bn2->running_mean), mean_before);
  EXPECT_EQ(model->bn1->num_batches_tracked.item<int64_t>(), 2);
  EXPECT_LT(rel_diff(eval_pair.narrow(0, 0, 1), (*model)(x0)), 1e-4);
  EXPECT_LT(rel_diff(eval_pair.narrow(0, 1, 1), (*model)(x1)), 1e-4);
  EXPECT_GT(rel_diff(eval_pair, train_pair), 1e-3);

  model->train();
  for (const auto& [name, m] : model->named_modules()) EXPECT_TRUE(m->is_training()) << name;
}

TEST(ResNet, ChannelsLastGivesTheSameLogits) {
  auto model = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});
  model->eval();
  const Tensor x = image_batch(2, 16, 8);
  const Tensor expected = (*model)(x);
  // The same weights, moved in place to NHWC strides.
  model->to(MemoryFormat::ChannelsLast);
  EXPECT_TRUE(model->conv1->weight.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_TRUE(model->layer2->at<nn::models::BasicBlock>(0)->downsample->at<nn::Conv2d>(0)->weight.is_contiguous(
      MemoryFormat::ChannelsLast));
  const Tensor x_cl = x.contiguous(MemoryFormat::ChannelsLast);
  const Tensor features = model->forward_features(x_cl);
  EXPECT_EQ(features.shape(), (Shape{2, 512, 2, 2}));
  EXPECT_TRUE(features.is_contiguous(MemoryFormat::ChannelsLast));
  const Tensor actual = (*model)(x_cl);
  EXPECT_EQ(actual.shape(), (Shape{2, 10}));
  EXPECT_LT(rel_diff(actual, expected), 1e-4);
}

TEST(ResNet, StateDictRoundTripsBetweenTwoModels) {
  auto a = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});
  auto b = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});
  EXPECT_GT(max_abs_diff(a->layer2->at<nn::models::BasicBlock>(0)->conv1->weight,
                         b->layer2->at<nn::models::BasicBlock>(0)->conv1->weight),
            0.0);
  const auto result = b->load_state_dict(a->state_dict());
  EXPECT_TRUE(result.missing_keys.empty());
  EXPECT_TRUE(result.unexpected_keys.empty());
  EXPECT_EQ(max_abs_diff(a->layer2->at<nn::models::BasicBlock>(0)->conv1->weight,
                         b->layer2->at<nn::models::BasicBlock>(0)->conv1->weight),
            0.0);
  // An ImageNet-stem state dict does not fit a CIFAR-stem model: conv1.weight's shape differs.
  expect_error([&] { b->load_state_dict(shared_resnet18().state_dict()); }, {"conv1.weight"});
}

TEST(ResNet, BadInputIsAClearError) {
  ResNet* model = &shared_resnet18();
  expect_error([&] { (*model)(zeros({1, 1, 8, 8})); }, {"ResNet", "(N, 3, H, W)", "[1, 1, 8, 8]"});
  expect_error([&] { (*model)(zeros({3, 8, 8})); }, {"ResNet", "(N, 3, H, W)", "unsqueeze"});
  expect_error([] { ResNet(nn::models::ResNetBlock::Basic, {2, 2, 2}); }, {"ResNet", "4 stages", "got 3"});
  expect_error([] { ResNet(nn::models::ResNetBlock::Basic, {2, 0, 2, 2}); }, {"ResNet", "at least one block"});
  expect_error([] { nn::models::resnet18({.num_classes = 0}); }, {"ResNet", "num_classes", "got 0"});
  expect_error([] { nn::models::BasicBlock(64, 128, 2); }, {"BasicBlock", "downsample"});
  expect_error([] { nn::models::Bottleneck(64, 64, 1); }, {"Bottleneck", "downsample", "64 -> 256"});
}

}  // namespace
}  // namespace kiln::testing
