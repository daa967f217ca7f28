// tests/support/grad_support.h — gradient checks every differentiable op's test uses.
//
//   check_gradients([](const TensorList& in) { return TensorList{kiln::tanh(in[0])}; },
//                   {make_input({3, 4})});
//
// One call checks an op twice: gradcheck in float64 on the CPU (analytic vs finite differences), then,
// on every other test device (cuda:0 where a GPU is visible), that backward gives the same gradients
// as on the CPU for the same inputs and the same output gradient.
#pragma once

#include "kiln/kiln.h"

namespace kiln::testing {

using autograd::TensorList;

// A CPU float64 tensor of deterministic values in [lo, hi), requiring grad.
Tensor make_input(const Shape& shape, double lo = -1.0, double hi = 1.0, uint64_t seed = 7);

struct GradCheckOptions {
  autograd::GradcheckOptions gradcheck;
  double device_rtol = 1e-6;  // other devices vs the CPU, in float64
  double device_atol = 1e-9;
};

// inputs: CPU float64 (those that require grad are checked; others, e.g. indices, pass through).
void check_gradients(const autograd::DifferentiableFn& fn, const TensorList& inputs,
                     const GradCheckOptions& options = {});

// The gradients of sum(g * (x w^T + b)) in doubles: x (rows, in), w (out, in), g (rows, out), all row-major.
struct LinearGradients {
  std::vector<double> dx, dw, db;  // (rows, in), (out, in), (out)
};
LinearGradients linear_gradients(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>& g, int64_t rows, int64_t in, int64_t out);

}  // namespace kiln::testing
