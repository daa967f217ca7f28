// kiln/autograd/accumulate_grad.h — the node at a leaf: adds the arriving gradient into leaf.grad(),
// running the leaf's hooks before and its post-accumulate hooks after (internal to kiln's autograd).
#pragma once

#include <memory>

#include "kiln/autograd/node.h"

namespace kiln::autograd {

// The node at a leaf that requires grad: adds the arriving gradient into leaf.grad() (see above).
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const Tensor& leaf);  // for leaf; its gradient has leaf's metadata
  // "AccumulateGrad".
  std::string_view name() const override { return "AccumulateGrad"; }
  TensorList apply(TensorList&& grads) override;  // hooks, then .grad = g or .grad += g; returns nothing
  // The leaf's impl.
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

}  // namespace kiln::autograd
