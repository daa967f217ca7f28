// Frontend of the linear-algebra ops: matmul (torch.matmul semantics), mm, bmm, addmm, dot, outer.
//
// Every op reduces to one primitive, Backend::matmul on (B, M, K) x (B, K, N) -> (B, M, N) views. This
// file checks shapes, dtypes and devices, turns 1-D operands and broadcast batch dims into such views
// (no copies: broadcast batches get stride 0), and handles the cases the contract keeps from backends
// (empty outputs, K = 0, operands with no unit stride in their matrix dims).
#include <optional>
#include <string>
#include <vector>

#include "kiln/tensor/backend.h"
#include "kiln/tensor/internal_ops.h"
#include "kiln/tensor/ops/index_checks.h"  // dtype_enum_name

namespace kiln::internal {
namespace {

void check_operands(std::string_view op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.defined() && b.defined(), op, ": ", a.defined() ? "the second" : "the first",
             " operand is an undefined tensor");
  KILN_CHECK(a.device() == b.device(), op, ": expected both operands on the same device, got ", a.device(), " and ",
             b.device(), "; move one with .to(Device(\"", a.device().str(), "\"))");
  check_not_float8(op, a.dtype());
  check_not_float8(op, b.dtype());
  KILN_CHECK(a.dtype() == b.dtype(), op, ": expected both operands to have the same dtype, got ", a.dtype(), " and ",
             b.dtype(), " (shapes ", a.shape(), " and ", b.shape(),
             "); matmul does not promote, convert one with .to(DType::",
             dtype_enum_name(promote_types(a.dtype(), b.dtype())), ")");
  KILN_CHECK_AS(NotImplementedError, a.dtype() != DType::Bool, op,
                ": not supported for bool tensors; convert them with .to(DType::Float32) or .to(DType::Int64) first");
}

void check_inner(std::string_view op, const Tensor& a, const Tensor& b, int64_t ka, int64_t kb) {
  KILN_CHECK(ka == kb, op, ": shapes ", a.shape(), " and ", b.shape(), " cannot be multiplied (", ka, " != ", kb, ")");
}

// The dtype a product of a's dtype may be stored in: a's, or Float32 for 16-bit operands (Backend::matmul).
void check_out_dtype(std::string_view op, const Tensor& a, DType out) {
  const bool half = a.dtype() == DType::BFloat16 || a.dtype() == DType::Float16;
  KILN_CHECK(out == a.dtype() || (half && out == DType::Float32), op, ": a product of ", a.dtype(),
             " operands can be stored in ", a.dtype(), half ? " or float32" : " only", ", not in ", out);
}

// A (B, R, C) operand whose matrix dims have no unit stride gets copied (one matrix only when the
// batch is broadcast with stride 0), because the backend reads matrices as row- or column-major.
Tensor with_unit_stride(const Tensor& t) {
  if (t.size(1) <= 1 || t.size(2) <= 1 || t.stride(1) == 1 || t.stride(2) == 1) return t;
  if (t.stride(0) == 0 || t.size(0) == 1) {
    Tensor m = contiguous(narrow(t, 0, 0, 1));
    return as_strided(m, t.shape(), {0, m.stride(1), m.stride(2)});
  }
  return contiguous(t);
}

// A new (M, N) product of a and b in `dtype` (a's by default): rows at the pitch the backend asks for
// (Backend::matmul_row_pitch), the (M, N) view of them.
Tensor empty_product(int64_t m, int64_t n, const Tensor& a, std::optional<DType> dtype = std::nullopt) {
  TensorOptions options = a.options();
  if (dtype) options.dtype = *dtype;
  const int64_t pitch = m > 1 ? backend(a.device()).matmul_row_pitch(options.dtype.value_or(a.dtype()), n) : n;
  if (pitch == n) return empty({m, n}, options);
  return narrow(empty({m, pitch}, options), 1, 0, n);
}

// out (B, M, N), rows contiguous = alpha * a (B, M, K) @ b (B, K, N) + beta * out.
void run_batched(const Tensor& out, Tensor a, Tensor b, double alpha, double beta) {
  if (out.numel() == 0) return;
  if (a.size(2) == 0) {
    // K = 0: the product is zeros. Multiply by a zero inner dim of 1 instead, which keeps beta * out
    // on the backend and hands it no zero-element tensor.
    const int64_t m = a.size(1), n = b.size(2), batches = out.size(0);
    Tensor za = zeros({1, m, 1}, a.options()), zb = zeros({1, 1, n}, b.options());
    a = as_strided(za, {batches, m, 1}, {0, 1, 1});
    b = as_strided(zb, {batches, 1, n}, {0, n, 1});
  }
  backend(out.device()).matmul(out, with_unit_stride(a), with_unit_stride(b), alpha, beta);
  out.impl().storage()->bump_version();
}

// A 2-D tensor as a (1, R, C) batch of one.
Tensor as_batch(const Tensor& t) { return as_strided(t, {1, t.size(0), t.size(1)}, {0, t.stride(0), t.stride(1)}); }

// (M, K) @ (K, N) -> new (M, N) in `dtype` (a's by default), after the checks.
Tensor matmul_2d(const Tensor& a, const Tensor& b, std::optional<DType> dtype = std::nullopt) {
  Tensor out = empty_product(a.size(0), b.size(1), a, dtype);
  run_batched(as_batch(out), as_batch(a), as_batch(b), 1, 0);
  return out;
}

// One run of batch dims that can be walked with a single stride in each of a, b and out.
struct BatchGroup {
  int64_t size, stride_a, stride_b, stride_out;
};

// Merges the batch dims of a, b and out (already broadcast to one batch shape) into as few groups as
// the strides allow; size-1 dims vanish. Contiguous outputs and plain broadcasts usually give one group.
std::vector<BatchGroup> batch_groups(const Shape& batch, const Tensor& a, const Tensor& b, const Tensor& out) {
  std::vector<BatchGroup> groups;
  for (size_t d = 0; d < batch.size(); ++d) {
    if (batch[d] == 1) continue;
    BatchGroup g{batch[d], a.stride(d), b.stride(d), out.stride(d)};
    if (!groups.empty()) {
      BatchGroup& last = groups.back();
      if (last.stride_a == g.stride_a * g.size && last.stride_b == g.stride_b * g.size &&
          last.stride_out == g.stride_out * g.size) {
        last = {last.size * g.size, g.stride_a, g.stride_b, g.stride_out};
        continue;
      }
    }
    groups.push_back(g);
  }
  return groups;
}

// Whether t's dims of `batch` (size-1 ones aside) walk with one stride, as a single batch dim would.
bool batch_walks_with_one_stride(const Shape& batch, const Tensor& t) {
  int64_t inner = -1, inner_size = 1;  // the stride and size of the dims merged so far, innermost first
  for (size_t d = batch.size(); d-- > 0;) {
    if (batch[d] == 1) continue;
    if (inner >= 0 && t.stride(static_cast<int64_t>(d)) != inner * inner_size) return false;
    if (inner < 0) inner = t.stride(static_cast<int64_t>(d));
    inner_size *= batch[d];
  }
  return true;
}

// Batched matmul of a (..., M, K) and b (..., K, N) with broadcast batch dims into a new tensor of
// shape (batch..., M, N).
Tensor matmul_batched(const Tensor& a, const Tensor& b, const Tensor& a_orig, const Tensor& b_orig) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes(batch_a, batch_b, "matmul");
  } catch (const Error&) {
    KILN_FAIL("matmul: the batch dims ", batch_a, " and ", batch_b, " of shapes ", a_orig.shape(), " and ",
              b_orig.shape(), " cannot be broadcast together; sizes must be equal or 1, counting from the last");
  }
  Shape a_shape = batch, b_shape = batch, out_shape = batch;
  a_shape.insert(a_shape.end(), {m, k});
  b_shape.insert(b_shape.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  Tensor ae = expand(a, a_shape), be = expand(b, b_shape);
  Tensor out = empty(out_shape, a.options());
  if (out.numel() == 0) return out;

  std::vector<BatchGroup> groups = batch_groups(batch, ae, be, out);
  if (groups.size() > 1) {
    // The batch dims need more than one stride (e.g. heads transposed out of a (B, S, H, D) activation): one
    // batched product over a copy is far cheaper than a product per outer index. An operand whose own batch dims
    // walk with one stride (broadcast ones included) is used in place; the others are copied contiguous, after
    // which every batch dim merges into one group.
    if (!batch_walks_with_one_stride(batch, ae)) ae = contiguous(ae);
    if (!batch_walks_with_one_stride(batch, be)) be = contiguous(be);
    groups = batch_groups(batch, ae, be, out);
  }
  const int64_t r = static_cast<int64_t>(batch.size());
  // The last group becomes the backend's batch dim; the ones before it are walked here.
  const BatchGroup inner = groups.empty() ? BatchGroup{1, 0, 0, 0} : groups.back();
  int64_t outer_count = 1;
  for (size_t g = 0; g + 1 < groups.size(); ++g) outer_count *= groups[g].size;
  for (int64_t i = 0; i < outer_count; ++i) {
    int64_t off_a = ae.offset(), off_b = be.offset(), off_out = out.offset(), rest = i;
    for (size_t g = groups.empty() ? 0 : groups.size() - 1; g-- > 0;) {
      const int64_t idx = rest % groups[g].size;
      rest /= groups[g].size;
      off_a += idx * groups[g].stride_a;
      off_b += idx * groups[g].stride_b;
      off_out += idx * groups[g].stride_out;
    }
    Tensor a3 = as_strided(ae, {inner.size, m, k}, {inner.stride_a, ae.stride(r), ae.stride(r + 1)}, off_a);
    Tensor b3 = as_strided(be, {inner.size, k, n}, {inner.stride_b, be.stride(r), be.stride(r + 1)}, off_b);
    Tensor o3 = as_strided(out, {inner.size, m, n}, {inner.stride_out, n, 1}, off_out);
    run_batched(o3, a3, b3, 1, 0);
  }
  return out;
}

