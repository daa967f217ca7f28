// kiln/autograd/node.h — the backward graph: nodes, edges, saved tensors, and the helpers a
// differentiable op uses to record itself. Users who only train models never include this; it is for
// writing new differentiable ops inside kiln (layers, fused kernels). Users write custom functions
// with kiln/autograd/function.h instead.
//
// A differentiable op, forward and backward side by side (the pattern every op in kiln follows):
//
//   struct ExpBackward final : autograd::Node {
//     autograd::SavedTensor result;
//     std::string_view name() const override { return "ExpBackward"; }
//     TensorList apply(TensorList&& grads) override { return {grads[0] * result.unpack(*this)}; }
//     void release_saved() override { result.reset(); }
//   };
//   Tensor exp(const Tensor& x) {
//     Tensor y = internal::exp(x);
//     if (autograd::needs_grad(x)) {
//       auto node = autograd::make_node<ExpBackward>(x);   // edges to x's gradient
//       node->result = autograd::SavedTensor(y, /*is_output=*/true);
//       autograd::set_history(y, node);                    // y.grad_fn() == node
//     }
//     return y;
//   }
//
// Gradients that apply() returns may have the broadcast shape or another floating dtype: the engine
// sums them down to each input's shape and casts them to its dtype (validate_gradient in engine.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/autograd/grad_mode.h"
#include "kiln/tensor/small_alloc.h"
#include "kiln/tensor/tensor.h"

namespace kiln::autograd {

class Node;
using TensorList = std::vector<Tensor>;  // gradients, inputs or outputs, in order
// A hook on a gradient: returns a replacement, or an undefined Tensor to keep the gradient as it is.
using TensorHook = std::function<Tensor(const Tensor&)>;
// A hook that runs after a leaf's .grad has been accumulated; gets the leaf.
using PostAccumulateHook = std::function<void(const Tensor&)>;

// Where a gradient goes: input number `input_nr` of node `fn`. Invalid (fn null) when the forward
// input did not require grad.
struct Edge {
  std::shared_ptr<Node> fn;  // the node the gradient goes to; null: nowhere
  uint32_t input_nr = 0;     // which of fn's inputs it arrives at
  // Whether the edge leads to a node.
  bool valid() const { return fn != nullptr; }
};

// The shape, dtype and device that a gradient arriving at a node must have (those of the forward output).
struct InputMeta {
  Shape shape;    // the gradient's shape
  DType dtype;    // its dtype
  Device device;  // its device
};

// A tensor that backward needs, with the storage version it had when it was saved. unpack() raises a
// clear error if the tensor was modified in place since, or if an earlier backward released it.
// Outputs of the op that saves them are kept without their autograd history (an alias of the same
// memory), so a node never owns the tensor that owns it.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t, bool is_output);  // records t's version; is_output: t is the saver's output
  Tensor unpack(const Node& owner) const;        // the tensor; throws if released or modified since
  void reset();                                  // frees the tensor; unpack() afterwards raises "graph freed"
  // Whether a defined tensor is held.
  bool defined() const { return data_.defined(); }

 private:
  Tensor data_;
  uint64_t version_ = 0;
  bool released_ = false;
};

