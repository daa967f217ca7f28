// The ResNet family, module for module as torchvision's torchvision/models/resnet.py builds it, so names match.
#include "kiln/layers/models/resnet.h"

#include <string>
#include <utility>

#include "kiln/layers/init.h"   // kaiming_normal_, ones_, zeros_
#include "kiln/tensor/error.h"  // KILN_CHECK

namespace kiln::nn::models {
namespace {

std::shared_ptr<Conv2d> conv3x3(int64_t in_planes, int64_t out_planes, int64_t stride = 1) {
  return std::make_shared<Conv2d>(in_planes, out_planes, 3,
                                  Conv2dOptions{.stride = stride, .padding = 1, .bias = false});
}

std::shared_ptr<Conv2d> conv1x1(int64_t in_planes, int64_t out_planes, int64_t stride = 1) {
  return std::make_shared<Conv2d>(in_planes, out_planes, 1, Conv2dOptions{.stride = stride, .bias = false});
}

void check_block_args(const char* block, int64_t in_planes, int64_t planes, int64_t stride) {
  KILN_CHECK(in_planes > 0 && planes > 0 && stride > 0, block,
             ": in_planes, planes and stride must be positive, got in_planes = ", in_planes, ", planes = ", planes,
             ", stride = ", stride);
}

// The shortcut must change shape exactly when the block does; a mismatch would only surface as a broadcast
// error deep inside forward.
void check_downsample(const char* block, int64_t in_planes, int64_t out_planes, int64_t stride,
                      const std::shared_ptr<Sequential>& downsample) {
  KILN_CHECK(downsample != nullptr || (stride == 1 && in_planes == out_planes), block, ": with stride ", stride,
             " and ", in_planes, " -> ", out_planes,
             " channels the shortcut needs a downsample (1x1 conv + BatchNorm2d); pass one");
}

}  // namespace

// ---------------------------------------------------------------- BasicBlock

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, std::shared_ptr<Sequential> downsample_in)
    : Module("BasicBlock") {
  check_block_args("BasicBlock", in_planes, planes, stride);
  check_downsample("BasicBlock", in_planes, planes * kExpansion, stride, downsample_in);
  // Registration order is torchvision's: conv1, bn1, relu, conv2, bn2, downsample.
  conv1 = register_module("conv1", conv3x3(in_planes, planes, stride));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  relu = register_module("relu", std::make_shared<ReLU>());
  conv2 = register_module("conv2", conv3x3(planes, planes));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  if (downsample_in != nullptr) downsample = register_module("downsample", std::move(downsample_in));
}

Tensor BasicBlock::forward(const Tensor& x) {
  // (N, C_in, H, W) -> (N, planes, H / s, W / s)
  Tensor out = bn1->forward_relu(conv1(x));  // batch norm + ReLU in one pass on the GPU
  out = conv2(out);
  const Tensor identity = downsample != nullptr ? downsample(x) : x;
  // relu(bn2(out) + identity), one pass on the GPU (the registered `relu` module stays, for the names).
  return bn2->forward_add_relu(out, identity);
}

// ---------------------------------------------------------------- Bottleneck

Bottleneck::Bottleneck(int64_t in_planes, int64_t planes, int64_t stride, std::shared_ptr<Sequential> downsample_in)
    : Module("Bottleneck") {
  check_block_args("Bottleneck", in_planes, planes, stride);
  check_downsample("Bottleneck", in_planes, planes * kExpansion, stride, downsample_in);
  // torchvision's order: conv1, bn1, conv2, bn2, conv3, bn3, relu, downsample.
  conv1 = register_module("conv1", conv1x1(in_planes, planes));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  conv2 = register_module("conv2", conv3x3(planes, planes, stride));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  conv3 = register_module("conv3", conv1x1(planes, planes * kExpansion));
  bn3 = register_module("bn3", std::make_shared<BatchNorm2d>(planes * kExpansion));
  relu = register_module("relu", std::make_shared<ReLU>());
  if (downsample_in != nullptr) downsample = register_module("downsample", std::move(downsample_in));
}

Tensor Bottleneck::forward(const Tensor& x) {
  // (N, C_in, H, W) -> (N, planes, H, W) -> (N, planes, H / s, W / s) -> (N, 4 planes, H / s, W / s)
  Tensor out = bn1->forward_relu(conv1(x));  // batch norm + ReLU in one pass on the GPU
  out = bn2->forward_relu(conv2(out));
  out = conv3(out);
  const Tensor identity = downsample != nullptr ? downsample(x) : x;
  // relu(bn3(out) + identity), one pass on the GPU (the registered `relu` module stays, for the names).
  return bn3->forward_add_relu(out, identity);
}

// ---------------------------------------------------------------- ResNet