// Folds the leading dims of a (..., M, K) into the rows when they collapse to one stride, so that
// a (B, T, K) @ w (K, N) runs as one (B*T, K) @ (K, N) product. Returns an undefined tensor otherwise.
Tensor fold_rows(const Tensor& a) {
  int64_t rows = 1, stride = a.size(-1), inner_rows = 1;
  for (int64_t d = a.dim() - 2; d >= 0; --d) {
    rows *= a.size(d);
    if (a.size(d) == 1) continue;
    if (inner_rows == 1) stride = a.stride(d);  // the innermost dim of more than one row sets the stride
    else if (a.stride(d) != stride * inner_rows) return {};
    inner_rows *= a.size(d);
  }
  return as_strided(a, {rows, a.size(-1)}, {stride, a.stride(-1)});
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_operands("matmul", a, b);
  KILN_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dim, got shapes ", a.shape(), " and ",
             b.shape(), "; multiply by a 0-d tensor with mul() instead");
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  check_inner("matmul", a, b, ka, kb);
  if (a.dim() == 1 && b.dim() == 1) return dot(a, b);
  if (a.dim() <= 2 && b.dim() <= 2) {
    // 1-D operands become a row (on the left) or a column (on the right), squeezed afterwards.
    const Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a, b2 = b.dim() == 1 ? unsqueeze(b, 1) : b;
    Tensor out = matmul_2d(a2, b2);
    if (a.dim() == 1) return squeeze(out, 0);
    if (b.dim() == 1) return squeeze(out, 1);
    return out;
  }
  if (a.dim() >= 3 && b.dim() <= 2) {
    const Tensor b2 = b.dim() == 1 ? unsqueeze(b, 1) : b;
    if (Tensor rows = fold_rows(a); rows.defined()) {
      Tensor out = matmul_2d(rows, b2);  // (rows, N)
      Shape shape(a.shape().begin(), a.shape().end() - 1);
      if (b.dim() == 2) shape.push_back(b.size(1));
      return view(out, shape);
    }
  }
  const Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a, b2 = b.dim() == 1 ? unsqueeze(b, 1) : b;
  Tensor out = matmul_batched(a2, b2, a, b);
  if (a.dim() == 1) return squeeze(out, -2);
  if (b.dim() == 1) return squeeze(out, -1);
  return out;
}