// A backward function. It receives one gradient per output of its forward op (undefined where none
// reached it) and returns one gradient per forward input, sent along next_edges() (undefined entries
// are dropped).
class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual std::string_view name() const = 0;         // "MulBackward", ...: errors and the profiler
  virtual TensorList apply(TensorList&& grads) = 0;  // the backward: gradients of the inputs
  // Frees what forward saved; the engine calls it after apply() unless backward retains the graph.
  virtual void release_saved() {}

  // Order of creation: the engine runs later nodes first, which frees memory early and makes
  // gradients of the last layers ready first (data-parallel training overlaps their all-reduce).
  uint64_t sequence_nr() const { return sequence_nr_; }
  // One edge per forward input: where its gradient goes.
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  // The edges, for the code that builds the node.
  std::vector<Edge>& mutable_next_edges() { return next_edges_; }
  // Whether backward must produce a gradient for forward input i.
  bool needs_input_grad(size_t i) const { return i < next_edges_.size() && next_edges_[i].valid(); }
  // The number of gradients apply() receives (one per forward output).
  size_t num_inputs() const { return input_meta_.size(); }
  // What gradient i must look like (unchecked index).
  const InputMeta& input_meta(size_t i) const { return input_meta_[i]; }
  uint32_t add_input_meta(const Tensor& t);  // adds t as the next output; returns its number

  // Hooks on the gradient arriving at input `input_nr` (a non-leaf tensor's register_hook).
  uint64_t add_pre_hook(uint32_t input_nr, TensorHook hook);
  bool remove_pre_hook(uint64_t id);  // false when no hook has that id
  // Whether any pre-hook is installed.
  bool has_pre_hooks() const { return !pre_hooks_.empty(); }
  void run_pre_hooks(TensorList& grads);  // replaces each defined gradient by its hooks' results

  // Gradients in another dtype. A node may take the gradient for its input `input_nr` in a dtype other than the
  // input's own (input_meta's) and work on it as it is: a cast's backward, whose only work is to bring the gradient
  // to its source's dtype, takes that dtype (autocast's casts of float32 parameters and activations to bfloat16,
  // say). Returns that dtype, or nullopt for none; never while a hook on that input (register_hook, retain_grad)
  // must see the input's own dtype. The engine passes such a gradient on without a cast.
  std::optional<DType> accepted_gradient_dtype(uint32_t input_nr) const;
  // accepted_gradient_dtype of the node that the gradient of forward input i goes to (nullopt where there is none):
  // a node computing a 16-bit gradient whose next node takes float32 computes it in float32 directly (a product's
  // float32 sums, without a rounding to 16 bits and a cast back).
  std::optional<DType> gradient_dtype_wanted(size_t i) const;

  // The engine's index of this node in the graph task that runs it (engine.cpp); meaningless elsewhere.
  int32_t& engine_slot() { return engine_slot_; }

  // Gradient buffers. Before apply(), the engine hands a node that accepts them, for each forward input whose
  // gradient other nodes have already begun to sum, that sum: offered_buffers()[i] for input i (undefined where
  // there is none, or where the sum is shared and must not change). apply() may add its own gradient for input i
  // into that tensor in place and return the tensor itself, which saves the engine a separate addition (a read of
  // both gradients and a write of their sum); any other tensor it returns is added as usual. The engine takes the
  // buffers back after apply().
  virtual bool accepts_gradient_buffers() const { return false; }
  // The buffers offered for the coming apply() (see above).
  TensorList& offered_buffers() { return offered_buffers_; }

 protected:
  // A node with a given order instead of the next one (UINT64_MAX: leaf accumulators and roots).
  explicit Node(uint64_t sequence_nr) : sequence_nr_(sequence_nr) {}
  // The node's own answer for accepted_gradient_dtype (which checks the hooks first); none by default.
  virtual std::optional<DType> other_gradient_dtype(uint32_t input_nr) const {
    (void)input_nr;
    return std::nullopt;
  }
  // For a node that only moves, reshapes or slices its gradients (a view's backward): the dtype every one of its
  // forward inputs' next nodes accepts, so that the gradient passes through it in that dtype; else nullopt.
  std::optional<DType> dtype_all_next_accept() const;

 private:
  struct PreHook {
    uint64_t id;
    uint32_t input_nr;
    TensorHook fn;
  };
  uint64_t sequence_nr_;
  int32_t engine_slot_ = -1;
  std::vector<Edge> next_edges_;
  std::vector<InputMeta> input_meta_;
  std::vector<PreHook> pre_hooks_;
  TensorList offered_buffers_;
};

// ---- recording helpers for differentiable ops ----

// True when t takes part in autograd: a leaf with requires_grad, or the result of a recorded op.
bool requires_grad(const Tensor& t);

// True when an op on these inputs must record: grad mode is on and a defined input requires grad.
template <typename... Ts>
bool needs_grad(const Ts&... inputs) {
  if (!GradMode::is_enabled()) return false;
  return ((inputs.defined() && inputs.impl().autograd_meta_ptr() != nullptr && requires_grad(inputs)) || ...);
}
bool needs_grad_list(const std::vector<Tensor>& inputs);  // needs_grad for a list of inputs

// The edge a gradient for t travels along: t's grad_fn, or the accumulator of a leaf that requires grad.
Edge gradient_edge(const Tensor& t);

// A node of type N whose next edges lead to the given forward inputs (Tensors or vectors of Tensors).
template <typename N, typename... Inputs>
std::shared_ptr<N> make_node(const Inputs&... inputs) {
  auto node = make_pooled<N>();
  auto& edges = node->mutable_next_edges();
  edges.reserve(sizeof...(Inputs));
  auto add = [&edges](const auto& in) {
    if constexpr (std::is_same_v<std::decay_t<decltype(in)>, Tensor>) {
      edges.push_back(gradient_edge(in));
    } else {
      for (const Tensor& t : in) edges.push_back(gradient_edge(t));
    }
  };
  (add(inputs), ...);
  return node;
}

// Makes `out` the next output of `node` (its grad_fn; output number = inputs so far). For an in-place
// op, `out` is the modified tensor and its previous history becomes one of node's edges.
void set_history(const Tensor& out, const std::shared_ptr<Node>& node);

// Before an in-place op on `self` records: rejects leaves that require grad, and views, with an error
// naming `op`. Returns whether the op must record (grad mode on and self or an other input requires grad).
bool check_inplace(const Tensor& self, bool others_require_grad, std::string_view op);

// Nothing else refers to t or its memory (one handle, one storage owner, not a view): it may be updated in
// place or kept without a copy.
bool exclusively_owned(const Tensor& t);
// Nothing else refers to t or its memory, and t spans all of that memory, but t is a view (of a base since let go):
// a tensor of its own over the same memory can take its place without a copy.
bool sole_view_of_its_storage(const Tensor& t);

// Sums g over broadcast dims down to `shape` (g's shape must broadcast from it).
Tensor sum_to(const Tensor& g, const Shape& shape);

}  // namespace kiln::autograd
