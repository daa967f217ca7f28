// autocast::shadow: the 16-bit copy of a parameter that the optimizer step writes and the next autocast region
// uses instead of casting again (kiln/autograd/autocast.h). Here the test plays the optimizer's part on the
// CPU (buffer, write the cast, mark_written); the fused CUDA kernels that do it in training are tested in
// tests/optim/test_shadow_cuda.cpp. Every value is checked against internal::cast of the parameter.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kiln/autograd/stacked_cast.h"
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

// autocast::stacked_cast: the casts of several parameters stacked along dim 0 (attention's query, key and value).
Tensor param_rows(int64_t rows, int seed) {
  Tensor p = make(uniform(static_cast<size_t>(rows * 3), -2, 2, static_cast<uint64_t>(seed)), {rows, 3});
  p.requires_grad_(true);
  return p;
}

Tensor cat_of_casts(const std::vector<Tensor>& ps, DType dtype) {
  std::vector<Tensor> casts;
  for (const Tensor& p : ps) casts.push_back(internal::cast(p, dtype));
  return internal::cat(casts, 0);
}

Tensor region_stacked_cast(const std::vector<Tensor>& ps, DType dtype) {
  autocast::CacheRegion region;
  return autocast::stacked_cast(ps, dtype);
}

// d/dp_i sum(s * c) for the stack s: the rows of c that s took from p_i, in float32. c = 1, 2, 3, ... (exact in
// bfloat16).
void expect_row_gradients(const Tensor& s, const std::vector<Tensor>& ps) {
  const int64_t rows = s.size(0);
  std::vector<double> c(static_cast<size_t>(rows * 3));
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<double>(i + 1);
  (s * make(c, {rows, 3}).to(s.dtype())).to(DType::Float32).sum().backward();
  int64_t at = 0;
  for (const Tensor& p : ps) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().dtype(), DType::Float32);
    kiln::testing::expect_values(p.grad(), {p.size(0), 3},
                                 std::vector<double>(c.begin() + at * 3, c.begin() + (at + p.size(0)) * 3), 0, 0);
    at += p.size(0);
  }
}

TEST(AutocastShadow, StackedCastIsOneBufferOnceTheOptimizerHasWrittenTheShadows) {
  std::vector<Tensor> ps = {param_rows(4, 21), param_rows(2, 22), param_rows(4, 23)};
  // The first region: the cat of the casts, and the shadows arranged as rows of one buffer.
  const Tensor first = region_stacked_cast(ps, DType::BFloat16);
  EXPECT_TRUE(same_bits(first, cat_of_casts(ps, DType::BFloat16)));
  std::vector<Tensor> bufs;
  for (Tensor& p : ps) bufs.push_back(optimizer_step(p, 0.25));
  for (const Tensor& b : bufs) ASSERT_TRUE(b.defined());
  EXPECT_TRUE(bufs[0].is_alias_of(bufs[1]) && bufs[1].is_alias_of(bufs[2]));
  EXPECT_EQ(static_cast<const char*>(bufs[1].data_ptr()), static_cast<const char*>(bufs[0].data_ptr()) + 4 * 3 * 2);

  Tensor s;
  {
    autocast::CacheRegion region;
    s = autocast::stacked_cast(ps, DType::BFloat16);
    EXPECT_EQ(s.data_ptr(), bufs[0].data_ptr()) << "the region stacked the casts again";
    EXPECT_EQ(s.shape(), (Shape{10, 3}));
    EXPECT_TRUE(same_bits(s, cat_of_casts(ps, DType::BFloat16)));
    ASSERT_TRUE(s.requires_grad());
    expect_row_gradients(s, ps);
  }
  // The gradient came back as one tensor: each .grad is its rows of it, kept as they are (no copy), and disjoint.
  EXPECT_EQ(static_cast<const char*>(ps[1].grad().data_ptr()),
            static_cast<const char*>(ps[0].grad().data_ptr()) + 4 * 3 * 4);
  EXPECT_EQ(static_cast<const char*>(ps[2].grad().data_ptr()),
            static_cast<const char*>(ps[1].grad().data_ptr()) + 2 * 3 * 4);
  ps[0].mutable_grad().zero_();
  kiln::testing::expect_values(ps[1].grad(), {2, 3}, {13, 14, 15, 16, 17, 18}, 0, 0);
}

TEST(AutocastShadow, StackedCastIsTheCatOfTheCastsWhereTheShadowsAreNotCurrent) {
  std::vector<Tensor> ps = {param_rows(3, 31), param_rows(3, 32)};
  region_stacked_cast(ps, DType::BFloat16);
  std::vector<Tensor> bufs;
  for (Tensor& p : ps) bufs.push_back(optimizer_step(p, 0.5));
  {
    NoGradGuard no_grad;
    internal::mul_(ps[1], 2.0);  // written after the step: its shadow is stale
  }
  {
    autocast::CacheRegion region;
    const Tensor s = autocast::stacked_cast(ps, DType::BFloat16);
    EXPECT_FALSE(s.is_alias_of(bufs[0]));
    EXPECT_TRUE(same_bits(s, cat_of_casts(ps, DType::BFloat16)));
    expect_row_gradients(s, ps);
  }
  // Outside a region (nothing cached): the cat of the casts as well, and in another order, too.
  for (Tensor& p : ps) p.mutable_grad() = Tensor();
  const std::vector<Tensor> swapped = {ps[1], ps[0]};
  const Tensor s = autocast::stacked_cast(swapped, DType::Float16);
  EXPECT_TRUE(same_bits(s, cat_of_casts(swapped, DType::Float16)));
  expect_row_gradients(s, swapped);
  expect_error([&] { autocast::stacked_cast({}, DType::BFloat16); }, {"stacked_cast", "no parameters"});
}

TEST(AutocastShadow, MarkWrittenWithoutABufferIsAnError) {
  Tensor p = param(8);
  expect_error([&] { autocast::shadow::mark_written(p); }, {"was asked for with shadow::buffer()"});
}

}  // namespace
}  // namespace kiln
