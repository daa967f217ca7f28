// Factories: new tensors of a shape, dtype, device and memory format.
#include <cmath>
#include <cstring>

#include "kiln/tensor/backend.h"
#include "kiln/tensor/capture.h"
#include "kiln/tensor/checked_size.h"
#include "kiln/tensor/dispatch.h"
#include "kiln/tensor/internal_ops.h"
#include "kiln/tensor/small_alloc.h"

namespace kiln::internal {
namespace {

// Refuses negative sizes and shapes of more than 2^63-1 elements, naming the op (numel() does both).
void check_shape(const Shape& shape, std::string_view op) { (void)numel(shape, op); }

// Strides for a memory format: NHWC order for ChannelsLast (4-D only).
Strides strides_for(const Shape& shape, MemoryFormat format, std::string_view op) {
  if (format != MemoryFormat::ChannelsLast) return contiguous_strides(shape);
  KILN_CHECK(shape.size() == 4, op, ": MemoryFormat::ChannelsLast needs a 4-D (N, C, H, W) shape, got ", shape);
  const int64_t c = std::max<int64_t>(shape[1], 1), h = std::max<int64_t>(shape[2], 1),
                w = std::max<int64_t>(shape[3], 1);
  return {h * w * c, 1, w * c, c};
}

Allocator& allocator_for(const TensorOptions& options, std::string_view op) {
  if (options.pinned_memory) {
    KILN_CHECK(options.device.is_cpu(), op, ": pinned_memory is page-locked host memory, but device ", options.device,
               " was asked for; use device cpu with pinned_memory, then .to(cuda, true)");
    Allocator* pinned = pinned_host_allocator();
    KILN_CHECK(pinned != nullptr, op,
               ": pinned host memory needs a GPU and kiln's CUDA backend, and neither is "
               "available here; leave pinned_memory false on machines without a GPU");
    return *pinned;
  }
  Backend& b = backend(options.device);
  KILN_CHECK(options.device.index() < b.device_count(), op, ": device ", options.device,
             " is not available: ", b.device_count(),
             " CUDA device(s) are visible; check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES, "
             "or keep tensors on Device::cpu()");
  return b.allocator(options.device.index());
}

// The one place host and device tensors get storage: every size here is checked, so a shape of absurd size is
// an error naming the op and the shape, never a wrapped product that allocates too little.
Tensor empty_strided_for(const Shape& shape, const Strides& strides, const TensorOptions& options,
                         std::string_view op) {
  const int64_t n = numel(shape, op);  // refuses negative sizes and more than 2^63-1 elements
  KILN_CHECK(shape.size() == strides.size(), op, ": shape ", shape, " and strides ", strides,
             " have different lengths");
  const DType dtype = options.dtype.value_or(kDefaultFloat);
  int64_t extent = n == 0 ? 0 : 1;  // elements from the first to one past the last
  for (size_t i = 0; i < shape.size() && extent > 0; ++i) {
    KILN_CHECK(strides[i] >= 0, op, ": negative stride in ", strides);
    int64_t span = 0;
    KILN_CHECK(!mul_overflows(shape[i] - 1, strides[i], &span) && !add_overflows(extent, span, &extent), op, ": shape ",
               shape, " with strides ", strides, " spans more than 2^63-1 elements");
  }
  int64_t nbytes = 0;
  KILN_CHECK(!mul_overflows(extent, static_cast<int64_t>(element_size(dtype)), &nbytes), op, ": shape ", shape, " of ",
             dtype, " needs more than 2^63-1 bytes");
  auto storage = make_pooled<Storage>(static_cast<size_t>(nbytes), allocator_for(options, op));
  return Tensor(make_pooled<TensorImpl>(std::move(storage), dtype, shape, strides, 0));
}

Tensor empty_for(const Shape& shape, const TensorOptions& options, std::string_view op) {
  check_shape(shape, op);
  return empty_strided_for(shape, strides_for(shape, options.memory_format, op), options, op);
}

}  // namespace

Tensor empty_strided(const Shape& shape, const Strides& strides, const TensorOptions& options) {
  return empty_strided_for(shape, strides, options, "empty_strided");
}

Tensor empty(const Shape& shape, const TensorOptions& options) { return empty_for(shape, options, "empty"); }

// zeros, ones and full record as "full" (shape, value); the _like forms as "full_like" (value), their input the
// tensor whose shape they take; arange as "arange" (start, end, step). The dtype is the result's.
Tensor zeros(const Shape& shape, const TensorOptions& options) {
  capture::Op cap("full");
  Tensor t = empty_for(shape, options, "zeros");
  return cap.done(fill_(t, 0), [&] { return capture::Args{{}, {{"shape", shape}, {"value", int64_t{0}}}}; });
}

Tensor ones(const Shape& shape, const TensorOptions& options) {
  capture::Op cap("full");
  Tensor t = empty_for(shape, options, "ones");
  return cap.done(fill_(t, 1), [&] { return capture::Args{{}, {{"shape", shape}, {"value", int64_t{1}}}}; });
}

Tensor full(const Shape& shape, Scalar value, const TensorOptions& options) {
  capture::Op cap("full");
  TensorOptions o = options;
  if (!o.dtype) o.dtype = value.natural_dtype();
  Tensor t = empty_for(shape, o, "full");
  return cap.done(fill_(t, value), [&] {
    return capture::Args{{}, {{"shape", shape}, {"value", capture::scalar_value(value)}}};
  });
}

Tensor empty_like(const Tensor& t, std::optional<DType> dtype, MemoryFormat format) {
  KILN_CHECK(t.defined(), "empty_like: the tensor is undefined");
  if (format == MemoryFormat::Preserve) format = t.suggest_memory_format();
  return empty(t.shape(), {.dtype = dtype.value_or(t.dtype()), .device = t.device(), .memory_format = format});
}

Tensor zeros_like(const Tensor& t, std::optional<DType> dtype) { return full_like(t, 0, dtype); }

Tensor ones_like(const Tensor& t, std::optional<DType> dtype) { return full_like(t, 1, dtype); }

Tensor full_like(const Tensor& t, Scalar value, std::optional<DType> dtype) {
  capture::Op cap("full_like");
  Tensor out = empty_like(t, dtype);
  return cap.done(fill_(out, value), [&] { return capture::Args{{t}, {{"value", capture::scalar_value(value)}}}; });
}

Tensor arange(Scalar end, const TensorOptions& options) { return arange(0, end, 1, options); }

Tensor arange(Scalar start, Scalar end, Scalar step, const TensorOptions& options) {
  capture::Op cap("arange");
  const bool all_integral = !start.is_floating_point() && !end.is_floating_point() && !step.is_floating_point();
  TensorOptions o = options;
  if (!o.dtype) o.dtype = all_integral ? DType::Int64 : kDefaultFloat;
  KILN_CHECK(*o.dtype != DType::Bool, "arange: bool is not a valid dtype for a range");
  check_not_float8("arange", *o.dtype);
  int64_t n;
  if (all_integral) {
    const int64_t a = start.to_int64(), b = end.to_int64(), s = step.to_int64();
    KILN_CHECK(s != 0, "arange: step must be nonzero");
    KILN_CHECK((s > 0 && b >= a) || (s < 0 && b <= a), "arange: the range [", a, ", ", b,
               ") cannot be walked with step ", s, "; upper bound and step must have the same sign");
    n = s > 0 ? (b - a + s - 1) / s : (a - b - s - 1) / (-s);
  } else {
    const double a = start.to_double(), b = end.to_double(), s = step.to_double();
    KILN_CHECK(std::isfinite(a) && std::isfinite(b), "arange: start and end must be finite, got ", a, " and ", b);
    KILN_CHECK(s != 0, "arange: step must be nonzero");
    KILN_CHECK((s > 0 && b >= a) || (s < 0 && b <= a), "arange: the range [", a, ", ", b,
               ") cannot be walked with step ", s, "; upper bound and step must have the same sign");
    const double count = std::ceil((b - a) / s);
    KILN_CHECK(count < 9.2e18, "arange: the range [", a, ", ", b, ") with step ", s, " has ", count,
               " elements, more than a tensor can hold; check start, end and step");
    n = static_cast<int64_t>(count);
  }
  Tensor t = empty({n}, o);
  if (n > 0) backend(t.device()).arange(t, start, step);
  return cap.done(t, [&] {
    return capture::Args{{},
                         {{"start", capture::scalar_value(start)},
                          {"end", capture::scalar_value(end)},
                          {"step", capture::scalar_value(step)}}};
  });
}

Tensor linspace(double start, double end, int64_t steps, const TensorOptions& options) {
  KILN_CHECK(steps >= 0, "linspace: number of steps must be non-negative, got ", steps);
  if (options.dtype) check_not_float8("linspace", *options.dtype);
  Tensor t = empty({steps}, options);
  if (steps == 1) fill_(t, start);
  if (steps >= 2) backend(t.device()).linspace(t, start, end);
  return t;
}

Tensor eye(int64_t n, std::optional<int64_t> m, const TensorOptions& options) {
  const int64_t cols = m.value_or(n);
  KILN_CHECK(n >= 0 && cols >= 0, "eye: sizes must be non-negative, got ", n, " x ", cols);
  Tensor t = zeros({n, cols}, options);
  const int64_t k = std::min(n, cols);
  if (k > 0) {
    Tensor diag = as_strided(t, {k}, {cols + 1}, 0);
    fill_(diag, 1);
  }
  return t;
}

Tensor from_blob(const void* data, const Shape& shape, DType dtype, Device device) {
  check_shape(shape, "from_blob");
  Tensor host = empty_for(shape, {.dtype = dtype}, "from_blob");
  if (host.numel() > 0) {
    KILN_CHECK(data != nullptr, "from_blob: null data pointer for ", host.numel(), " elements");
    std::memcpy(host.data_ptr(), data, host.nbytes());
  }
  return device.is_cpu() ? host : to(host, device);
}

template <typename T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape, Device device) {
  check_shape(shape, "from_vector");
  KILN_CHECK(static_cast<int64_t>(data.size()) == numel(shape, "from_vector"), "from_vector: ", data.size(),
             " values cannot fill shape ", shape, " (", numel(shape), " elements)");
  if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> is packed: copy element by element
    Tensor host = empty(shape, {.dtype = DType::Bool});
    bool* p = host.data_ptr<bool>();
    for (size_t i = 0; i < data.size(); ++i) p[i] = data[i];
    return device.is_cpu() ? host : to(host, device);
  } else {
    return from_blob(data.data(), shape, dtype_of<T>(), device);
  }
}
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&, Device);
template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, Device);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, Device);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, Device);
template Tensor from_vector<Half>(const std::vector<Half>&, const Shape&, Device);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&, Device);
template Tensor from_vector<float>(const std::vector<float>&, const Shape&, Device);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, Device);
template Tensor from_vector<Float8_e4m3fn>(const std::vector<Float8_e4m3fn>&, const Shape&, Device);
template Tensor from_vector<Float8_e5m2>(const std::vector<Float8_e5m2>&, const Shape&, Device);

Tensor scalar_tensor(Scalar value, const TensorOptions& options) { return full({}, value, options); }

}  // namespace kiln::internal
