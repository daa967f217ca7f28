// Frontend of the FP8 ops (fp8_ops.h): argument checks, output allocation, empty cases, then the backend's kernel
// (ops/fp8_kernels.h). Every check is here, once, so the CPU and CUDA kernels see only valid problems.
#include <string>
#include <string_view>
#include <utility>  // std::pair
#include <vector>

#include "kiln/tensor/error.h"
#include "kiln/tensor/fp8_ops.h"
#include "kiln/tensor/internal_ops.h"
#include "kiln/tensor/ops/fp8_kernels.h"
#include "kiln/tensor/trace.h"

namespace kiln::internal {
namespace {

// A 1-element float32 tensor on `device` (a scale, a scale_inv or an amax cell), named `what` in errors.
void check_scalar_operand(std::string_view op, std::string_view what, const Tensor& t, Device device) {
  KILN_CHECK(t.defined(), op, ": ", what, " is an undefined tensor; pass a 1-element float32 tensor (a view of the ",
             "scaling state's element, say)");
  KILN_CHECK(t.dtype() == DType::Float32 && t.numel() == 1, op, ": ", what, " must be a 1-element float32 tensor, got ",
             t.dtype(), " of shape ", t.shape(),
             "; pass one element of the scaling state, e.g. state.scale().narrow(0, j, 1)");
  KILN_CHECK(t.device() == device, op, ": ", what, " is on ", t.device(), " but the data is on ", device,
             "; keep the scaling state on the data's device");
}

bool is_fp8_input_dtype(DType t) { return t == DType::Float32 || t == DType::BFloat16 || t == DType::Float16; }

// act(x) in float32 (Fp8Activation), for the quantisations that do not apply it in their own pass.
Tensor activated(const Tensor& x, Fp8Activation act) {
  const Tensor x32 = x.dtype() == DType::Float32 ? x : cast(x, DType::Float32);
  return gelu(x32, act == Fp8Activation::GeluTanh);
}

}  // namespace

Tensor fp8_transpose(const Tensor& x) {
  constexpr std::string_view op = "fp8_transpose";
  KILN_CHECK(x.defined() && x.dim() == 2 && is_float8(x.dtype()), op, ": expected 2-D FP8 codes (rows, columns), got ",
             x.defined() ? detail::str_cat(x.dtype(), " of shape ", x.shape()) : std::string("an undefined tensor"));
#if KILN_WITH_CUDA
  if (x.device().is_cuda() && x.numel() > 0 && x.is_contiguous() && cuda::fp8_transpose_kernel_applies(x)) {
    Tensor out = empty({x.size(1), x.size(0)}, {.dtype = x.dtype(), .device = x.device()});
    trace::Scope range(trace::Kind::Op, op, x.device(), {&out, &x});
    cuda::fp8_transpose(out, x);
    return out;
  }
#endif
  return contiguous(transpose(x, 0, 1));
}

Tensor fp8_quantize(const Tensor& x, DType fp8_dtype, const Tensor& scale, const Tensor& amax, bool transpose,
                    Fp8Activation act) {
  constexpr std::string_view op = "fp8_quantize";
  KILN_CHECK(x.defined(), op, ": the input is an undefined tensor");
  KILN_CHECK(is_float8(fp8_dtype), op, ": the target dtype ", fp8_dtype,
             " is not an FP8 dtype; use DType::Float8_e4m3fn or DType::Float8_e5m2");
  KILN_CHECK(is_fp8_input_dtype(x.dtype()), op, ": the input is ", x.dtype(), " of shape ", x.shape(),
             "; expected float32, bfloat16 or float16 (convert it with .to(DType::Float32) first)");
  KILN_CHECK(x.is_contiguous(), op, ": the input of shape ", x.shape(), " with strides ", x.strides(),
             " is not contiguous; call .contiguous() first");
  KILN_CHECK(!transpose || x.dim() == 2, op, ": transpose needs a 2-D input, got shape ", x.shape(),
             "; reshape it to (rows, columns) first");
  check_scalar_operand(op, "scale", scale, x.device());
  check_scalar_operand(op, "amax", amax, x.device());
  if (act != Fp8Activation::None) return fp8_quantize(activated(x, act), fp8_dtype, scale, amax, transpose);
  const Shape shape = transpose ? Shape{x.size(1), x.size(0)} : x.shape();
  Tensor out = empty(shape, {.dtype = fp8_dtype, .device = x.device()});
  if (x.numel() == 0) return out;  // nothing seen: amax keeps its value
  trace::Scope range(trace::Kind::Op, op, x.device(), {&out, &x, &scale, &amax});
  if (x.device().is_cuda()) {
#if KILN_WITH_CUDA
    cuda::fp8_quantize(out, x, scale, amax, transpose);
#else
    KILN_FAIL(op, ": kiln was built without CUDA");
#endif
  } else {
    cpu::fp8_quantize(out, x, scale, amax, transpose);
  }
  amax.impl().storage()->bump_version();
  return out;
}

std::pair<Tensor, Tensor> fp8_quantize_pair(const Tensor& x, DType fp8_dtype, const Tensor& scale, const Tensor& amax,
                                            Tensor* column_sums, Fp8Activation act) {
  constexpr std::string_view op = "fp8_quantize_pair";
  KILN_CHECK(x.defined() && x.dim() == 2, op, ": expected a 2-D input (rows, columns), got ",
             x.defined() ? detail::str_cat("shape ", x.shape()) : std::string("an undefined tensor"));
#if KILN_WITH_CUDA
  const bool pair_kernel = x.device().is_cuda() && x.numel() > 0 && is_float8(fp8_dtype) &&
                           is_fp8_input_dtype(x.dtype()) && x.is_contiguous() && cuda::fp8_pair_kernel_applies(x);
  if (pair_kernel &&
      (act == Fp8Activation::None || cuda::fp8_pair_kernel_activates(x, fp8_dtype, column_sums != nullptr))) {
    check_scalar_operand(op, "scale", scale, x.device());
    check_scalar_operand(op, "amax", amax, x.device());
    Tensor out = empty(x.shape(), {.dtype = fp8_dtype, .device = x.device()});
    Tensor out_t = empty({x.size(1), x.size(0)}, {.dtype = fp8_dtype, .device = x.device()});
    Tensor partial;
    if (column_sums != nullptr) {
      partial =
          empty({x.size(1), cuda::fp8_pair_row_tiles(x.size(0))}, {.dtype = DType::Float32, .device = x.device()});
    }
    {
      trace::Scope range(trace::Kind::Op, op, x.device(), {&out, &out_t, &x, &scale, &amax});
      cuda::fp8_quantize_pair(out, out_t, partial, x, scale, amax, act);
    }
    amax.impl().storage()->bump_version();
    if (column_sums != nullptr) *column_sums = sum(partial, {1}, false);  // each column's row of partials
    return {out, out_t};
  }
#endif
  // An activation the kernel does not apply itself: act(x) in float32 first, then its quantisation.
  if (act != Fp8Activation::None) {
    KILN_CHECK(is_fp8_input_dtype(x.dtype()), op, ": the input is ", x.dtype(),
               "; expected float32, bfloat16 or float16");
    KILN_CHECK(x.is_contiguous(), op, ": the input of shape ", x.shape(), " with strides ", x.strides(),
               " is not contiguous; call .contiguous() first");
    check_scalar_operand(op, "scale", scale, x.device());
    check_scalar_operand(op, "amax", amax, x.device());
    return fp8_quantize_pair(activated(x, act), fp8_dtype, scale, amax, column_sums);
  }
  // Elsewhere (the CPU, shapes the paired kernel does not take): the two quantisations one after the other (the
  // second records the same amax again, which changes nothing) and the sums by the reduction.
  Tensor out = fp8_quantize(x, fp8_dtype, scale, amax);
  Tensor out_t = fp8_quantize(x, fp8_dtype, scale, amax, true);
  if (column_sums != nullptr) *column_sums = sum(x, {0}, false, DType::Float32);
  return {out, out_t};
}

std::pair<Tensor, Tensor> fp8_quantize_pair_through_gelu(const Tensor& grad, const Tensor& h, bool tanh_approximation,
                                                         DType fp8_dtype, const Tensor& scale, const Tensor& amax,
                                                         Tensor* column_sums) {
  constexpr std::string_view op = "fp8_quantize_pair_through_gelu";
  KILN_CHECK(grad.defined() && h.defined() && grad.dim() == 2, op, ": expected a 2-D gradient and the GELU's input");
  KILN_CHECK(h.shape() == grad.shape() && h.dtype() == grad.dtype() && h.device() == grad.device(), op,
             ": the GELU's input (", h.dtype(), " of shape ", h.shape(), " on ", h.device(),
             ") must have the gradient's shape, dtype and device (", grad.dtype(), " of shape ", grad.shape(), " on ",
             grad.device(), ")");
  KILN_CHECK(is_fp8_input_dtype(grad.dtype()), op, ": the gradient is ", grad.dtype(),
             "; expected float32, bfloat16 or float16");
#if KILN_WITH_CUDA
  if (grad.device().is_cuda() && grad.numel() > 0 && is_float8(fp8_dtype) && grad.is_contiguous() &&
      cuda::fp8_pair_kernel_through_gelu(grad, h, tanh_approximation)) {
    check_scalar_operand(op, "scale", scale, grad.device());
    check_scalar_operand(op, "amax", amax, grad.device());
    const TensorOptions codes{.dtype = fp8_dtype, .device = grad.device()};
    Tensor out = empty(grad.shape(), codes), out_t = empty({grad.size(1), grad.size(0)}, codes), partial;
    if (column_sums != nullptr) {
      partial = empty({grad.size(1), cuda::fp8_pair_row_tiles(grad.size(0))},
                      {.dtype = DType::Float32, .device = grad.device()});
    }
    {
      trace::Scope range(trace::Kind::Op, op, grad.device(), {&out, &out_t, &grad, &h, &scale, &amax});
      cuda::fp8_quantize_pair(out, out_t, partial, grad, scale, amax, Fp8Activation::None, h);
    }
    amax.impl().storage()->bump_version();
    if (column_sums != nullptr) *column_sums = sum(partial, {1}, false);  // each column's row of partials
    return {out, out_t};
  }
#endif
  const auto in_float32 = [](const Tensor& t) { return t.dtype() == DType::Float32 ? t : cast(t, DType::Float32); };
  return fp8_quantize_pair(gelu_backward(in_float32(grad), in_float32(h), tanh_approximation), fp8_dtype, scale, amax,
                           column_sums);
}

std::pair<Tensor, Tensor> fp8_quantize_pair_of_rows(const std::vector<Tensor>& parts, DType fp8_dtype,
                                                    const Tensor& scale, const Tensor& amax) {
  constexpr std::string_view op = "fp8_quantize_pair_of_rows";
  KILN_CHECK(!parts.empty(), op, ": no parts to quantise; pass the (R_i, C) tensors to stack");
  const Tensor& first = parts[0];
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& p = parts[i];
    KILN_CHECK(p.defined() && p.dim() == 2, op, ": part ", i, " must be a 2-D tensor (rows, columns), got ",
               p.defined() ? detail::str_cat("shape ", p.shape()) : std::string("an undefined tensor"));
    KILN_CHECK(p.size(1) == first.size(1) && p.dtype() == first.dtype() && p.device() == first.device(), op, ": part ",
               i, " (", p.dtype(), " of shape ", p.shape(), " on ", p.device(), ") does not agree with part 0 (",
               first.dtype(), " of shape ", first.shape(), " on ", first.device(),
               "); the parts need one column count, dtype and device");
  }
  if (parts.size() == 1) return fp8_quantize_pair(first, fp8_dtype, scale, amax);
#if KILN_WITH_CUDA
  bool per_part = first.device().is_cuda() && is_float8(fp8_dtype) && is_fp8_input_dtype(first.dtype());
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    per_part =
        per_part && p.numel() > 0 && p.is_contiguous() && p.size(0) % 16 == 0 && cuda::fp8_pair_kernel_applies(p);
    rows += p.size(0);
  }
  if (per_part) {
    check_scalar_operand(op, "scale", scale, first.device());
    check_scalar_operand(op, "amax", amax, first.device());
    const int64_t cols = first.size(1);
    Tensor out = empty({rows, cols}, {.dtype = fp8_dtype, .device = first.device()});
    Tensor out_t = empty({cols, rows}, {.dtype = fp8_dtype, .device = first.device()});
    {
      trace::Scope range(trace::Kind::Op, op, first.device(), {&out, &out_t, &first, &scale, &amax});
      int64_t at = 0;
      for (const Tensor& p : parts) {  // each part's rows of out, and its block of out_t's columns
        cuda::fp8_quantize_pair(narrow(out, 0, at, p.size(0)), narrow(out_t, 1, at, p.size(0)), Tensor(), p, scale,
                                amax, Fp8Activation::None);
        at += p.size(0);
      }
    }
    amax.impl().storage()->bump_version();
    return {out, out_t};
  }
