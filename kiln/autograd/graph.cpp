// The graph's building blocks: nodes, saved tensors, gradient edges, the leaf accumulator, and the
// recording helpers every differentiable op uses (node.h).
#include <atomic>

#include "kiln/autograd/accumulate_grad.h"
#include "kiln/autograd/autograd_meta.h"
#include "kiln/tensor/internal_ops.h"
#include "kiln/tensor/small_alloc.h"

namespace kiln::autograd {
namespace {
std::atomic<uint64_t> g_sequence_nr{0};
std::atomic<uint64_t> g_hook_id{1};
}  // namespace

uint64_t next_hook_id() { return g_hook_id.fetch_add(1, std::memory_order_relaxed); }

// ---------------------------------------------------------------- Node
Node::Node() : sequence_nr_(g_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

uint32_t Node::add_input_meta(const Tensor& t) {
  input_meta_.push_back({t.shape(), t.dtype(), t.device()});
  return static_cast<uint32_t>(input_meta_.size() - 1);
}

uint64_t Node::add_pre_hook(uint32_t input_nr, TensorHook hook) {
  const uint64_t id = next_hook_id();
  pre_hooks_.push_back({id, input_nr, std::move(hook)});
  return id;
}

bool Node::remove_pre_hook(uint64_t id) {
  for (auto it = pre_hooks_.begin(); it != pre_hooks_.end(); ++it) {
    if (it->id == id) {
      pre_hooks_.erase(it);
      return true;
    }
  }
  return false;
}

std::optional<DType> Node::accepted_gradient_dtype(uint32_t input_nr) const {
  for (const PreHook& h : pre_hooks_) {
    if (h.input_nr == input_nr) return std::nullopt;
  }
  return other_gradient_dtype(input_nr);
}

std::optional<DType> Node::gradient_dtype_wanted(size_t i) const {
  if (!needs_input_grad(i)) return std::nullopt;
  const Edge& e = next_edges_[i];
  return e.fn->accepted_gradient_dtype(e.input_nr);
}

std::optional<DType> Node::dtype_all_next_accept() const {
  // Views of views are short chains; a deeper one stops asking (its gradient is then cast as usual).
  static thread_local int depth = 0;
  if (depth >= 8) return std::nullopt;
  ++depth;
  std::optional<DType> common;
  bool agree = true;
  for (size_t i = 0; i < next_edges_.size() && agree; ++i) {
    if (!next_edges_[i].valid()) continue;
    const std::optional<DType> d = gradient_dtype_wanted(i);
    agree = d.has_value() && (!common || *common == *d);
    common = d;
  }
  --depth;
  return agree ? common : std::nullopt;
}

void Node::run_pre_hooks(TensorList& grads) {
  for (auto& h : pre_hooks_) {
    Tensor& g = grads[h.input_nr];
    if (!g.defined()) continue;
    Tensor replaced = h.fn(g);
    if (replaced.defined()) g = std::move(replaced);
  }
}

// ---------------------------------------------------------------- SavedTensor
SavedTensor::SavedTensor(const Tensor& t, bool is_output) {
  if (!t.defined()) return;
  version_ = t.impl().storage()->version();
  if (is_output) {
    // An alias without autograd state: the output's history points (or will point, once set_history runs) at the
    // node that saves it, so keeping the output itself would make a cycle that no one frees when the graph is
    // dropped without a backward that releases it.
    data_ = t.detach();
  } else {
    data_ = t;
  }
}

Tensor SavedTensor::unpack(const Node& owner) const {
  KILN_CHECK(!released_, "backward reached ", owner.name(), " a second time, but the first backward freed the ",
             "tensors it saved; pass retain_graph=true to the first backward() (or autograd::grad) to run backward ",
             "through the same graph more than once");
  if (data_.defined()) {
    const uint64_t now = data_.impl().storage()->version();
    KILN_CHECK(now == version_, "a tensor that ", owner.name(), " saved for backward (shape ", data_.shape(), ", ",
               data_.dtype(), ") was modified in place after the forward op used it: its version is ", now, ", it was ",
               version_, " when saved. Use the out-of-place form of the later op (x = x + y instead of ",
               "x += y or x.add_(y)), or clone() the tensor before modifying it");
  }
  return data_;
}

void SavedTensor::reset() {
  data_ = Tensor();
  released_ = true;
}

// ---------------------------------------------------------------- recording helpers
AutogradMeta& materialize_meta(const Tensor& t) {
  auto& slot = t.impl().autograd_meta();
  if (!slot) slot = make_pooled<AutogradMeta>();
  return *static_cast<AutogradMeta*>(slot.get());
}

bool exclusively_owned(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.impl().storage().use_count() == 1 && !t.impl().is_view();
}

bool sole_view_of_its_storage(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.impl().storage().use_count() == 1 && t.offset() == 0 &&
         t.nbytes() == t.impl().storage()->nbytes();
}

bool requires_grad(const Tensor& t) {
  if (!t.defined()) return false;
  const AutogradMeta* m = get_meta(t);
  return m != nullptr && (m->requires_grad || m->grad_fn != nullptr);
}

bool needs_grad_list(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (requires_grad(t)) return true;
  }
  return false;
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  AutogradMeta& m = materialize_meta(leaf);
  if (auto existing = m.grad_accumulator.lock()) return existing;
  auto acc = std::make_shared<AccumulateGrad>(leaf);
  m.grad_accumulator = acc;
  return acc;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined()) return {};
  AutogradMeta* m = get_meta(t);
  if (m == nullptr) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (m->requires_grad) return {grad_accumulator(t), 0};
  return {};
}

