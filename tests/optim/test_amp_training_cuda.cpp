// Mixed precision end to end on a GPU: a ResNet-18 (CIFAR stem) trained from one initialisation three times —
// float32, float16 under amp::Autocast with amp::GradScaler, and bfloat16 under amp::Autocast without scaling —
// on one fixed batch of 32x32 images whose labels a random linear teacher assigns. Both mixed-precision runs must
// track the float32 loss curve step by step and learn the batch as well.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

namespace kiln::testing {
namespace {

enum class Precision { Float32, Float16Scaled, BFloat16 };

std::vector<double> train(Precision precision, const nn::StateDict& init, const Tensor& x, const Tensor& y, int steps,
                          int* skipped) {
  auto model = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});
  model->load_state_dict(init);
  model->to(Device::cuda(0));
  model->train();
  optim::SGD opt(model->parameters(), {.lr = 0.02, .momentum = 0.9});
  amp::GradScaler scaler({.growth_interval = 10, .enabled = precision == Precision::Float16Scaled});
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    Tensor loss;
    {
      amp::Autocast cast(precision == Precision::BFloat16 ? DType::BFloat16 : DType::Float16,
                         /*enabled=*/precision != Precision::Float32);
      loss = nn::cross_entropy((*model)(x), y);
    }
    EXPECT_EQ(loss.dtype(), DType::Float32);  // losses run in float32 under autocast
    const double before = scaler.is_enabled() ? scaler.get_scale() : 1.0;
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    if (scaler.is_enabled() && scaler.get_scale() < before) ++*skipped;  // a backoff means a skipped step
    losses.push_back(loss.item<double>());
  }
  return losses;
}

TEST(CudaAmpTraining, ResNet18Float16AndBFloat16TrackFloat32) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  manual_seed(1234);
  const Device dev = Device::cuda(0);
  const int64_t n = 64;
  Tensor x = randn({n, 3, 32, 32}, {.device = dev});
  Tensor teacher = randn({3 * 32 * 32, 10}, {.device = dev});
  Tensor y = std::get<1>(max(matmul(reshape(x, {n, -1}), teacher), 1));  // (N) Int64 labels
  auto init_model = nn::models::resnet18({.num_classes = 10, .cifar_stem = true});
  const nn::StateDict init = init_model->state_dict();

  const int steps = 30;
  int skipped32 = 0, skipped16 = 0, skipped_bf = 0;
  const auto f32 = train(Precision::Float32, init, x, y, steps, &skipped32);
  const auto f16 = train(Precision::Float16Scaled, init, x, y, steps, &skipped16);
  const auto bf16 = train(Precision::BFloat16, init, x, y, steps, &skipped_bf);

  // The float32 run learns the batch.
  ASSERT_LT(f32.back(), 0.3 * f32.front()) << "float32 did not learn: " << f32.front() << " -> " << f32.back();
  for (const auto* run : {&f16, &bf16}) {
    const std::string name = run == &f16 ? "float16 + GradScaler" : "bfloat16";
    SCOPED_TRACE(name);
    double mean_rel = 0;
    for (int i = 0; i < steps; ++i) {
      ASSERT_TRUE(std::isfinite((*run)[i])) << "step " << i;
      mean_rel += std::abs((*run)[i] - f32[i]) / std::max(f32[i], 0.05);
    }
    mean_rel /= steps;
    // The same start (same weights and data) and the same curve within the precision's noise.
    EXPECT_NEAR((*run)[0], f32[0], 0.02 * f32[0]);
    EXPECT_LT(mean_rel, 0.15) << name << " strays from the float32 curve on average by " << mean_rel;
    EXPECT_LT((*run).back(), 0.3 * (*run).front()) << name << " did not learn the batch";
  }
  // The initial scale of 2^16 overflows at most a few times before it settles.
  EXPECT_LE(skipped16, 5);
}

}  // namespace
}  // namespace kiln::testing