#endif
  return fp8_quantize_pair(cat(parts, 0), fp8_dtype, scale, amax);
}

Tensor fp8_gemm(const Tensor& a, const Tensor& b, const Tensor& a_scale_inv, const Tensor& b_scale_inv, DType out_dtype,
                const Tensor& bias, Tensor* accumulate_into, bool fast_accumulation) {
  constexpr std::string_view op = "fp8_gemm";
  KILN_CHECK(a.defined() && b.defined(), op, ": ", a.defined() ? "b" : "a", " is an undefined tensor");
  KILN_CHECK(is_float8(a.dtype()) && is_float8(b.dtype()), op, ": both operands must be FP8 (float8_e4m3fn or ",
             "float8_e5m2), got a ", a.dtype(), " and b ", b.dtype(), "; quantise them with fp8_quantize first");
  KILN_CHECK_AS(NotImplementedError, !(a.dtype() == DType::Float8_e5m2 && b.dtype() == DType::Float8_e5m2), op,
                ": float8_e5m2 x float8_e5m2 is not supported (cuBLASLt has no FP8 kernel for two E5M2 operands); ",
                "quantise one operand to float8_e4m3fn (gradients E5M2, activations and weights E4M3)");
  KILN_CHECK(a.device() == b.device(), op, ": a is on ", a.device(), " and b on ", b.device(),
             "; move both to one device");
  KILN_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1), op, ": expected a (M, K) and b (N, K) with one K ",
             "(out = a @ b^T), got a ", a.shape(), " and b ", b.shape());
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  KILN_CHECK(m % 16 == 0 && n % 16 == 0 && k % 16 == 0, op, ": M, N and K must be multiples of 16 for FP8 tensor ",
             "cores, got M = ", m, ", N = ", n, ", K = ", k, " (a ", a.shape(), ", b ", b.shape(),
             "); pad the operands or compute this product in bfloat16");
  KILN_CHECK(a.is_contiguous() && b.is_contiguous(), op, ": a ", a.shape(), " (strides ", a.strides(), ") and b ",
             b.shape(), " (strides ", b.strides(), ") must be contiguous, K the fastest dim; call .contiguous() or ",
             "quantise with transpose = true");
  check_scalar_operand(op, "a_scale_inv", a_scale_inv, a.device());
  check_scalar_operand(op, "b_scale_inv", b_scale_inv, a.device());
  KILN_CHECK(out_dtype == DType::BFloat16 || out_dtype == DType::Float16 || out_dtype == DType::Float32, op,
             ": out_dtype ", out_dtype, " is not supported; use BFloat16, Float16 or Float32");
  if (bias.defined()) {
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == n && bias.dtype() == out_dtype && bias.device() == a.device(), op,
               ": the bias must be (", n, ") ", out_dtype, " on ", a.device(), ", got ", bias.shape(), " ",
               bias.dtype(), " on ", bias.device());
  }
  Tensor out;
  if (accumulate_into != nullptr) {
    Tensor& acc = *accumulate_into;
    KILN_CHECK(acc.defined(), op, ": accumulate_into is an undefined tensor; pass nullptr to get a new result");
    KILN_CHECK(out_dtype == DType::Float32, op, ": accumulating needs out_dtype Float32, got ", out_dtype);
    KILN_CHECK(acc.dtype() == DType::Float32 && acc.shape() == Shape({m, n}) && acc.is_contiguous() &&
                   acc.device() == a.device(),
               op, ": accumulate_into must be a contiguous float32 (", m, ", ", n, ") tensor on ", a.device(), ", got ",
               acc.dtype(), " ", acc.shape(), " with strides ", acc.strides(), " on ", acc.device());
    out = acc;
  } else {
    out = empty({m, n}, {.dtype = out_dtype, .device = a.device()});
  }
  if (m == 0 || n == 0) return out;
  const Tensor bias_c = bias.defined() ? contiguous(bias) : Tensor();
  if (k == 0) {  // an empty sum: out = bias (+ out)
    if (accumulate_into == nullptr) fill_(out, 0);
    if (bias_c.defined()) add_(out, reshape(bias_c, {1, n}));
    return out;
  }
  trace::Scope range(trace::Kind::Op, op, a.device(), {&out, &a, &b});
  if (a.device().is_cuda()) {
#if KILN_WITH_CUDA
    cuda::fp8_gemm(out, a, b, a_scale_inv, b_scale_inv, bias_c, accumulate_into != nullptr, fast_accumulation);
#else
    KILN_FAIL(op, ": kiln was built without CUDA");
#endif
  } else {
    cpu::fp8_gemm(out, a, b, a_scale_inv, b_scale_inv, bias_c, accumulate_into != nullptr);
  }
  out.impl().storage()->bump_version();
  return out;
}

