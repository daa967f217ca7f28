// kiln/autograd/sparse_grad.h — row-sparse gradients: the gradient of a (V, D...) table that a step touches in only
// k of its V rows, held as those rows (indices) and their gradients (values), so that its cost is O(k), not O(V).
//
//   auto emb = std::make_shared<nn::Embedding>(1'000'000, 64, nn::EmbeddingOptions{.sparse = true});
//   loss_of(emb->forward(ids)).backward();
//   const SparseRowGrad* g = autograd::sparse_grad(emb->weight);   // emb->weight.grad() stays undefined
//   SparseRowGrad c = g->coalesce();                                // sorted rows, duplicates summed
//   optim::SparseAdam opt(emb->parameters(), {.lr = 1e-3});         // updates only those rows
//
// nn::Embedding with {.sparse = true} (nn::embedding(..., sparse = true)) makes them: its backward adds the looked-up
// rows' gradients to the weight's sparse gradient instead of a dense (V, D) one. Backward calls accumulate by
// appending rows (duplicates stay until coalesce()). The weight must be a leaf (a parameter). Hooks registered on
// the weight (register_hook, post-accumulate hooks) and DataParallel's all-reduce do not see sparse gradients, and
// autograd::grad() refuses to differentiate with respect to such a weight.
//
// Who reads them: optim::SGD (without weight decay), optim::SparseAdam and optim::RowWiseAdagrad update only the
// rows; optim::clip_grad_norm_ counts them; amp::GradScaler unscales them and checks them for inf/NaN;
// Module::zero_grad and Optimizer::zero_grad clear them. Other optimizers refuse a parameter with a sparse gradient.
//
// Device-held gradients: the gradient of a parameter in page-locked host memory (is_pinned()) may stay on a GPU
// (nn::HybridEmbedding's cold tier with ColdReads::Mapped leaves it there). The optimizers' fused CUDA updates then
// write the touched rows, and the parameter's state (made in page-locked memory too), through the memory's device
// mapping, on that GPU's stream, with no host synchronisation; so the host reads them only after a synchronisation
// (Optimizer::state_dict and HybridEmbedding's host reads wait for the device themselves). An update that has no
// fused form (a float64 parameter) first copies the gradient to the host.
#pragma once

#include <cstdint>

#include "kiln/tensor/tensor.h"

namespace kiln {

// A row-sparse gradient of a parameter of shape dense_shape = (V, D...): row indices[i] gets values[i].
struct SparseRowGrad {
  Tensor indices;          // (K) Int64 in [0, V), on values' device; may repeat unless coalesced
  Tensor values;           // (K, D...) in the parameter's dtype, on its device (or a GPU: see above)
  Shape dense_shape;       // (V, D...), the parameter's shape
  bool coalesced = false;  // indices sorted ascending and unique

  // The number of rows held (with repeats, unless coalesced).
  int64_t nnz() const { return indices.defined() ? indices.numel() : 0; }
  // Sorted, unique rows, the values of repeated rows summed (in the values' dtype, in index order).
  SparseRowGrad coalesce() const;
  // The dense gradient (V, D...): zeros, plus each row's values.
  Tensor to_dense() const;
};

namespace autograd {

// The sparse gradient accumulated into `param` by backward, or null when it has none.
const SparseRowGrad* sparse_grad(const Tensor& param);
// Whether `param` holds a sparse gradient.
inline bool has_sparse_grad(const Tensor& param) { return sparse_grad(param) != nullptr; }
// Adds `g`'s rows to `param`'s sparse gradient (appending them; the first call stores g). kiln::Error when g's
// dense_shape or dtype differ from param's, its device differs from param's (unless param is page-locked host memory
// and g is on a GPU: a device-held gradient, above) or from that of the rows already held, or param also holds a
// dense gradient.
void accumulate_sparse_grad(const Tensor& param, SparseRowGrad g);
// Replaces `param`'s sparse gradient (what optimizers and the GradScaler write back).
void set_sparse_grad(const Tensor& param, SparseRowGrad g);
// Removes it (zero_grad).
void clear_sparse_grad(const Tensor& param);

}  // namespace autograd
}  // namespace kiln