Tensor mm(const Tensor& a, const Tensor& b) {
  check_operands("mm", a, b);
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected two 2-D tensors, got shapes ", a.shape(), " and ", b.shape(),
             "; use matmul() for other ranks");
  check_inner("mm", a, b, a.size(1), b.size(0));
  return matmul_2d(a, b);
}

Tensor mm(const Tensor& a, const Tensor& b, DType out_dtype) {
  check_operands("mm", a, b);
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected two 2-D tensors, got shapes ", a.shape(), " and ", b.shape(),
             "; use matmul() for other ranks");
  check_inner("mm", a, b, a.size(1), b.size(0));
  check_out_dtype("mm", a, out_dtype);
  return matmul_2d(a, b, out_dtype);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_operands("bmm", a, b);
  KILN_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected two 3-D tensors, got shapes ", a.shape(), " and ", b.shape(),
             "; use matmul() for other ranks or broadcast batches");
  KILN_CHECK(a.size(0) == b.size(0), "bmm: shapes ", a.shape(), " and ", b.shape(), " have different batch sizes (",
             a.size(0), " != ", b.size(0), "); use matmul() to broadcast batch dims");
  check_inner("bmm", a, b, a.size(2), b.size(1));
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, a.options());
  run_batched(out, a, b, 1, 0);
  return out;
}

Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha) {
  check_operands("addmm", a, b);
  KILN_CHECK(c.defined(), "addmm: the input c is an undefined tensor");
  KILN_CHECK(c.device() == a.device(), "addmm: expected c on the operands' device ", a.device(), ", got ", c.device());
  KILN_CHECK(c.dtype() == a.dtype(), "addmm: expected c to have the operands' dtype ", a.dtype(), ", got ", c.dtype(),
             "; convert it with .to(DType::", dtype_enum_name(a.dtype()), ")");
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "addmm: expected 2-D operands, got shapes ", a.shape(), " and ", b.shape());
  check_inner("addmm", a, b, a.size(1), b.size(0));
  const Shape shape{a.size(0), b.size(1)};
  KILN_CHECK(c.dim() <= 2 && broadcast_shapes(c.shape(), shape, "addmm") == shape, "addmm: c of shape ", c.shape(),
             " cannot be broadcast to the product's shape ", shape);
  KILN_CHECK(is_floating_point(a.dtype()) || (!beta.is_floating_point() && !alpha.is_floating_point()),
             "addmm: beta and alpha must be integers for ", a.dtype(), " tensors, got ", beta, " and ", alpha);
  Tensor out = empty_product(shape[0], shape[1], a);
  const double beta_v = beta.to_double();
  // A linear layer's bias, c (N) or (1, N) with beta = alpha = 1: added by the product's epilogue where the backend
  // has one, instead of being copied into every row of out first.
  if (beta_v == 1 && alpha.to_double() == 1 && c.numel() == shape[1] && c.numel() > 0 && shape[0] > 0 &&
      a.size(1) > 0 && (c.dim() == 1 || c.size(0) == 1)) {
    const Tensor bias = contiguous(reshape(c, {shape[1]}));
    if (backend(out.device())
            .matmul_epilogue(as_batch(out), with_unit_stride(as_batch(a)), with_unit_stride(as_batch(b)),
                             {.bias = bias, .row_sums = {}})) {
      out.impl().storage()->bump_version();
      return out;
    }
  }
  if (beta_v != 0) copy_(out, c);  // beta == 0 ignores c entirely (NaN included), as PyTorch does
  run_batched(as_batch(out), as_batch(a), as_batch(b), alpha.to_double(), beta_v);
  return out;
}

