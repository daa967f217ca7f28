// Copying and casting: copy_, to, cast, contiguous, clone, fill_.
#include "kiln/tensor/backend.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::internal {
namespace {

void check_defined(const Tensor& t, std::string_view op, std::string_view what) {
  KILN_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

// Whether two tensors' memory overlaps in a way an elementwise copy cannot survive.
bool may_overlap(const Tensor& a, const Tensor& b) {
  if (!a.is_alias_of(b) || a.numel() == 0 || b.numel() == 0) return false;
  auto extent = [](const Tensor& t) {
    int64_t last = t.offset();
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    return std::pair<int64_t, int64_t>{t.offset(), last};
  };
  auto [a0, a1] = extent(a);
  auto [b0, b1] = extent(b);
  return a0 <= b1 && b0 <= a1;
}

// An output must not have two elements at one address (an expanded tensor, say).
void check_no_internal_overlap(const Tensor& t, std::string_view op) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    KILN_CHECK(t.stride(d) != 0 || t.size(d) <= 1, op, ": the destination has several elements at one memory ",
               "location (stride 0 in dim ", d, ", shape ", t.shape(),
               ", e.g. from expand()); write into a "
               "contiguous tensor instead (call .contiguous() or .clone() first)");
  }
}

}  // namespace

Tensor& copy_(Tensor& dst, const Tensor& src, bool non_blocking) {
  check_defined(dst, "copy_", "the destination");
  check_defined(src, "copy_", "the source");
  KILN_CHECK(broadcast_shapes(dst.shape(), src.shape(), "copy_") == dst.shape(), "copy_: source of shape ", src.shape(),
             " cannot be broadcast to the destination's shape ", dst.shape());
  check_no_internal_overlap(dst, "copy_");
  if (dst.numel() == 0 || dst.is_same(src)) return dst;
  Tensor source = expand(src, dst.shape());
  if (may_overlap(dst, source) && !(dst.offset() == source.offset() && dst.strides() == source.strides())) {
    source = clone(source, MemoryFormat::Contiguous);  // partial overlap: copy through a temporary
  }
  // Host <-> device copies are done by the device's backend; same-device copies by that device's.
  const Device dev = dst.is_cpu() ? source.device() : dst.device();
  KILN_CHECK(dst.is_cpu() || source.is_cpu() || dst.device().type() == source.device().type(),
             "copy_: cannot copy from ", source.device(), " to ", dst.device());
  backend(dev).copy(dst, source, non_blocking);
  dst.impl().storage()->bump_version();
  return dst;
}

Tensor to(const Tensor& t, Device device, std::optional<DType> dtype, bool non_blocking) {
  check_defined(t, "to", "the tensor");
  const DType target = dtype.value_or(t.dtype());
  if (t.device() == device && t.dtype() == target) return t;
  Tensor out = empty(t.shape(), {.dtype = target, .device = device, .memory_format = t.suggest_memory_format()});
  copy_(out, t, non_blocking);
  return out;
}

Tensor cast(const Tensor& t, DType dtype) { return to(t, t.device(), dtype); }

Tensor contiguous(const Tensor& t, MemoryFormat format) {
  check_defined(t, "contiguous", "the tensor");
  if (format == MemoryFormat::Preserve) format = t.suggest_memory_format();
  if (t.is_contiguous(format)) return t;
  return clone(t, format);
}

Tensor clone(const Tensor& t, MemoryFormat format) {
  check_defined(t, "clone", "the tensor");
  Tensor out = empty_like(t, {}, format);
  copy_(out, t);
  return out;
}

bool is_pinned(const Tensor& t) {
  check_defined(t, "is_pinned", "the tensor");
  const Allocator* pinned = pinned_host_allocator();
  return pinned != nullptr && t.impl().storage()->allocator() == pinned;
}

Tensor pin_memory(const Tensor& t) {
  check_defined(t, "pin_memory", "the tensor");
  KILN_CHECK(t.is_cpu(), "pin_memory: only CPU tensors can be pinned; this one is on ", t.device());
  if (is_pinned(t)) return t;
  Tensor out =
      empty(t.shape(), {.dtype = t.dtype(), .memory_format = t.suggest_memory_format(), .pinned_memory = true});
  copy_(out, t);
  return out;
}

Tensor& fill_(Tensor& t, Scalar value) {
  check_defined(t, "fill_", "the tensor");
  check_no_internal_overlap(t, "fill_");
  if (t.numel() > 0) backend(t.device()).fill(t, value);
  t.impl().storage()->bump_version();
  return t;
}

}  // namespace kiln::internal