void install_retain_grad_hook(const Tensor& t, AutogradMeta& m) {
  std::weak_ptr<TensorImpl> weak = t.impl_ptr();
  m.retain_hook_id = m.grad_fn->add_pre_hook(m.output_nr, [weak](const Tensor& g) -> Tensor {
    if (auto impl = weak.lock()) {
      Tensor self(impl);
      AutogradMeta* meta = get_meta(self);
      if (meta != nullptr && meta->retains_grad) {
        NoGradGuard no_grad;
        if (meta->grad.defined()) meta->grad = internal::add(meta->grad, g);
        else meta->grad = internal::clone(g);
      }
    }
    return {};
  });
}

void set_history(const Tensor& out, const std::shared_ptr<Node>& node) {
  AutogradMeta& m = materialize_meta(out);
  // An in-place op gives the tensor new history: its retained gradient now comes from the new node.
  if (m.grad_fn && m.retains_grad) m.grad_fn->remove_pre_hook(m.retain_hook_id);
  m.grad_fn = node;
  m.output_nr = node->add_input_meta(out);
  if (m.retains_grad) install_retain_grad_hook(out, m);
}

bool check_inplace(const Tensor& self, bool others_require_grad, std::string_view op) {
  if (!GradMode::is_enabled()) return false;
  const AutogradMeta* m = get_meta(self);
  const bool self_requires = m != nullptr && (m->requires_grad || m->grad_fn);
  if (!self_requires && !others_require_grad) return false;
  KILN_CHECK(!(m != nullptr && m->requires_grad && !m->grad_fn), op, ": this tensor (shape ", self.shape(),
             ") is a leaf that requires grad, and an in-place op on it would lose its gradient; modify it under ",
             "kiln::NoGradGuard (as optimizers do), or use the out-of-place form");
  KILN_CHECK(!self.impl().is_view(), op, ": writes in place into a view of another tensor (shape ", self.shape(),
             ") while recording gradients; kiln's autograd does not follow in-place writes through views to their ",
             "base. Use the out-of-place form (or cat/stack/where to assemble the result), clone() the view first, ",
             "or write under kiln::NoGradGuard if no gradient should flow");
  return true;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  KILN_CHECK(lead >= 0, "sum_to: a gradient of shape ", g.shape(), " cannot be summed to shape ", shape);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < lead; ++d) dims.push_back(d);
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t gs = g.size(lead + static_cast<int64_t>(i));
    if (shape[i] == 1 && gs != 1) dims.push_back(lead + static_cast<int64_t>(i));
    else KILN_CHECK(shape[i] == gs, "sum_to: a gradient of shape ", g.shape(), " cannot be summed to shape ", shape);
  }
  Tensor r = dims.empty() ? g : internal::sum(g, dims, /*keepdim=*/true);
  return internal::reshape(r, shape);
}

// ---------------------------------------------------------------- AccumulateGrad
AccumulateGrad::AccumulateGrad(const Tensor& leaf) : Node(UINT64_MAX), leaf_(leaf.impl_ptr()) { add_input_meta(leaf); }

TensorList AccumulateGrad::apply(TensorList&& grads) {
  Tensor g = std::move(grads[0]);
  if (!g.defined()) return {};
  Tensor leaf(leaf_);
  AutogradMeta& m = materialize_meta(leaf);
  for (auto& [id, hook] : m.leaf_hooks) {
    Tensor replaced = hook(g);
    if (replaced.defined()) g = std::move(replaced);
  }
  const MemoryFormat layout = leaf.suggest_memory_format();
  if (!m.grad.defined()) {
    // Keep the incoming gradient when nothing else holds it and it is dense in the leaf's layout;
    // otherwise copy, so that in-place updates of .grad (zero_, clipping) cannot reach another tensor.
    const bool dense = g.is_contiguous(layout == MemoryFormat::ChannelsLast ? layout : MemoryFormat::Contiguous);
    if (dense && exclusively_owned(g)) {
      m.grad = std::move(g);
    } else if (dense && sole_view_of_its_storage(g)) {
      // A view whose base is gone (a bias gradient reshaped from the (1, N) sums a kernel wrote, say): the same
      // memory, as a tensor of its own.
      m.grad = Tensor(std::make_shared<TensorImpl>(g.impl().storage(), g.dtype(), g.shape(), g.strides(), g.offset()));
    } else {
      m.grad = internal::clone(g, layout);
    }
  } else {
    internal::add_(m.grad, g);
  }
  for (auto& [id, hook] : m.post_accumulate_hooks) hook(leaf);
  return {};
}

}  // namespace kiln::autograd
