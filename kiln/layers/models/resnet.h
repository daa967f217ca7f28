// kiln/layers/models/resnet.h — the ResNet family (18, 34, 50, 101, 152) as torchvision builds it.
//
//   using namespace kiln;
//   auto model = nn::models::resnet50({.num_classes = 1000});
//   model->to(Device::cuda(0), MemoryFormat::ChannelsLast);
//   Tensor logits = model(images);                        // (N, 3, 224, 224) -> (N, 1000)
//   auto cifar = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});   // (N, 3, 32, 32) -> (N, 10)
//
// Module, parameter and buffer names are torchvision's ("layer1.0.conv1.weight",
// "layer2.0.downsample.1.running_mean", "fc.bias", ...), so a state dict converted from torchvision's
// published weights loads with load_state_dict(). Bottleneck is "ResNet v1.5": its stride sits in the 3x3
// conv (conv2), as torchvision's. Initialisation as torchvision's: kaiming_normal_(fan_out, relu) for every
// conv, BatchNorm weight 1 and bias 0, the fc layer Linear's default.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/layers/containers.h"  // nn::Sequential
#include "kiln/layers/conv.h"        // nn::Conv2d
#include "kiln/layers/layers.h"      // nn::BatchNorm2d, nn::ReLU, nn::Linear
#include "kiln/layers/module.h"      // nn::Module
#include "kiln/layers/pooling.h"     // nn::MaxPool2d, nn::AdaptiveAvgPool2d

namespace kiln::nn::models {

// A ResNet's classes, its CIFAR stem (3x3 convolution, no max pooling), and the zero-initialised last batch norm of
// each block.
struct ResNetOptions {
  int64_t num_classes = 1000;  // fc's outputs; must be positive
  // Start the last BatchNorm of each residual branch (bn2 of BasicBlock, bn3 of Bottleneck) with weight 0,
  // so every block begins as the identity (Goyal et al. 2017); torchvision's zero_init_residual.
  bool zero_init_residual = false;
  // For 32x32 images (CIFAR): conv1 is 3x3 stride 1 padding 1 and there is no max-pool ("maxpool" is an
  // Identity), so layer1 sees 32x32 rather than 8x8. Parameter names stay the same; conv1.weight is
  // (64, 3, 3, 3) instead of (64, 3, 7, 7).
  bool cifar_stem = false;
};
// Another name for ResNetOptions.
using ResNetConfig = ResNetOptions;

// Two 3x3 convs (ResNet-18/34). x (N, in_planes, H, W) -> (N, planes, H / stride, W / stride).
class BasicBlock : public Module {
 public:
  static constexpr int64_t kExpansion = 1;  // output channels per `planes`
  // downsample: the projection of the shortcut (1x1 conv "0" + BatchNorm "1"), or null for the identity.
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride = 1, std::shared_ptr<Sequential> downsample = nullptr);
  Tensor forward(const Tensor& x) override;

  Handle<Conv2d> conv1;           // 3x3, stride `stride`
  Handle<BatchNorm2d> bn1;        // after conv1, with the ReLU fused (BatchNorm::forward_relu)
  Handle<ReLU> relu;              // registered for torchvision's names; forward fuses the ReLUs into bn1 and bn2
  Handle<Conv2d> conv2;           // 3x3
  Handle<BatchNorm2d> bn2;        // after conv2, then + shortcut and ReLU (BatchNorm::forward_add_relu)
  Handle<Sequential> downsample;  // null: identity shortcut
};

// 1x1 reduce, 3x3 (with the stride: v1.5), 1x1 expand by 4 (ResNet-50/101/152).
// x (N, in_planes, H, W) -> (N, 4 planes, H / stride, W / stride).
class Bottleneck : public Module {
 public:
  static constexpr int64_t kExpansion = 4;  // output channels per `planes`
  // downsample: the projection of the shortcut (1x1 conv "0" + BatchNorm "1"), or null for the identity; kiln::Error
  // if it is null while stride != 1 or in_planes != 4 planes.
  Bottleneck(int64_t in_planes, int64_t planes, int64_t stride = 1, std::shared_ptr<Sequential> downsample = nullptr);
  Tensor forward(const Tensor& x) override;

