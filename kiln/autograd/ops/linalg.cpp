// Linear algebra, forward and backward side by side: matmul (every case torch.matmul supports), mm, bmm,
// addmm, dot, outer. For out = A @ B: dA = g @ B^T, dB = A^T @ g, with transposes as views. Gradients
// with broadcast batch dims are summed down to each input's shape by the engine.

#include <utility>  // std::move

#include "kiln/autograd/column_sums.h"  // take_column_sums: a bias gradient summed by the op after
#include "kiln/autograd/ops/op_recording.h"
#include "kiln/tensor/capture.h"

namespace kiln {

namespace {

Tensor mT(const Tensor& t) { return internal::transpose(t, -2, -1); }  // (..., M, K) -> (..., K, M)

// The dtype to compute the gradient of `node`'s input i in, from g, the gradient it received: Float32 where g is
// 16-bit and the next node takes that gradient in Float32 (Node::gradient_dtype_wanted: a cast of a float32 tensor,
// as autocast makes of parameters and activations), so that the product stores its float32 sums instead of
// rounding them to 16 bits for the cast to widen again; else g's dtype.
DType grad_dtype(const Node& node, size_t i, const Tensor& g) {
  if (g.dtype() != DType::BFloat16 && g.dtype() != DType::Float16) return g.dtype();
  return node.gradient_dtype_wanted(i) == DType::Float32 ? DType::Float32 : g.dtype();
}

// What the backward of every product here keeps: its two factors a and b (unsaved where not needed).
struct ProductBackward : Node {
  SavedTensor a, b;
  void release_saved() override {
    a.reset();
    b.reset();
  }
};

// Records out = a @ b (any of the products) with node N, which saves each factor only where the other
// one's gradient needs it; fill(N&) sets N's own fields.
template <typename N, typename Fill>
Tensor record_product(Tensor out, const Tensor& a, const Tensor& b, Fill&& fill) {
  return record<N>(std::move(out), a, b, [&](N& node) {
    if (node.needs_input_grad(1)) node.a = SavedTensor(a, false);
    if (node.needs_input_grad(0)) node.b = SavedTensor(b, false);
    fill(node);
  });
}

// ---------------------------------------------------------------- matmul
// The 1-D cases follow from the promotions forward makes: a 1-D a is a row (1, K) whose dim is squeezed
// from the result, a 1-D b a column (K, 1). g has the result's shape.
struct MatmulBackward final : ProductBackward {
  int64_t a_dim = 0, b_dim = 0;
  std::string_view name() const override { return "MatmulBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor ga, gb;
    const Tensor av = needs_input_grad(1) ? a.unpack(*this) : Tensor();
    const Tensor bv = needs_input_grad(0) ? b.unpack(*this) : Tensor();
    if (a_dim == 1 && b_dim == 1) {  // dot: g is 0-d
      if (bv.defined()) ga = internal::mul(g, bv);
      if (av.defined()) gb = internal::mul(g, av);
    } else if (a_dim == 1) {  // (K) @ (..., K, N) -> (..., N)
      if (bv.defined()) ga = internal::squeeze(internal::matmul(internal::unsqueeze(g, -2), mT(bv)), -2);  // (..., K)
      if (av.defined()) gb = internal::matmul(internal::unsqueeze(av, -1), internal::unsqueeze(g, -2));  // (..., K, N)
    } else if (b_dim == 1) {  // (..., M, K) @ (K) -> (..., M)
      if (bv.defined()) ga = internal::matmul(internal::unsqueeze(g, -1), internal::unsqueeze(bv, 0));  // (..., M, K)
      if (av.defined()) gb = internal::squeeze(internal::matmul(mT(av), internal::unsqueeze(g, -1)), -1);  // (..., K)
    } else {
      if (bv.defined()) {
        const DType dtype = grad_dtype(*this, 0, g);
        if (dtype != g.dtype() && b_dim == 2) {  // (..., M, N) @ (N, K) as one widening (rows, N) @ (N, K) product
          Shape shape = g.shape();
          shape.back() = bv.size(0);
          ga = internal::reshape(internal::mm(internal::reshape(g, {-1, g.size(-1)}), mT(bv), dtype), shape);
        } else {
          ga = internal::matmul(g, mT(bv));  // (..., M, K)
        }
      }
      if (av.defined()) {
        const DType dtype = grad_dtype(*this, 1, g);
        if (b_dim == 2) {
          // (B, T, K) @ (K, N), as in a linear layer: fold the batch into the rows, one (K, N) product
          // instead of a (B, K, N) one summed afterwards.
          const int64_t k = av.size(-1), n = g.size(-1);
          gb = internal::mm(mT(internal::reshape(av, {-1, k})), internal::reshape(g, {-1, n}), dtype);
        } else {
          gb = internal::matmul(mT(av), g);  // (..., K, N)
        }
      }
    }
    return {ga, gb};
  }
};

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  capture::Op cap("matmul");
  auto [a, b] = autocast::inputs(Op::Matmul, a_in, b_in);
  // An operand the product would copy (batch dims that need two strides, as heads transposed out of a (B, S, H, D)
  // activation) is copied here once: the product reads the copy, and so do backward's products, which would
  // otherwise copy the view again. The gradients still go to a and b.
  const Tensor ac = internal::matmul_copies_operand(a) ? internal::contiguous(a) : a;
  const Tensor bc = internal::matmul_copies_operand(b) ? internal::contiguous(b) : b;
  return cap.done(record<MatmulBackward>(internal::matmul(ac, bc), a, b,
                                         [&, &a = a, &b = b](MatmulBackward& node) {
                                           if (node.needs_input_grad(1)) node.a = SavedTensor(ac, false);
                                           if (node.needs_input_grad(0)) node.b = SavedTensor(bc, false);
                                           node.a_dim = a.dim();
                                           node.b_dim = b.dim();
                                         }),
                  [&] {
                    return capture::Args{{a_in, b_in}, {}};
                  });
}

namespace {

// ---------------------------------------------------------------- mm, bmm: (M, K) @ (K, N), (B, M, K) @ (B, K, N)
struct MmBackward final : ProductBackward {
  bool batched = false;
  std::string_view name() const override { return batched ? "BmmBackward" : "MmBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    auto product = [this, &g](const Tensor& x, const Tensor& y, size_t i) {
      return batched ? internal::bmm(x, y) : internal::mm(x, y, grad_dtype(*this, i, g));
    };
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = product(g, mT(b.unpack(*this)), 0);
    if (needs_input_grad(1)) gb = product(mT(a.unpack(*this)), g, 1);
    return {ga, gb};
  }
};

Tensor mm_impl(const Tensor& a_in, const Tensor& b_in, bool batched) {
  auto [a, b] = autocast::inputs(batched ? Op::Bmm : Op::Mm, a_in, b_in);
  Tensor out = batched ? internal::bmm(a, b) : internal::mm(a, b);
  return record_product<MmBackward>(out, a, b, [&](MmBackward& node) { node.batched = batched; });
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  capture::Op cap("matmul");
  return cap.done(mm_impl(a, b, false), [&] { return capture::Args{{a, b}, {}}; });
}
Tensor bmm(const Tensor& a, const Tensor& b) {
  capture::Op cap("matmul");
  return cap.done(mm_impl(a, b, true), [&] { return capture::Args{{a, b}, {}}; });
}

namespace {

// ---------------------------------------------------------------- addmm: beta * c + alpha * (a @ b)
// dc = beta * g (summed to c's broadcast shape by the engine), da = alpha * g @ b^T, db = alpha * a^T @ g.
// A linear layer's bias (c of shape (N) or (1, N), beta = alpha = 1) gets the row sums of g^T, computed by the
// product db^T = g^T @ a itself (internal::mm_with_row_sums) instead of by a reduction of g of its own, or offered
// by the op after it, which summed g's columns as it wrote g (autograd::take_column_sums).
struct AddmmBackward final : ProductBackward {
  Scalar beta = 1, alpha = 1;
  Shape bias_shape;  // c's shape when c is a bias as above, else empty
  std::string_view name() const override { return "AddmmBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];  // (M, N)
    auto scaled = [](const Tensor& t, Scalar s) { return s.to_double() == 1.0 ? t : internal::mul(t, s); };
    Tensor gc, ga, gb;
    if (needs_input_grad(1)) ga = scaled(internal::mm(g, mT(b.unpack(*this)), grad_dtype(*this, 1, g)), alpha);
    if (needs_input_grad(0) && needs_input_grad(2) && !bias_shape.empty()) {
      // In Float32 where the weight's gradient is wanted there (the bias's then is cast if it is not).
      const DType dtype = grad_dtype(*this, 2, g);
      // The column sums of g, where the op after this one summed them as it wrote g (a layer norm's backward).
      if (Tensor offered = autograd::take_column_sums(g); offered.defined()) {
        gb = mT(internal::mm(mT(g), a.unpack(*this), dtype));                // (N, K) transposed
        gc = internal::reshape(internal::cast(offered, dtype), bias_shape);  // offered itself in its dtype
        return {gc, ga, gb};
      }
      auto [gb_t, sums] = internal::mm_with_row_sums(mT(g), a.unpack(*this), dtype);  // (N, K), (N)
      gb = mT(gb_t);
      gc = internal::reshape(sums, bias_shape);
      return {gc, ga, gb};
    }
    if (needs_input_grad(0)) gc = scaled(g, beta);
    if (needs_input_grad(2)) gb = scaled(internal::mm(mT(a.unpack(*this)), g, grad_dtype(*this, 2, g)), alpha);
    return {gc, ga, gb};
  }
};

}  // namespace

Tensor addmm(const Tensor& c_in, const Tensor& a_in, const Tensor& b_in, Scalar beta, Scalar alpha) {
  capture::Op cap("addmm");
  auto [c, a, b] = autocast::inputs(Op::Addmm, c_in, a_in, b_in);
  Tensor out = internal::addmm(c, a, b, beta, alpha);
  if (needs_grad(c, a, b)) {
    auto node = make_node<AddmmBackward>(c, a, b);
    if (node->needs_input_grad(2)) node->a = SavedTensor(a, false);
    if (node->needs_input_grad(1)) node->b = SavedTensor(b, false);
    node->beta = beta;
    node->alpha = alpha;
    if (beta.to_double() == 1 && alpha.to_double() == 1 && (c.dim() == 1 || (c.dim() == 2 && c.size(0) == 1)) &&
        c.numel() == out.size(1)) {
      node->bias_shape = c.shape();
    }
    set_history(out, node);
  }
  return cap.done(out, [&] {
    return capture::Args{{c_in, a_in, b_in},
                         {{"beta", capture::scalar_value(beta)}, {"alpha", capture::scalar_value(alpha)}}};
  });
}

namespace {

// ---------------------------------------------------------------- dot, outer
// dot: out = sum a_i b_i (0-d): da = g * b, db = g * a.
// outer: out_ij = a_i b_j (M, N): da = g @ b (M), db = g^T @ a (N).
struct VectorProductBackward final : ProductBackward {
  bool is_outer = false;
  std::string_view name() const override { return is_outer ? "OuterBackward" : "DotBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor& g = grads[0];
    Tensor ga, gb;
    if (needs_input_grad(0)) {
      const Tensor bv = b.unpack(*this);
      ga = is_outer ? internal::matmul(g, bv) : internal::mul(g, bv);
    }
    if (needs_input_grad(1)) {
      const Tensor av = a.unpack(*this);
      gb = is_outer ? internal::matmul(internal::transpose(g, 0, 1), av) : internal::mul(g, av);
    }
    return {ga, gb};
  }
};

Tensor vector_product(const Tensor& a_in, const Tensor& b_in, bool is_outer) {
  auto [a, b] = autocast::inputs(is_outer ? Op::Outer : Op::Dot, a_in, b_in);
  Tensor out = is_outer ? internal::outer(a, b) : internal::dot(a, b);
  return record_product<VectorProductBackward>(out, a, b,
                                               [&](VectorProductBackward& node) { node.is_outer = is_outer; });
}

}  // namespace

Tensor dot(const Tensor& a, const Tensor& b) {
  capture::Op cap("matmul");
  return cap.done(vector_product(a, b, false), [&] { return capture::Args{{a, b}, {}}; });
}
Tensor outer(const Tensor& a, const Tensor& b) {
  capture::Op cap("outer");
  return cap.done(vector_product(a, b, true), [&] { return capture::Args{{a, b}, {}}; });
}

}  // namespace kiln
