// kiln/autograd/autograd_meta.h — the autograd state a tensor carries (internal to kiln's autograd).
//
// Attached lazily: a tensor that never takes part in autograd has none, so the tensor core pays one
// null pointer for it.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "kiln/autograd/node.h"
#include "kiln/autograd/sparse_grad.h"

namespace kiln::autograd {

// A tensor's autograd state (see above).
struct AutogradMeta final : AutogradMetaBase {
  bool requires_grad = false;                  // set by the user on leaves
  bool retains_grad = false;                   // a non-leaf whose .grad is kept (retain_grad())
  uint32_t output_nr = 0;                      // which output of grad_fn this tensor is
  std::shared_ptr<Node> grad_fn;               // null for leaves
  std::weak_ptr<Node> grad_accumulator;        // leaves: the node that adds into .grad, while a graph holds it
  uint64_t retain_hook_id = 0;                 // the grad_fn pre-hook that keeps .grad of a non-leaf
  Tensor grad;                                 // the accumulated gradient: leaves, and non-leaves that retain it
  std::shared_ptr<SparseRowGrad> sparse_grad;  // leaves: a row-sparse gradient instead (sparse_grad.h), or null
  std::vector<std::pair<uint64_t, TensorHook>> leaf_hooks;                     // leaves: run before accumulation
  std::vector<std::pair<uint64_t, PostAccumulateHook>> post_accumulate_hooks;  // leaves: after it
};

// t's autograd state, or null when it has none; t must be defined.
inline AutogradMeta* get_meta(const Tensor& t) { return static_cast<AutogradMeta*>(t.impl().autograd_meta_ptr()); }
AutogradMeta& materialize_meta(const Tensor& t);  // t's autograd state, created if absent

// The node that accumulates into a leaf's .grad (made on first use, shared while a graph holds it).
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf);

uint64_t next_hook_id();  // a fresh hook id, unique in the process

// Keeps the gradient of non-leaf t in its .grad (retain_grad()), through a pre-hook on its grad_fn.
void install_retain_grad_hook(const Tensor& t, AutogradMeta& m);

}  // namespace kiln::autograd