Tensor& addmm_(Tensor& c, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha) {
  check_operands("addmm_", a, b);
  KILN_CHECK(c.defined(), "addmm_: the destination c is an undefined tensor");
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "addmm_: expected 2-D operands, got shapes ", a.shape(), " and ", b.shape());
  check_inner("addmm_", a, b, a.size(1), b.size(0));
  const Shape shape{a.size(0), b.size(1)};
  KILN_CHECK(c.device() == a.device(), "addmm_: the destination is on ", c.device(), " but the operands are on ",
             a.device(), "; move it with .to(", a.device(), ")");
  check_out_dtype("addmm_", a, c.dtype());  // the operands' dtype, or float32 sums of 16-bit operands
  KILN_CHECK(c.shape() == shape, "addmm_: the destination has shape ", c.shape(), " but the product has shape ", shape,
             "; an in-place product does not broadcast its destination");
  KILN_CHECK((shape[1] <= 1 || c.stride(1) == 1) && (shape[0] <= 1 || c.stride(0) == shape[1]),
             "addmm_: the destination ", "of shape ", c.shape(), " has strides ", c.strides(),
             "; it needs contiguous rows (strides (", shape[1], ", 1)): use addmm() for a new result instead");
  KILN_CHECK(is_floating_point(a.dtype()) || (!beta.is_floating_point() && !alpha.is_floating_point()),
             "addmm_: beta and alpha must be integers for ", a.dtype(), " tensors, got ", beta, " and ", alpha);
  if (c.numel() == 0) return c;
  const Tensor out = as_strided(c, {1, shape[0], shape[1]}, {0, shape[1], 1});  // canonical strides of the rows
  run_batched(out, as_batch(a), as_batch(b), alpha.to_double(), beta.to_double());
  return c;
}

// Whether mm_with_row_sums takes the row sums of a as one more column of b rather than from the product's epilogue:
// on a GPU, for 16-bit operands, where a has at least 8 times as many rows as b has columns (the weight gradient of
// a linear layer with at least 8 times as many outputs as inputs: a language model's output layer over its
// vocabulary). There cuBLASLt's bias-gradient epilogue costs more than widening b and copying the result out: BERT's
// output layer (768 -> 30522, 16384 tokens, bench_cuda_matmul --linear-grads on an H100) 1.70 against 1.42 ms. With
// 3 or 4 times as many outputs as inputs (a transformer's QKV and first MLP products) the epilogue is faster (0.126
// against 0.151 ms, 0.155 against 0.168).
static bool ones_column_pays(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  return a.is_cuda() && (a.dtype() == DType::BFloat16 || a.dtype() == DType::Float16) && m > 0 && k > 0 && n > 0 &&
         m >= 8 * n;
}