void fp8_update_scales(const Tensor& amax_history, const Tensor& scale, const Tensor& scale_inv,
                       const Tensor& scaled_max, bool most_recent, const Tensor& scale_copy,
                       const Tensor& scale_inv_copy) {
  constexpr std::string_view op = "fp8_update_scales";
  KILN_CHECK(amax_history.defined(), op, ": amax_history is an undefined tensor; pass the scaling state's (L, N) ",
             "float32 history");
  KILN_CHECK(amax_history.dtype() == DType::Float32 && amax_history.dim() == 2 && amax_history.size(0) >= 1, op,
             ": amax_history must be a float32 (L, N) tensor with L >= 1, got ", amax_history.dtype(), " of shape ",
             amax_history.shape());
  KILN_CHECK(amax_history.is_contiguous(), op, ": amax_history of shape ", amax_history.shape(), " with strides ",
             amax_history.strides(), " is not contiguous; it is updated in place, so pass the scaling state's own ",
             "(contiguous) history");
  const int64_t n = amax_history.size(1);
  const Device device = amax_history.device();
  // scale, scale_inv and scaled_max: (N) float32 on the history's device.
  const std::pair<std::string_view, const Tensor*> vectors[] = {
      {"scale", &scale}, {"scale_inv", &scale_inv}, {"scaled_max", &scaled_max}};
  for (const auto& [what, t] : vectors) {
    KILN_CHECK(t->defined(), op, ": ", what, " is an undefined tensor; pass a (", n,
               ") float32 tensor, one value per column of amax_history");
    KILN_CHECK(t->dtype() == DType::Float32 && t->dim() == 1 && t->size(0) == n, op, ": ", what, " must be a float32 (",
               n, ") tensor, one value per column of amax_history ", amax_history.shape(), ", got ", t->dtype(),
               " of shape ", t->shape());
    KILN_CHECK(t->device() == device, op, ": ", what, " is on ", t->device(), " but amax_history is on ", device,
               "; keep the whole scaling state on one device");
    KILN_CHECK(t->is_contiguous(), op, ": ", what, " of shape ", t->shape(), " with strides ", t->strides(),
               " is not contiguous; it is updated in place, so pass the scaling state's own (contiguous) tensors");
  }
  // The copies: (N) float32 on the device, any stride, not overlapping the state (they are written in the same pass).
  const std::pair<std::string_view, const Tensor*> copies[] = {{"scale_copy", &scale_copy},
                                                               {"scale_inv_copy", &scale_inv_copy}};
  for (const auto& [what, t] : copies) {
    if (!t->defined()) continue;
    KILN_CHECK(t->dtype() == DType::Float32 && t->dim() == 1 && t->size(0) == n, op, ": ", what, " must be a float32 (",
               n, ") tensor, one value per column of amax_history ", amax_history.shape(), ", got ", t->dtype(),
               " of shape ", t->shape());
    KILN_CHECK(t->device() == device, op, ": ", what, " is on ", t->device(), " but amax_history is on ", device);
    for (const Tensor* state : {&amax_history, &scale, &scale_inv, &scaled_max}) {
      KILN_CHECK(t->impl().storage() != state->impl().storage(), op, ": ", what,
                 " shares memory with the scaling state; pass a tensor of its own to copy into");
    }
  }
  if (n == 0) return;  // no tracked tensors: nothing to update
  trace::Scope range(trace::Kind::Op, op, device, {&amax_history, &scale, &scale_inv, &scaled_max});
  if (device.is_cuda()) {
#if KILN_WITH_CUDA
    cuda::fp8_update_scales(amax_history, scale, scale_inv, scaled_max, most_recent, scale_copy, scale_inv_copy);
#else
    KILN_FAIL(op, ": kiln was built without CUDA");
#endif
  } else {
    cpu::fp8_update_scales(amax_history, scale, scale_inv, scaled_max, most_recent, scale_copy, scale_inv_copy);
  }
  amax_history.impl().storage()->bump_version();
  scale.impl().storage()->bump_version();
  scale_inv.impl().storage()->bump_version();
  for (const Tensor* t : {&scale_copy, &scale_inv_copy}) {
    if (t->defined()) t->impl().storage()->bump_version();
  }
}

}  // namespace kiln::internal
