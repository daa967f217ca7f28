// [wip/amp STUB — NOT the real implementation. The optim helper owns kiln/optim/optimizer.cpp; at the merge
//  take theirs and drop this file's content.] Just enough of the Optimizer base (its out-of-line virtuals,
//  hence its vtable) for amp's tests, which subclass Optimizer, to link in this branch.
#include "kiln/optim/optimizer.h"

#include "kiln/tensor/error.h"

namespace kiln::optim {

void Optimizer::step_with(const Tensor& grad_scale, const Tensor& found_inf) {
  KILN_CHECK(!grad_scale.defined(), name(), "::step_with: grad_scale is not supported by this stub");
  if (!found_inf.defined() || found_inf.item<float>() == 0.0f) step();  // reads found_inf: a host sync
}

OptimizerState Optimizer::state_dict() const { return {}; }

void Optimizer::load_state_dict(const OptimizerState& /*state*/) {
  KILN_CHECK(false, name(), "::load_state_dict: not implemented in the wip/amp stub");
}

}  // namespace kiln::optim
