// kiln/autograd/accumulate_grad.h — the node at a leaf: adds the arriving gradient into leaf.grad(),
// running the leaf's hooks before and its post-accumulate hooks after (internal to kiln's autograd).
#pragma once

#include <memory>

#include "kiln/autograd/node.h"

namespace kiln::autograd {

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const Tensor& leaf);
  std::string_view name() const override { return "AccumulateGrad"; }
  TensorList apply(TensorList&& grads) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

}  // namespace kiln::autograd
