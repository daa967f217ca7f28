// Finding the backend of a device type.
#include "kiln/tensor/backend.h"

#include <iterator>  // std::size

#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/trace.h"
#include "kiln/tensor/trace_backend.h"
#if defined(KILN_WITH_CUDA)
#include "kiln/tensor/cuda.h"  // cuda::is_available
#endif

namespace kiln {

#if defined(KILN_WITH_CUDA)
namespace cuda {
Backend& backend_instance();    // tensor/cuda/device.cpp
Allocator& pinned_allocator();  // tensor/cuda/pinned_allocator.cpp
}  // namespace cuda
#endif

namespace {
// Entry i of an op table's names (the rows' name column, in the enum's order); "?" past the end.
template <size_t N>
std::string_view name_at(const std::string_view (&names)[N], size_t i) {
  return i < N ? names[i] : std::string_view("?");
}
}  // namespace

#define KILN_X(Enum, name, ...) #name,
std::string_view unary_op_name(UnaryOp op) {
  static constexpr std::string_view kNames[] = {KILN_UNARY_OPS(KILN_X) KILN_UNARY_PREDICATES(KILN_X)
                                                    KILN_UNARY_OTHER(KILN_X)};
  return name_at(kNames, static_cast<size_t>(op));
}
std::string_view binary_op_name(BinaryOp op) {
  static constexpr std::string_view kNames[] = {KILN_BINARY_OPS(KILN_X) KILN_BINARY_PREDICATES(KILN_X)
                                                    KILN_BINARY_OTHER(KILN_X)};
  return name_at(kNames, static_cast<size_t>(op));
}
#undef KILN_X

Backend& detail::backend_untraced(DeviceType type) {
  if (type == DeviceType::CPU) return cpu::cpu_backend();
#if defined(KILN_WITH_CUDA)
  return cuda::backend_instance();
#else
  KILN_FAIL(
      "this build of kiln has no CUDA backend (it was configured with KILN_CUDA=OFF or without a CUDA "
      "toolkit); keep tensors on Device::cpu(), or rebuild with -DKILN_CUDA=ON");
#endif
}

Backend& backend(DeviceType type) {
  Backend& b = detail::backend_untraced(type);
  return trace::active() ? detail::tracing_backend(b) : b;
}

namespace {
thread_local detail::IndexOpName t_index_op;
}  // namespace

void detail::IndexOpScope::open(const IndexOpName& name) {
  previous_ = t_index_op;
  if (t_index_op.empty()) t_index_op = name;  // an outer scope (a module's label) keeps its name
}
detail::IndexOpScope::IndexOpScope(std::string_view op) { open({.text = op}); }
detail::IndexOpScope::IndexOpScope(std::string (*make)(const void*), const void* arg) {
  open({.make = make, .arg = arg});
}
detail::IndexOpScope::~IndexOpScope() { t_index_op = previous_; }
detail::IndexOpName detail::IndexOpScope::current_name() { return t_index_op; }

Allocator* pinned_host_allocator() {
#if defined(KILN_WITH_CUDA)
  if (cuda::is_available()) return &cuda::pinned_allocator();
#endif
  return nullptr;
}

}  // namespace kiln