ResNet::ResNet(ResNetBlock block_in, std::vector<int64_t> blocks_per_stage_in, ResNetOptions options_in)
    : Module("ResNet"), block(block_in), blocks_per_stage(std::move(blocks_per_stage_in)), options(options_in) {
  KILN_CHECK(blocks_per_stage.size() == 4,
             "ResNet: blocks_per_stage must give the block count of each of the 4 stages ",
             "(e.g. {2, 2, 2, 2} for ResNet-18), got ", blocks_per_stage.size(), " numbers");
  for (int64_t n : blocks_per_stage) {
    KILN_CHECK(n > 0, "ResNet: every stage needs at least one block, got blocks_per_stage = ", blocks_per_stage);
  }
  KILN_CHECK(options.num_classes > 0, "ResNet: num_classes must be positive, got ", options.num_classes);

  if (options.cifar_stem) {
    // (N, 3, 32, 32) -> (N, 64, 32, 32)
    conv1 = register_module("conv1", conv3x3(3, 64));
  } else {
    // (N, 3, 224, 224) -> (N, 64, 112, 112)
    conv1 = register_module(
        "conv1", std::make_shared<Conv2d>(3, 64, 7, Conv2dOptions{.stride = 2, .padding = 3, .bias = false}));
  }
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(64));
  relu = register_module("relu", std::make_shared<ReLU>());
  if (options.cifar_stem) {
    maxpool = register_module("maxpool", std::make_shared<Identity>());
  } else {
    // (N, 64, 112, 112) -> (N, 64, 56, 56)
    maxpool = register_module("maxpool",
                              std::make_shared<MaxPool2d>(Pool2dOptions{.kernel_size = 3, .stride = 2, .padding = 1}));
  }
  layer1 = register_module("layer1", make_stage(64, blocks_per_stage[0], 1));
  layer2 = register_module("layer2", make_stage(128, blocks_per_stage[1], 2));
  layer3 = register_module("layer3", make_stage(256, blocks_per_stage[2], 2));
  layer4 = register_module("layer4", make_stage(512, blocks_per_stage[3], 2));
  avgpool = register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
  fc = register_module("fc", std::make_shared<Linear>(in_planes_, options.num_classes));
  init_weights();
}

std::shared_ptr<Sequential> ResNet::make_stage(int64_t planes, int64_t num_blocks, int64_t stride) {
  const int64_t expansion = block == ResNetBlock::Basic ? BasicBlock::kExpansion : Bottleneck::kExpansion;
  auto make_block = [&](int64_t in_planes, int64_t s, std::shared_ptr<Sequential> downsample) -> ModulePtr {
    if (block == ResNetBlock::Basic) return std::make_shared<BasicBlock>(in_planes, planes, s, std::move(downsample));
    return std::make_shared<Bottleneck>(in_planes, planes, s, std::move(downsample));
  };
  // The first block changes resolution and/or width; its shortcut is then a strided 1x1 conv + BN
  // ("downsample.0", "downsample.1").
  std::shared_ptr<Sequential> downsample;
  if (stride != 1 || in_planes_ != planes * expansion) {
    downsample = std::make_shared<Sequential>(std::vector<ModulePtr>{
        conv1x1(in_planes_, planes * expansion, stride), std::make_shared<BatchNorm2d>(planes * expansion)});
  }
  auto stage = std::make_shared<Sequential>();
  stage->append(make_block(in_planes_, stride, std::move(downsample)));
  in_planes_ = planes * expansion;
  for (int64_t i = 1; i < num_blocks; ++i) stage->append(make_block(in_planes_, 1, nullptr));
  return stage;
}

void ResNet::init_weights() {
  // torchvision: every conv kaiming_normal_(mode="fan_out", nonlinearity="relu"), every BN weight 1 bias 0;
  // Linear keeps its default.
  apply([](Module& m) {
    if (auto* conv = dynamic_cast<Conv2d*>(&m)) {
      init::kaiming_normal_(conv->weight, 0, init::FanMode::FanOut, init::Nonlinearity::ReLU);
    } else if (auto* bn = dynamic_cast<BatchNorm2d*>(&m)) {
      init::ones_(bn->weight);
      init::zeros_(bn->bias);
    }
  });
  if (options.zero_init_residual) {
    apply([](Module& m) {
      if (auto* b = dynamic_cast<Bottleneck*>(&m)) init::zeros_(b->bn3->weight);
      if (auto* b = dynamic_cast<BasicBlock*>(&m)) init::zeros_(b->bn2->weight);
    });
  }
}

Tensor ResNet::forward_features(const Tensor& x) {
  KILN_CHECK(x.dim() == 4 && x.size(1) == 3, "ResNet: expected images of shape (N, 3, H, W), got shape ", x.shape(),
             "; add a batch dim with unsqueeze(0) for a single image");
  Tensor h = bn1->forward_relu(conv1(x));  // (N, 64, H / 2, W / 2); (N, 64, H, W) with the CIFAR stem
  h = maxpool(h);                          // (N, 64, H / 4, W / 4); unchanged with the CIFAR stem
  h = layer1(h);                           // (N, 64 e, H / 4, W / 4)
  h = layer2(h);                           // (N, 128 e, H / 8, W / 8)
  h = layer3(h);                           // (N, 256 e, H / 16, W / 16)
  return layer4(h);                        // (N, 512 e, H / 32, W / 32)
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor h = avgpool(forward_features(x));  // (N, 512 e, 1, 1)
  return fc(flatten(h, 1));                 // (N, 512 e) -> (N, num_classes)
}

// ---------------------------------------------------------------- factories

Handle<ResNet> resnet18(ResNetOptions options) {
  return std::make_shared<ResNet>(ResNetBlock::Basic, std::vector<int64_t>{2, 2, 2, 2}, options);
}
Handle<ResNet> resnet34(ResNetOptions options) {
  return std::make_shared<ResNet>(ResNetBlock::Basic, std::vector<int64_t>{3, 4, 6, 3}, options);
}
Handle<ResNet> resnet50(ResNetOptions options) {
  return std::make_shared<ResNet>(ResNetBlock::Bottleneck, std::vector<int64_t>{3, 4, 6, 3}, options);
}
Handle<ResNet> resnet101(ResNetOptions options) {
  return std::make_shared<ResNet>(ResNetBlock::Bottleneck, std::vector<int64_t>{3, 4, 23, 3}, options);
}
Handle<ResNet> resnet152(ResNetOptions options) {
  return std::make_shared<ResNet>(ResNetBlock::Bottleneck, std::vector<int64_t>{3, 8, 36, 3}, options);
}

}  // namespace kiln::nn::models
