// Copy and cast, forward and backward side by side. The values pass through unchanged, so each gradient
// is g itself, brought back to the input's device (the engine checks devices but does not move
// gradients) and dtype. These ops skip autocast: their result dtype is the one the caller asked for.

#include "kiln/autograd/autocast.h"
#include "kiln/autograd/ops/op_recording.h"
#include "kiln/tensor/capture.h"

namespace kiln {

namespace {

// ---------------------------------------------------------------- to, cast, copy_
// g moved back to the input's device and cast to its dtype (a no-op where both already match).
struct ToBackward final : Node {
  std::string_view op_name;
  Device device = Device::cpu();
  std::optional<DType> dtype;  // copy_ leaves the cast to the engine
  std::string_view name() const override { return op_name; }
  TensorList apply(TensorList&& grads) override {
    if (!needs_input_grad(0)) return {Tensor()};  // copy_ from a src without grad
    return {internal::to(grads[0], device, dtype)};
  }

 protected:
  // A gradient already in the source's dtype needs no cast here (Node::accepted_gradient_dtype).
  std::optional<DType> other_gradient_dtype(uint32_t) const override {
    if (!dtype || !is_floating_point(*dtype)) return std::nullopt;
    return dtype;
  }
};

// ---------------------------------------------------------------- contiguous, clone
struct IdentityBackward final : Node {
  std::string_view op_name;
  std::string_view name() const override { return op_name; }
  TensorList apply(TensorList&& grads) override { return {grads[0]}; }
};

// Records out = a copy of t in another device or dtype. An integer result carries no gradient.
Tensor record_to(Tensor out, const Tensor& t, std::string_view name) {
  if (out.is_same(t) || !is_floating_point(out.dtype()) || !needs_grad(t)) return out;
  auto node = make_node<ToBackward>(t);
  node->op_name = name;
  node->device = t.device();
  node->dtype = t.dtype();
  set_history(out, node);
  return out;
}

Tensor record_identity(Tensor out, const Tensor& t, std::string_view name) {
  if (out.is_same(t) || !needs_grad(t)) return out;
  auto node = make_node<IdentityBackward>(t);
  node->op_name = name;
  set_history(out, node);
  return out;
}

}  // namespace

Tensor to(const Tensor& t, Device device, std::optional<DType> dtype, bool non_blocking) {
  capture::Op cap("to");
  return cap.done(record_to(internal::to(t, device, dtype, non_blocking), t, "ToBackward"), [&] {
    return capture::Args{{t}, {}};
  });
}

Tensor cast(const Tensor& t, DType dtype) {
  capture::Op cap("cast");
  return cap.done(record_to(internal::cast(t, dtype), t, "CastBackward"), [&] { return capture::Args{{t}, {}}; });
}

Tensor autocast::detail::with_cast_history(Tensor values, const Tensor& source) {
  KILN_CHECK(
      values.defined() && source.defined() && values.shape() == source.shape() && values.device() == source.device(),
      "autocast: a cast's values must have the shape and device of their source");
  return record_to(std::move(values), source, "ToBackward");
}

Tensor contiguous(const Tensor& t, MemoryFormat format) {
  capture::Op cap("contiguous");
  return cap.done(record_identity(internal::contiguous(t, format), t, "ContiguousBackward"), [&] {
    return capture::Args{{t}, {}};
  });
}

Tensor clone(const Tensor& t, MemoryFormat format) {
  capture::Op cap("clone");
  return cap.done(record_identity(internal::clone(t, format), t, "CloneBackward"), [&] {
    return capture::Args{{t}, {}};
  });
}

// dst's old values are overwritten: its previous history gets no gradient. src gets g (summed over the
// dims it was broadcast along, and cast to its dtype, by the engine), moved to src's device.
Tensor& copy_(Tensor& dst, const Tensor& src, bool non_blocking) {
  const bool differentiable = dst.defined() && is_floating_point(dst.dtype());
  if (!differentiable || !autograd::check_inplace(dst, needs_grad(src), "copy_")) {
    return internal::copy_(dst, src, non_blocking);
  }
  auto node = make_node<ToBackward>(src);
  node->op_name = "CopyBackward";
  node->device = src.device();
  internal::copy_(dst, src, non_blocking);
  set_history(dst, node);
  return dst;
}

}  // namespace kiln
