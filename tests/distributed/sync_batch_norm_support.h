// tests/distributed/sync_batch_norm_support.h — what the SyncBatchNorm tests share (single process and mpirun).
//
//   BnCase k{"nchw", {4, 3, 5, 5}};
//   auto bn = make_bn(k, dev);                          // BatchNorm2d with deterministic weight and bias
//   Tensor x = make_leaf(uniform(numel(k.shape), -2, 2), k.shape, k.channels_last, dev);
//   Tensor y = train_step(*bn, x, make_out_grad(k.shape, dev), k.relu);   // forward, backward of sum(y * g)
//
// The loss sum(y * g) with a fixed g is a sum over samples, so with data parallelism the gradient of the
// global loss is the sum of the ranks' losses' gradients: the comparisons against one process are exact.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/layers/layers.h"  // nn::BatchNorm, nn::BatchNormStatsReducer
#include "support/test_support.h"

namespace kiln::testing {

struct BnCase {
  std::string name;
  Shape shape;  // (N, C), (N, C, L) -> BatchNorm1d; (N, C, H, W) -> BatchNorm2d
  bool channels_last = false;
  bool relu = false;  // forward_relu instead of forward
  bool affine = true;
  bool track_running_stats = true;
};

inline int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// BatchNorm1d or BatchNorm2d for the case's rank, weight in [0.5, 1.5) and bias in [-0.5, 0.5) (not the
// ones and zeros they start with, so the affine part is exercised), on `dev` in `dtype`.
inline std::shared_ptr<nn::BatchNorm> make_bn(const BnCase& k, Device dev, DType dtype = DType::Float32) {
  const int64_t c = k.shape[1];
  const nn::BatchNormOptions o{.affine = k.affine, .track_running_stats = k.track_running_stats};
  std::shared_ptr<nn::BatchNorm> bn;
  if (k.shape.size() == 4) {
    bn = std::make_shared<nn::BatchNorm2d>(c, o);
  } else {
    bn = std::make_shared<nn::BatchNorm1d>(c, o);
  }
  if (k.affine) {
    NoGradGuard no_grad;
    copy_(bn->weight, make(uniform(c, 0.5, 1.5, 11), {c}));
    copy_(bn->bias, make(uniform(c, -0.5, 0.5, 12), {c}));
  }
  bn->to(dev, dtype);
  return bn;
}

// A leaf that requires grad, channels-last in memory when asked (4-d only).
inline Tensor make_leaf(const std::vector<double>& v, const Shape& shape, bool channels_last, Device dev,
                        DType dtype = DType::Float32) {
  Tensor x = make(v, shape, {.dtype = dtype, .device = dev});
  if (channels_last) x = x.to(MemoryFormat::ChannelsLast);
  x.requires_grad_();
  return x;
}

// The fixed weights g of the loss sum(y * g).
inline Tensor make_out_grad(const Shape& shape, Device dev, DType dtype = DType::Float32, uint64_t seed = 31) {
  return make(uniform(numel_of(shape), -1, 1, seed), shape, {.dtype = dtype, .device = dev});
}

// One training step of the layer (forward, then backward of sum(y * g)); returns y.
inline Tensor train_step(nn::BatchNorm& bn, const Tensor& x, const Tensor& g, bool relu) {
  Tensor y = relu ? bn.forward_relu(x) : bn.forward(x);
  (y * g).sum().backward();
  return y;
}

// a against b elementwise (any device, dtype, layout).
inline void expect_close(const Tensor& a, const Tensor& b, double rtol, double atol, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(a.defined()) << what << " is undefined";
  ASSERT_TRUE(b.defined()) << what << " (reference) is undefined";
  expect_values(a, b.shape(), values(b), rtol, atol);
}

}  // namespace kiln::testing
