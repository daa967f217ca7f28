// In-place elementwise ops (add_, mul_, clamp_, fill_, ...). They reuse the backward nodes of their
// out-of-place forms (elementwise_nodes.h), recorded in three steps:
//   1. check_inplace: leaves that require grad and views may not be written while recording;
//   2. the node takes its edges BEFORE the write, so that `a`'s previous history becomes its input;
//   3. after the write, `a` gets the node as its new grad_fn (set_history).
// What backward needs of `a`'s old values is cloned before the write (mul_, div_, clamp_); a result that
// the formula uses is saved after it, as the op's output. The unary ops' in-place forms (relu_, exp_, ...) live
// with their out-of-place forms in unary.cpp.
#include "kiln/autograd/ops/elementwise_nodes.h"
#include "kiln/autograd/ops/op_recording.h"

namespace kiln {

using namespace elementwise;

namespace {

// A tensor that backward reads after `a` is overwritten: b itself, or a copy when b shares a's memory
// (a.mul_(a)), whose version the write would change.
SavedTensor save_other(const Tensor& b, const Tensor& a) {
  return SavedTensor(b.is_alias_of(a) ? internal::clone(b) : b, false);
}

// ---------------------------------------------------------------- the binary table's in-place forms
// a = op(a, b) (add_ and sub_: a + alpha * b) for the rows with in-place forms (binary_ops.h), with the row's
// BinaryBackward: a's old values are copied before the write when a needed gradient reads them (mul_: b's),
// b is saved (or copied, when it shares a's memory) when one reads it, and the result after the write.
template <typename Write>
Tensor& binary_inplace(Tensor& a, const Tensor& b, const char* op, BinaryOp binary_op, Scalar alpha, Write write) {
  const bool record = check_inplace(a, needs_grad(b), op);
  std::shared_ptr<BinaryBackward> node;
  unsigned reads = 0;
  if (record) {
    const BinaryRow& row = binary_row(binary_op);
    node = make_node<BinaryBackward>(a, b);
    node->op_name = row.node_name;
    node->grad_a = row.grad_a;
    node->grad_b = row.grad_b;
    node->both = row.both;
    node->alpha = alpha;
    reads = binary_reads(row, *node);
    if (reads & static_cast<unsigned>(Reads::A)) node->a = SavedTensor(internal::clone(a), false);
    if (reads & static_cast<unsigned>(Reads::B)) node->b = save_other(b, a);
  }
  write();
  if (record) {
    set_history(a, node);
    if (reads & static_cast<unsigned>(Reads::Y)) node->y = SavedTensor(a, /*is_output=*/true);
  }
  return a;
}

}  // namespace

#define KILN_BINARY_INPLACE_Plain(Enum, name)
#define KILN_BINARY_INPLACE_Scalar(Enum, name)                                                   \
  Tensor& name##_(Tensor& a, const Tensor& b) {                                                  \
    return binary_inplace(a, b, #name "_", BinaryOp::Enum, 1, [&] { internal::name##_(a, b); }); \
  }
#define KILN_BINARY_INPLACE_Alpha(Enum, name)                                                               \
  Tensor& name##_(Tensor& a, const Tensor& b, Scalar alpha) {                                               \
    return binary_inplace(a, b, #name "_", BinaryOp::Enum, alpha, [&] { internal::name##_(a, b, alpha); }); \
  }
#define KILN_X(Enum, name, result, autocast, forms, ...) KILN_BINARY_INPLACE_##forms(Enum, name)
KILN_BINARY_OPS(KILN_X)
#undef KILN_X

namespace {

// ---------------------------------------------------------------- with a number (by hand: binary_ops.h says why)
Tensor& add_scalar_impl(Tensor& a, Scalar b, bool subtract) {
  const bool record = check_inplace(a, false, subtract ? "sub_" : "add_");
  auto node = record ? make_node<PassBackward>(a) : nullptr;
  if (subtract) internal::sub_(a, b);
  else internal::add_(a, b);
  if (record) set_history(a, node);
  return a;
}

// ---------------------------------------------------------------- mul_, div_ by a scalar
Tensor& mul_scalar_impl(Tensor& a, Scalar s, bool divide) {
  const bool record = check_inplace(a, false, divide ? "div_" : "mul_");
  std::shared_ptr<MulScalarBackward> node;
  if (record) {
    node = make_node<MulScalarBackward>(a);
    node->factor = s;
    node->divide = divide;
  }
  if (divide) internal::div_(a, s);
  else internal::mul_(a, s);
  if (record) set_history(a, node);
  return a;
}

// ---------------------------------------------------------------- fill_, uniform_, normal_
// The new values do not depend on the old ones: the node has no edges, so no gradient flows to what `a`
// held before, and `a` (a non-leaf) still takes part in autograd from here on.
struct OverwriteBackward final : Node {
  std::string_view op_name;
  std::string_view name() const override { return op_name; }
  TensorList apply(TensorList&&) override { return {}; }
};

template <typename Write>
Tensor& overwrite(Tensor& a, const char* op, std::string_view name, Write write) {
  const bool record = check_inplace(a, false, op);
  write();
  if (record) {
    auto node = std::make_shared<OverwriteBackward>();
    node->op_name = name;
    set_history(a, node);
  }
  return a;
}

}  // namespace

Tensor& add_(Tensor& a, Scalar b) { return add_scalar_impl(a, b, false); }
Tensor& sub_(Tensor& a, Scalar b) { return add_scalar_impl(a, b, true); }

Tensor& mul_(Tensor& a, Scalar b) { return mul_scalar_impl(a, b, false); }

Tensor& div_(Tensor& a, Scalar b) { return mul_scalar_impl(a, b, true); }

// The mask of where the gradient passes needs a's old values: a clone from before the write.
Tensor& clamp_(Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max) {
  const bool record = check_inplace(a, false, "clamp_");
  std::shared_ptr<ClampBackward> node;
  if (record) {
    node = make_node<ClampBackward>(a);
    node->input = SavedTensor(internal::clone(a), false);
    node->min = min;
    node->max = max;
  }
  internal::clamp_(a, min, max);
  if (record) set_history(a, node);
  return a;
}

// The mask is a bool tensor of its own (it cannot require grad); saved as it is.
Tensor& masked_fill_(Tensor& a, const Tensor& mask, Scalar value) {
  const bool record = check_inplace(a, false, "masked_fill_");
  std::shared_ptr<MaskedFillBackward> node;
  if (record) {
    node = make_node<MaskedFillBackward>(a);
    node->mask = save_other(mask, a);
  }
  internal::masked_fill_(a, mask, value);
  if (record) set_history(a, node);
  return a;
}

Tensor& fill_(Tensor& t, Scalar value) {
  return overwrite(t, "fill_", "FillBackward", [&] { internal::fill_(t, value); });
}
Tensor& uniform_(Tensor& t, double from, double to, Generator* gen) {
  return overwrite(t, "uniform_", "UniformBackward", [&] { internal::uniform_(t, from, to, gen); });
}
Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  return overwrite(t, "normal_", "NormalBackward", [&] { internal::normal_(t, mean, std, gen); });
}

}  // namespace kiln