std::pair<Tensor, Tensor> mm_with_row_sums(const Tensor& a, const Tensor& b, std::optional<DType> out_dtype) {
  check_operands("mm_with_row_sums", a, b);
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "mm_with_row_sums: expected two 2-D tensors, got shapes ", a.shape(),
             " and ", b.shape());
  check_inner("mm_with_row_sums", a, b, a.size(1), b.size(0));
  const DType dtype = out_dtype.value_or(a.dtype());
  check_out_dtype("mm_with_row_sums", a, dtype);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (ones_column_pays(a, b)) {
    // The row sums as one more column of the product: a @ [b | 1 | 0 ...], b's rows widened to a multiple of 8
    // values (16 bytes). The product's float32 accumulators sum a's values times 1, as the epilogue would.
    const int64_t width = (n + 8) / 8 * 8;
    Tensor wide = empty({k, width}, b.options());
    Tensor left = narrow(wide, 1, 0, n), ones_col = narrow(wide, 1, n, 1), rest = narrow(wide, 1, n + 1, width - n - 1);
    copy_(left, b);
    fill_(ones_col, 1);
    if (rest.numel() > 0) fill_(rest, 0);
    const Tensor both = matmul_2d(a, wide, dtype);  // (M, width)
    return {contiguous(narrow(both, 1, 0, n)), contiguous(select(both, 1, n))};
  }
  if (m > 0 && k > 0 && n > 0) {
    Tensor out = empty_product(m, n, a, dtype);
    TensorOptions sums_options = a.options();
    sums_options.dtype = dtype;
    Tensor sums = empty({m}, sums_options);
    if (backend(out.device())
            .matmul_epilogue(as_batch(out), with_unit_stride(as_batch(a)), with_unit_stride(as_batch(b)),
                             {.bias = {}, .row_sums = sums})) {
      out.impl().storage()->bump_version();
      return {out, sums};
    }
  }
  // The row sums of 16-bit (or float64) a as a product with a column of ones: a matrix-vector product reads a once at
  // full bandwidth, where a reduction over a transposed view would not. Float32 a is reduced: its product would run
  // in TF32 where that is allowed (the default), summing a's values rounded to 10 bits.
  const bool by_product = is_floating_point(a.dtype()) && a.dtype() != DType::Float32 && a.size(1) > 0;
  Tensor sums = by_product ? reshape(matmul_2d(a, ones({a.size(1), 1}, a.options()), dtype), {a.size(0)}) : sum(a, {1});
  return {matmul_2d(a, b, dtype), sums.dtype() == dtype ? sums : cast(sums, dtype)};
}

Tensor dot(const Tensor& a, const Tensor& b) {
  check_operands("dot", a, b);
  KILN_CHECK(a.dim() == 1 && b.dim() == 1, "dot: expected two 1-D tensors, got shapes ", a.shape(), " and ", b.shape());
  KILN_CHECK(a.size(0) == b.size(0), "dot: shapes ", a.shape(), " and ", b.shape(), " have different lengths (",
             a.size(0), " != ", b.size(0), ")");
  Tensor out = empty({}, a.options());
  // (1, 1, K) @ (1, K, 1) -> (1, 1, 1)
  run_batched(as_strided(out, {1, 1, 1}, {0, 1, 1}), as_strided(a, {1, 1, a.size(0)}, {0, 0, a.stride(0)}),
              as_strided(b, {1, b.size(0), 1}, {0, b.stride(0), 0}), 1, 0);
  return out;
}

Tensor outer(const Tensor& a, const Tensor& b) {
  check_operands("outer", a, b);
  KILN_CHECK(a.dim() == 1 && b.dim() == 1, "outer: expected two 1-D tensors, got shapes ", a.shape(), " and ",
             b.shape());
  Tensor out = empty({a.size(0), b.size(0)}, a.options());
  // (1, M, 1) @ (1, 1, N) -> (1, M, N)
  run_batched(as_batch(out), as_strided(a, {1, a.size(0), 1}, {0, a.stride(0), 1}),
              as_strided(b, {1, 1, b.size(0)}, {0, 1, b.stride(0)}), 1, 0);
  return out;
}

bool matmul_copies_operand(const Tensor& t) {
  return t.dim() >= 3 && !batch_walks_with_one_stride(Shape(t.shape().begin(), t.shape().end() - 2), t);
}

}  // namespace kiln::internal
