// kiln/autograd/function.h — differentiable functions users write themselves: a forward and a
// backward, with no change to kiln.
//
//   struct ScaledTanh : autograd::Function<ScaledTanh> {
//     static Tensor forward(autograd::Context& ctx, const Tensor& x, double scale) {
//       Tensor y = tanh(x);
//       ctx.save_for_backward({y});
//       ctx.set("scale", scale);
//       return y * scale;
//     }
//     // One gradient per Tensor argument of forward, in order (undefined where none is needed).
//     static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grad_outputs) {
//       Tensor y = ctx.saved()[0];
//       return {grad_outputs[0] * ctx.get<double>("scale") * (1 - y * y)};
//     }
//   };
//   Tensor out = ScaledTanh::apply(x, 2.0);
//
// forward runs without recording (its ops do not enter the graph) and returns a Tensor or a TensorList;
// backward receives one gradient per output (zeros where no gradient reached it).
//
// A Function whose backward can add an input's gradient into memory that already holds other gradients of that input
// (a product with beta = 1, say) declares `static constexpr bool kAddsIntoGradientSums = true;`. Its backward then
// finds in ctx.gradient_sum(i) the sum other nodes have already begun for Tensor argument i, where there is one, and
// may add its own gradient into it in place and return that tensor itself: the engine then adds nothing (a read of
// both gradients and a write of their sum saved). The engine runs such a node after the other producers of its
// inputs' gradients where the graph allows (as it does for kiln's convolutions).
#pragma once

#include <any>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>

#include "kiln/autograd/node.h"

namespace kiln::autograd {

// What a custom autograd::Function keeps from its forward for its backward: saved tensors, values, and which inputs
// need gradients.
class Context {
 public:
  // Tensors backward needs (inputs or outputs of forward); in-place changes to them are detected.
  void save_for_backward(TensorList tensors) { to_save_ = std::move(tensors); }
  TensorList saved() const;  // what forward saved; throws once backward has released it
  // Non-tensor values for backward.
  template <typename T>
  void set(const std::string& key, T value) {
    data_[key] = std::move(value);
  }
  template <typename T>
  T get(const std::string& key) const {  // throws when absent or of another type
    auto it = data_.find(key);
    KILN_CHECK(it != data_.end(), "Context::get: nothing was set under \"", key, "\" in forward");
    const T* v = std::any_cast<T>(&it->second);
    KILN_CHECK(v != nullptr, "Context::get: \"", key, "\" holds another type than the one asked for");
    return *v;
  }
  // Whether backward must return a gradient for Tensor argument i of forward.
  bool needs_input_grad(size_t i) const { return i < needs_input_grad_.size() && needs_input_grad_[i]; }
  // In backward of a Function with kAddsIntoGradientSums: the gradient other nodes have already summed for Tensor
  // argument i (of its shape and dtype, or the wider dtype its node accepts), which backward may add into in place
  // and return as argument i's gradient; undefined where there is none (also outside backward, and for Functions
  // without kAddsIntoGradientSums).
  const Tensor& gradient_sum(size_t i) const {
    static const Tensor none;
    return offered_ != nullptr && i < offered_->size() ? (*offered_)[i] : none;
  }

  // In backward: the dtype the node receiving Tensor argument i's gradient takes it in besides the argument's own
  // (Node::gradient_dtype_wanted: Float32 where the argument is autocast's 16-bit cast of a float32 tensor), so that
  // backward can compute that gradient in it directly; nullopt where there is none (also outside backward).
  std::optional<DType> gradient_dtype_wanted(size_t i) const {
    return node_ != nullptr ? node_->gradient_dtype_wanted(i) : std::nullopt;
  }

  // Used by Function::apply.
  void finish_forward(const Node* node, const TensorList& outputs);
  void release() {  // frees the saved tensors (after backward)
    saved_.clear();
    released_ = true;
  }

