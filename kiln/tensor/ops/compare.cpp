// Comparison helpers built on the elementwise ops: isclose, allclose, equal.
#include "kiln/tensor/internal_ops.h"

namespace kiln::internal {
namespace {

// Whether every element of a Bool tensor is true. Reads the mask on the host, which keeps these helpers
// independent of the reduction kernels; they answer a host bool anyway, so they synchronise regardless.
bool all_true(const Tensor& mask) {
  for (uint8_t v : to(mask, Device::cpu(), DType::UInt8).to_vector<uint8_t>())
    if (v == 0) return false;
  return true;
}

void check_pair(std::string_view op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.defined() && b.defined(), op, ": an argument is an undefined tensor");
  KILN_CHECK(a.device() == b.device(), op, ": expected both tensors on one device, got ", a.device(), " and ",
             b.device(), "; move them to one device with .to(device) first");
}

}  // namespace

Tensor isclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  check_pair("isclose", a, b);
  check_not_float8("isclose", a.dtype());
  KILN_CHECK(a.dtype() == b.dtype(), "isclose: expected both tensors to have the same dtype, got ", a.dtype(), " and ",
             b.dtype(), "; convert one with .to(dtype) first");
  KILN_CHECK(rtol >= 0 && atol >= 0, "isclose: rtol and atol must be non-negative, got rtol ", rtol, " and atol ",
             atol);
  broadcast_shapes(a.shape(), b.shape(), "isclose");
  // Equal values are close (infinities included); otherwise |a - b| <= atol + rtol * |b| with a finite
  // difference, computed in a floating dtype (float64 for integers, so large ones stay exact enough).
  Tensor close = eq(a, b);
  if (a.dtype() == DType::Bool) return close;
  const DType ft = a.is_floating_point() ? a.dtype() : DType::Float64;
  const Tensor x = to(a, a.device(), ft), y = to(b, b.device(), ft);
  const Tensor diff = abs(sub(x, y));
  const Tensor allowed = add(mul(abs(y), rtol), atol);
  close = logical_or(close, logical_and(isfinite(diff), le(diff, allowed)));
  if (equal_nan && a.is_floating_point()) close = logical_or(close, logical_and(isnan(x), isnan(y)));
  return close;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  return all_true(isclose(a, b, rtol, atol, equal_nan));
}

bool equal(const Tensor& a, const Tensor& b) {
  check_pair("equal", a, b);
  if (a.shape() != b.shape()) return false;
  auto category = [](DType t) { return t == DType::Bool ? 0 : is_integral(t) ? 1 : 2; };
  if (category(a.dtype()) != category(b.dtype())) return false;
  if (a.numel() == 0) return true;
  if (is_float8(a.dtype()) || is_float8(b.dtype())) {
    // float8 values widen exactly to float32, where they compare as numbers (NaN unequal, -0 == +0).
    auto widen = [](const Tensor& t) { return is_float8(t.dtype()) ? to(t, t.device(), DType::Float32) : t; };
    return all_true(eq(widen(a), widen(b)));
  }
  return all_true(eq(a, b));
}

}  // namespace kiln::internal
