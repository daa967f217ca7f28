// Tensor's autograd methods: requires_grad, grad, grad_fn, detach, backward, hooks.
#include "kiln/autograd/autograd_meta.h"
#include "kiln/autograd/engine.h"
#include "kiln/tensor/small_alloc.h"

namespace kiln {

using autograd::AutogradMeta;
using autograd::get_meta;

bool Tensor::requires_grad() const { return autograd::requires_grad(*this); }

Tensor& Tensor::requires_grad_(bool requires_grad) {
  AutogradMeta* m = get_meta(*this);
  KILN_CHECK(m == nullptr || !m->grad_fn || requires_grad, "requires_grad_(false): this tensor is the result of ",
             m && m->grad_fn ? m->grad_fn->name() : "", "; only leaves can stop requiring grad. Use detach() to get ",
             "a tensor without history");
  if (m != nullptr && m->grad_fn) return *this;  // a non-leaf requires grad already
  KILN_CHECK(!requires_grad || kiln::is_floating_point(dtype()),
             "requires_grad_: only floating-point tensors can require ", "gradients, this one is ", dtype(),
             "; convert it first, e.g. x.to(DType::Float32)");
  if (requires_grad || m != nullptr) autograd::materialize_meta(*this).requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  const AutogradMeta* m = get_meta(*this);
  return m == nullptr || !m->grad_fn;
}

const Tensor& Tensor::grad() const {
  static const Tensor kUndefined;
  const AutogradMeta* m = get_meta(*this);
  return m == nullptr ? kUndefined : m->grad;
}

Tensor& Tensor::mutable_grad() { return autograd::materialize_meta(*this).grad; }

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  const AutogradMeta* m = get_meta(*this);
  return m == nullptr ? nullptr : m->grad_fn;
}

Tensor Tensor::detach() const {
  const TensorImpl& i = impl();
  auto out = make_pooled<TensorImpl>(i.storage(), i.dtype(), i.sizes(), i.strides(), i.offset());
  return Tensor(std::move(out));
}

Tensor& Tensor::detach_() {
  KILN_CHECK(!impl().is_view() || !requires_grad(), "detach_: this tensor is a view; use detach() instead, which ",
             "returns a new tensor");
  impl().autograd_meta().reset();
  return *this;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, gradient.defined() ? autograd::TensorList{gradient} : autograd::TensorList{},
                     retain_graph);
}

void Tensor::retain_grad() const {
  AutogradMeta* m = get_meta(*this);
  KILN_CHECK(m != nullptr && (m->requires_grad || m->grad_fn), "retain_grad: this tensor does not require grad, so ",
             "no gradient will reach it");
  if (!m->grad_fn || m->retains_grad) return;  // leaves keep their gradient anyway
  m->retains_grad = true;
  autograd::install_retain_grad_hook(*this, *m);
}

bool Tensor::retains_grad() const {
  const AutogradMeta* m = get_meta(*this);
  return m != nullptr && m->retains_grad;
}

uint64_t Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  AutogradMeta* m = get_meta(*this);
  KILN_CHECK(m != nullptr && (m->requires_grad || m->grad_fn), "register_hook: this tensor does not require grad, ",
             "so no gradient will reach the hook; call requires_grad_() first");
  if (m->grad_fn) return m->grad_fn->add_pre_hook(m->output_nr, std::move(hook));
  const uint64_t id = autograd::next_hook_id();
  m->leaf_hooks.emplace_back(id, std::move(hook));
  return id;
}

uint64_t Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  AutogradMeta* m = get_meta(*this);
  KILN_CHECK(m != nullptr && m->requires_grad && !m->grad_fn, "register_post_accumulate_grad_hook: only leaves that ",
             "require grad accumulate a gradient; this tensor ",
             m && m->grad_fn ? "is the result of an op" : "does not require grad");
  const uint64_t id = autograd::next_hook_id();
  m->post_accumulate_hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::remove_hook(uint64_t handle) const {
  AutogradMeta* m = get_meta(*this);
  if (m == nullptr) return;
  if (m->grad_fn && m->grad_fn->remove_pre_hook(handle)) return;
  std::erase_if(m->leaf_hooks, [handle](const auto& h) { return h.first == handle; });
  std::erase_if(m->post_accumulate_hooks, [handle](const auto& h) { return h.first == handle; });
}

}  // namespace kiln