 private:
  const Node* node_ = nullptr;
  const TensorList* offered_ = nullptr;  // the node's offered buffers, during backward
  TensorList to_save_;
  std::vector<SavedTensor> saved_;
  bool released_ = false;
  std::unordered_map<std::string, std::any> data_;
  std::vector<bool> needs_input_grad_;
  friend void set_needs_input_grad(Context& ctx, std::vector<bool> v);
  template <typename F>
  friend class FunctionNode;
};

// Sets ctx.needs_input_grad(i) for each Tensor argument i (used by Function::apply).
inline void set_needs_input_grad(Context& ctx, std::vector<bool> v) { ctx.needs_input_grad_ = std::move(v); }

std::string demangled_name(const char* mangled);  // a C++ type name as written (mangled if that fails)

template <typename F>
// The graph node of a custom Function F: its backward calls F::backward with the Context of the forward.
class FunctionNode final : public Node {
 public:
  Context ctx;                              // what F::forward saved
  std::string_view name() const override {  // "<F's name>Backward"
    static const std::string n = demangled_name(typeid(F).name()) + "Backward";
    return n;
  }
  bool accepts_gradient_buffers() const override {
    if constexpr (requires { F::kAddsIntoGradientSums; }) {
      return F::kAddsIntoGradientSums;
    } else {
      return false;
    }
  }
  TensorList apply(TensorList&& grads) override {  // F::backward, undefined grads given as zeros
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) grads[i] = zeros_for(i);
    }
    ctx.offered_ = &offered_buffers();
    struct Clear {  // also when backward throws
      Context& c;
      ~Clear() { c.offered_ = nullptr; }
    } clear{ctx};
    TensorList out = F::backward(ctx, grads);
    KILN_CHECK(out.size() == next_edges().size(), name(), ": backward returned ", out.size(),
               " gradients, but forward ", "took ", next_edges().size(),
               " Tensor arguments; return one per Tensor argument (an undefined ", "Tensor() where there is none)");
    return out;
  }
  void release_saved() override { ctx.release(); }

 private:
  Tensor zeros_for(size_t i) const;
};

Tensor zeros_from_meta(const InputMeta& meta);  // zeros of meta's shape, dtype and device
template <typename F>
Tensor FunctionNode<F>::zeros_for(size_t i) const {
  return zeros_from_meta(input_meta(i));
}

template <typename Derived>
// The base of a custom differentiable function (see above): Derived provides static forward and backward.
struct Function {
  template <typename... Args>
  // Runs Derived::forward(ctx, args...) without recording and, when grad mode is on and a Tensor argument requires
  // grad, attaches its floating-point outputs to a FunctionNode<Derived>; returns forward's Tensor or TensorList.
  static auto apply(Args&&... args) {
    TensorList inputs;
    auto collect = [&inputs](const auto& a) {
      if constexpr (std::is_same_v<std::decay_t<decltype(a)>, Tensor>) inputs.push_back(a);
    };
    (collect(args), ...);
    std::shared_ptr<FunctionNode<Derived>> node;
    Context local;
    if (needs_grad_list(inputs)) {
      node = std::make_shared<FunctionNode<Derived>>();
      std::vector<bool> needs;
      for (const Tensor& t : inputs) {
        node->mutable_next_edges().push_back(gradient_edge(t));
        needs.push_back(node->mutable_next_edges().back().valid());
      }
      set_needs_input_grad(node->ctx, std::move(needs));
    }
    Context& ctx = node ? node->ctx : local;
    auto out = [&] {
      AutoGradMode no_grad(false);
      return Derived::forward(ctx, std::forward<Args>(args)...);
    }();
    using Out = decltype(out);
    static_assert(std::is_same_v<Out, Tensor> || std::is_same_v<Out, TensorList>,
                  "Function::forward must return a Tensor or a TensorList");
    if (node) {
      if constexpr (std::is_same_v<Out, Tensor>) {
        out = attach(out, inputs, node);
        ctx.finish_forward(node.get(), {out});
      } else {
        for (Tensor& o : out) o = attach(o, inputs, node);
        ctx.finish_forward(node.get(), out);
      }
    }
    return out;
  }

 private:
  // An output that is one of the inputs is given as a new tensor on the same memory, so the input
  // keeps its own history.
  static Tensor attach(const Tensor& o, const TensorList& inputs, const std::shared_ptr<Node>& node) {
    if (!o.defined()) return o;
    Tensor out = o;
    for (const Tensor& in : inputs) {
      if (in.defined() && in.is_same(o)) out = o.detach();
    }
    if (is_floating_point(out.dtype())) set_history(out, node);
    return out;
  }
};

}  // namespace kiln::autograd
