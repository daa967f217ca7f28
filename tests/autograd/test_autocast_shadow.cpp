// autocast::shadow: the 16-bit copy of a parameter that the optimizer step writes and the next autocast region
// uses instead of casting again (kiln/autograd/autocast.h). Here the test plays the optimizer's part on the
// CPU (buffer, write the cast, mark_written); the fused CUDA kernels that do it in training are tested in
// tests/optim/test_shadow_cuda.cpp. Every value is checked against internal::cast of the parameter.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using kiln::testing::expect_error;
using kiln::testing::make;
using kiln::testing::uniform;

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ca = internal::contiguous(a), cb = internal::contiguous(b);
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

Tensor param(int seed) {
  Tensor p = make(uniform(12, -2, 2, static_cast<uint64_t>(seed)), {4, 3});
  p.requires_grad_(true);
  return p;
}

// One region's cast of p.
Tensor region_cast(const Tensor& p, DType dtype) {
  autocast::CacheRegion region;
  return autocast::cast_to(p, dtype);
}

// What a fused optimizer does after updating p in place: version bumped, the cast written, marked.
Tensor optimizer_step(Tensor& p, double delta) {
  NoGradGuard no_grad;
  Tensor buf = autocast::shadow::buffer(p);
  internal::add_(p, delta);  // the update (bumps the version)
  if (buf.defined()) {
    internal::copy_(buf, internal::cast(p, buf.dtype()));
    autocast::shadow::mark_written(p);
  }
  return buf;
}

TEST(AutocastShadow, RegionUsesTheWrittenShadowAndGradientsReachTheParameter) {
  Tensor p = param(1);
  EXPECT_FALSE(autocast::shadow::buffer(p).defined());  // no region has cast it yet
  const Tensor first = region_cast(p, DType::BFloat16);
  EXPECT_TRUE(same_bits(first, internal::cast(p, DType::BFloat16)));
  const Tensor buf = optimizer_step(p, 0.25);
  ASSERT_TRUE(buf.defined());
  EXPECT_EQ(buf.dtype(), DType::BFloat16);
  EXPECT_EQ(buf.shape(), p.shape());

  Tensor c;
  {
    autocast::CacheRegion region;
    c = autocast::cast_to(p, DType::BFloat16);
    EXPECT_TRUE(c.is_alias_of(buf)) << "the region cast the parameter again";
    EXPECT_TRUE(autocast::cast_to(p, DType::BFloat16).is_same(c));  // cached within the region
  }
  EXPECT_TRUE(same_bits(c, internal::cast(p, DType::BFloat16)));
  EXPECT_FALSE(buf.requires_grad());  // the shadow itself carries no history; the region's alias does
  ASSERT_TRUE(c.requires_grad());
  // d/dp sum(3 * c) = 3, in float32, in the parameter.
  Tensor loss = (c * 3.0).sum();
  loss.backward();
  ASSERT_TRUE(p.grad().defined());
  EXPECT_EQ(p.grad().dtype(), DType::Float32);
  kiln::testing::expect_values(p.grad(), {4, 3}, std::vector<double>(12, 3.0), 0, 0);
}

TEST(AutocastShadow, AnyOtherInPlaceWriteMakesTheRegionCastAgain) {
  Tensor p = param(2);
  region_cast(p, DType::BFloat16);
  const Tensor buf = optimizer_step(p, 0.5);
  {
    NoGradGuard no_grad;
    internal::mul_(p, 2.0);  // e.g. a user's p.mul_(2) between steps
  }
  const Tensor c = region_cast(p, DType::BFloat16);
  EXPECT_FALSE(c.is_alias_of(buf));
  EXPECT_TRUE(same_bits(c, internal::cast(p, DType::BFloat16)));
}

TEST(AutocastShadow, AShadowNotMarkedWrittenIsNotUsed) {
  Tensor p = param(3);
  region_cast(p, DType::BFloat16);
  const Tensor buf = autocast::shadow::buffer(p);  // asked for, never written
  ASSERT_TRUE(buf.defined());
  const Tensor c = region_cast(p, DType::BFloat16);
  EXPECT_FALSE(c.is_alias_of(buf));
  EXPECT_TRUE(same_bits(c, internal::cast(p, DType::BFloat16)));
  // Written, then asked for again (the next step has begun): not current until marked.
  optimizer_step(p, 1.0);
  autocast::shadow::buffer(p);
  EXPECT_FALSE(region_cast(p, DType::BFloat16).is_alias_of(buf));
}

TEST(AutocastShadow, ARegionOfAnotherDtypeCastsAndTheShadowFollowsIt) {
  Tensor p = param(4);
  region_cast(p, DType::BFloat16);
  optimizer_step(p, 0.5);
  const Tensor half = region_cast(p, DType::Float16);
  EXPECT_TRUE(same_bits(half, internal::cast(p, DType::Float16)));
  const Tensor buf = optimizer_step(p, 0.5);
  ASSERT_TRUE(buf.defined());
  EXPECT_EQ(buf.dtype(), DType::Float16);
  const Tensor again = region_cast(p, DType::Float16);
  EXPECT_TRUE(again.is_alias_of(buf));
  EXPECT_TRUE(same_bits(again, internal::cast(p, DType::Float16)));
}

TEST(AutocastShadow, OnlyDenseFloat32ParametersThatRegionsCastHaveShadows) {
  Tensor activation = param(5).detach();  // does not require grad: never cached, never shadowed
  region_cast(activation, DType::BFloat16);
  EXPECT_FALSE(autocast::shadow::buffer(activation).defined());
  Tensor p = param(6);
  {
    NoGradGuard no_grad;  // casts under no_grad are not cached either
    region_cast(p, DType::BFloat16);
  }
  EXPECT_FALSE(autocast::shadow::buffer(p).defined());
  EXPECT_FALSE(autocast::shadow::buffer(Tensor()).defined());
}

TEST(AutocastShadow, ShadowsOfFreedParametersAreDropped) {
  // 1,000 parameters, each cast by a region and then freed: without the sweep 1,000 entries would remain.
  for (int i = 0; i < 1000; ++i) {
    Tensor p = param(100 + i);
    region_cast(p, DType::BFloat16);
  }
  EXPECT_LT(autocast::shadow::count(), 300U);
  Tensor p = param(7);
  region_cast(p, DType::BFloat16);
  EXPECT_TRUE(autocast::shadow::buffer(p).defined());  // a live one is kept
}

TEST(AutocastShadow, MarkWrittenWithoutABufferIsAnError) {
  Tensor p = param(8);
  expect_error([&] { autocast::shadow::mark_written(p); }, {"was asked for with shadow::buffer()"});
}

}  // namespace
}  // namespace kiln
