// kiln/autograd/checkpoint.h — gradient checkpointing: trade compute for memory.
//
//   // Keeps only x during forward; the activations inside block are recomputed during backward.
//   Tensor y = autograd::checkpoint([&](const Tensor& x) { return block(x); }, x);
//   TensorList ys = autograd::checkpoint([&](const TensorList& in) { return TensorList{f(in[0], in[1])}; }, {a, b});
//
// The recomputation replays the random numbers of the first run (the default generators of the CPU and
// of the inputs' GPUs are saved and restored) under the autocast state of the first run (backward itself runs
// with autocast off), so dropout masks and autocast dtypes match and gradients equal those without
// checkpointing bit for bit. Parameters that fn uses (captured, not passed) get their gradients too:
// they are accumulated into their grad() while backward recomputes fn. For that reason
// autograd::grad() through a checkpoint returns the gradients of the checkpoint's inputs only, and
// parameters inside receive theirs in grad() as with backward(). Checkpoints nest.
// Tensors that fn uses must be inputs or leaves (parameters): a captured tensor that is itself the
// result of recorded ops outside fn would have its history run twice; pass it as an input instead.
// BatchNorm layers inside fn update their running statistics once, in forward (see in_recomputation).
#pragma once

#include <functional>

#include "kiln/autograd/node.h"

namespace kiln::autograd {

// fn(inputs), keeping only the inputs for backward, which runs fn again (see above); without grad mode, just fn.
TensorList checkpoint(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs);
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);  // one input, one output

// True while backward recomputes a checkpointed function on this thread. Code with side effects beyond its
// outputs does them in forward only: BatchNorm, for one, leaves its running statistics as forward set them.
bool in_recomputation();

}  // namespace kiln::autograd
