// kiln/autograd/column_sums.h — column sums of a gradient, offered by the backward that made it to the backward that
// takes it next (internal to kiln's nodes).
//
//   // in a layer norm's backward, whose kernel also summed its x gradient's columns:
//   autograd::offer_column_sums(dx, sums);                 // sums (C) float32 of dx (..., C), as stored
//   // in a Linear's backward, for its bias's gradient:
//   Tensor db = autograd::take_column_sums(g);             // the offered sums when g is dx (or a view of all of it)
//   if (!db.defined()) db = internal::sum(g2, {0}, false, DType::Float32);
//
// A Linear's bias gradient is the column sums of its output gradient. Where the op after the Linear computes that
// gradient in a kernel of its own (the residual add and layer norm that follow a transformer's sublayer), the kernel
// can sum its columns as it writes them, so that the Linear's backward needs no pass over it. The offer is matched
// to the gradient the consumer receives by memory, both contiguous: the same storage (held weakly: an offer keeps nothing alive, and
// a storage freed and reallocated at the same address is another storage), the same first element, the same number
// of elements and columns, and a version that has not changed since (an in-place addition of another gradient into
// it, by the engine or a node, bumps it). An offer is taken once. Offers live on the thread that ran the backward
// (the engine runs a backward pass on its calling thread); at most a few are kept, the oldest dropped first.
#pragma once

#include "kiln/tensor/tensor.h"

namespace kiln::autograd {

// Offers `sums`, the float32 column sums (C) over every row of `grad` (..., C) as stored, to the next
// take_column_sums() of grad on this thread. Nothing for an undefined, empty or non-contiguous grad, or sums of
// another shape, dtype or device.
void offer_column_sums(const Tensor& grad, Tensor sums);

// The sums offered for g: g must be the offered gradient or a contiguous view of all of its elements with the same
// last dim (a reshape of it), unchanged since. Undefined where there is no such offer. The offer is gone afterwards.
Tensor take_column_sums(const Tensor& g);

}  // namespace kiln::autograd
