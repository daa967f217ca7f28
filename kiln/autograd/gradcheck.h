// kiln/autograd/gradcheck.h — checks analytic gradients against central finite differences.
//
//   Tensor x = randn({3, 4}, {.dtype = DType::Float64}).requires_grad_();
//   autograd::gradcheck([](const TensorList& in) { return TensorList{tanh(in[0]).sum({1})}; }, {x});
//
// Inputs are CPU float64 tensors; those that require grad are checked. For every element of every
// floating output, backward gives one row of the Jacobian; perturbing every input element by ±eps and
// re-running fn gives the same Jacobian numerically. A mismatch throws kiln::Error naming the input,
// the output, the element and both values. GPU gradients are checked against the CPU backend instead.
#pragma once

#include <functional>

#include "kiln/autograd/node.h"

namespace kiln::autograd {

// The step and tolerances of gradcheck.
struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-5;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-3;  // relative tolerance (see atol)
};

using DifferentiableFn = std::function<TensorList(const TensorList&)>;  // the function gradcheck differentiates

// Returns true, or throws kiln::Error describing the first mismatch.
bool gradcheck(const DifferentiableFn& fn, const TensorList& inputs, const GradcheckOptions& options = {});

}  // namespace kiln::autograd