  Handle<Conv2d> conv1;           // 1x1, in_planes -> planes
  Handle<BatchNorm2d> bn1;        // after conv1, with the ReLU fused
  Handle<Conv2d> conv2;           // 3x3, stride `stride`, planes -> planes
  Handle<BatchNorm2d> bn2;        // after conv2, with the ReLU fused
  Handle<Conv2d> conv3;           // 1x1, planes -> 4 planes
  Handle<BatchNorm2d> bn3;        // after conv3, then + shortcut and ReLU (BatchNorm::forward_add_relu)
  Handle<ReLU> relu;              // registered for torchvision's names; forward fuses the ReLUs into the batch norms
  Handle<Sequential> downsample;  // null: identity shortcut
};

// The residual block of a ResNet's stages: BasicBlock (ResNet-18/34) or Bottleneck (ResNet-50 and deeper).
enum class ResNetBlock { Basic, Bottleneck };

// ResNet-18 to -152 with torchvision's parameter names (so its checkpoints load); made by resnet18() ... resnet152().
class ResNet : public Module {
 public:
  // blocks_per_stage: the number of blocks in layer1..layer4, e.g. {3, 4, 6, 3} for ResNet-50.
  ResNet(ResNetBlock block, std::vector<int64_t> blocks_per_stage, ResNetOptions options = {});
  // x (N, 3, H, W) -> logits (N, num_classes). Channels-last in, channels-last through the convolutions.
  Tensor forward(const Tensor& x) override;
  // The stem and the four stages, without pooling and fc: (N, 3, H, W) -> (N, 512 * expansion, H / 32, W / 32)
  // (H / 8 with the CIFAR stem).
  Tensor forward_features(const Tensor& x);

  ResNetBlock block;                      // as constructed
  std::vector<int64_t> blocks_per_stage;  // as constructed: 4 positive counts
  ResNetOptions options;                  // as constructed
  Handle<Conv2d> conv1;                   // 7x7 stride 2, 3 -> 64 channels (3x3 stride 1 with the CIFAR stem)
  Handle<BatchNorm2d> bn1;                // after conv1, with the ReLU fused
  Handle<ReLU> relu;                      // registered for torchvision's names; forward fuses it into bn1
  ModulePtr maxpool;                      // MaxPool2d(3, 2, 1), or Identity with the CIFAR stem
  // The four stages of blocks: layer1 (64 planes, stride 1), then layer2, layer3 and layer4, which halve H and W.
  Handle<Sequential> layer1;          // 64 planes, stride 1
  Handle<Sequential> layer2;          // 128 planes, stride 2
  Handle<Sequential> layer3;          // 256 planes, stride 2
  Handle<Sequential> layer4;          // 512 planes, stride 2
  Handle<AdaptiveAvgPool2d> avgpool;  // to 1x1
  Handle<Linear> fc;                  // (num_classes, 512 * expansion)

 private:
  std::shared_ptr<Sequential> make_stage(int64_t planes, int64_t num_blocks, int64_t stride);
  void init_weights();
  int64_t in_planes_ = 64;
};

Handle<ResNet> resnet18(ResNetOptions options = {});   // BasicBlock {2, 2, 2, 2}: 11,689,512 parameters
Handle<ResNet> resnet34(ResNetOptions options = {});   // BasicBlock {3, 4, 6, 3}: 21,797,672
Handle<ResNet> resnet50(ResNetOptions options = {});   // Bottleneck {3, 4, 6, 3}: 25,557,032
Handle<ResNet> resnet101(ResNetOptions options = {});  // Bottleneck {3, 4, 23, 3}: 44,549,160
Handle<ResNet> resnet152(ResNetOptions options = {});  // Bottleneck {3, 8, 36, 3}: 60,192,808

}  // namespace kiln::nn::models

namespace kiln {
namespace models = nn::models;  // kiln::models::resnet50(...), as in the design sketch
}  // namespace kiln
