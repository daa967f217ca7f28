// kiln/autograd/engine.h — running backward.
//
//   Tensor loss = ((model_out - target).square()).mean();
//   loss.backward();                                   // accumulates into the leaves' grad()
//   auto [gx] = autograd::grad({y}, {x});              // or: gradients without touching grad()
//
// Nodes run in dependency order (each once all gradients for it have arrived), latest-created first
// among those ready. Without retain_graph, each node's saved tensors are freed as soon as it has run.
// Backward runs with grad mode and autocast off, on the calling thread and its current streams.
// Limits: backward formulas do not record, so there are no higher-order gradients (no create_graph);
// two threads may run backward at once only on graphs that share no node (e.g. no common leaf).
#pragma once

#include <functional>
#include <vector>

#include "kiln/autograd/node.h"

namespace kiln::autograd {

// Backward from `outputs`; grad_outputs[i] is the gradient of outputs[i] (may be omitted, or left
// undefined, for one-element outputs: it is then 1). Accumulates into the grad() of every leaf reached.
void backward(const TensorList& outputs, const TensorList& grad_outputs = {}, bool retain_graph = false);

// Gradients of `outputs` with respect to `inputs`, returned in the order of inputs; no grad() changes.
// Only the part of the graph that leads to inputs runs. An input that outputs do not depend on is an
// error unless allow_unused (its gradient is then undefined).
TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs = {},
                bool retain_graph = false, bool allow_unused = false);

// Queues fn to run when the outermost backward()/grad() now running on this thread has finished its
// graph (nested backwards, such as a checkpoint's recomputation, do not end it). Callbacks run in the
// order queued, after every node and hook; one may queue further callbacks. An exception from a callback
// leaves backward (the remaining callbacks are dropped). What data-parallel training uses to finish the
// gradient all-reduce. Calling it outside a backward is an error.
void queue_callback(std::function<void()> fn);
// Whether a backward is running on this thread.
bool in_backward();

}  // namespace kiln::autograd
