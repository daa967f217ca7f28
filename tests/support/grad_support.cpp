#include "support/grad_support.h"

#include <gtest/gtest.h>

#include "support/test_support.h"

namespace kiln::testing {

Tensor make_input(const Shape& shape, double lo, double hi, uint64_t seed) {
  return make(uniform(kiln::numel(shape), lo, hi, seed), shape, {.dtype = DType::Float64}).requires_grad_();
}

LinearGradients linear_gradients(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>& g, int64_t rows, int64_t in, int64_t out) {
  LinearGradients r{std::vector<double>(static_cast<size_t>(rows * in), 0.0),
                    std::vector<double>(static_cast<size_t>(out * in), 0.0),
                    std::vector<double>(static_cast<size_t>(out), 0.0)};
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      const double gi = g[static_cast<size_t>(i * out + o)];
      r.db[static_cast<size_t>(o)] += gi;
      for (int64_t k = 0; k < in; ++k) {
        r.dw[static_cast<size_t>(o * in + k)] += gi * x[static_cast<size_t>(i * in + k)];
        r.dx[static_cast<size_t>(i * in + k)] += gi * w[static_cast<size_t>(o * in + k)];
      }
    }
  }
  return r;
}

namespace {

// Gradients of sum(outputs[k] * weights[k]) with respect to the inputs that require grad, on `device`.
TensorList device_gradients(const autograd::DifferentiableFn& fn, const TensorList& inputs, Device device,
                            std::vector<Tensor>& weights) {
  TensorList moved;
  TensorList wrt;
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      moved.push_back(t);
      continue;
    }
    Tensor m = t.detach().to(device);
    if (t.requires_grad()) {
      m.requires_grad_();
      wrt.push_back(m);
    }
    moved.push_back(m);
  }
  TensorList outs = fn(moved);
  TensorList roots, grads;
  size_t w = 0;
  for (const Tensor& o : outs) {
    if (!o.defined() || !o.is_floating_point() || !o.requires_grad()) continue;
    if (weights.size() <= w) {
      weights.push_back(make(uniform(o.numel(), -1, 1, 100 + w), o.shape(), {.dtype = o.dtype()}));
    }
    roots.push_back(o);
    grads.push_back(weights[w].to(o.device(), o.dtype()));
    ++w;
  }
  return autograd::grad(roots, wrt, grads, false, /*allow_unused=*/true);
}

}  // namespace

void check_gradients(const autograd::DifferentiableFn& fn, const TensorList& inputs, const GradCheckOptions& options) {
  autograd::gradcheck(fn, inputs, options.gradcheck);
  std::vector<Tensor> weights;
  const TensorList reference = device_gradients(fn, inputs, Device::cpu(), weights);
  for (Device device : test_devices()) {
    if (device.is_cpu()) continue;
    const TensorList got = device_gradients(fn, inputs, device, weights);
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].defined(), reference[i].defined()) << "gradient " << i << " on " << device;
      if (!got[i].defined()) continue;
      SCOPED_TRACE("gradient " + std::to_string(i) + " on " + device.str() + " vs cpu");
      expect_values(got[i], reference[i].shape(), reference[i].to_vector<double>(), options.device_rtol,
                    options.device_atol);
    }
  }
}

}  // namespace kiln::testing
