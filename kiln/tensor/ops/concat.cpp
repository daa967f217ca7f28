// Frontend of cat and stack (declared with the indexing ops in ops.h): checks, dtype promotion across
// the inputs, one output allocation, then one copy_ per input into its slice of the output.
#include <string>
#include <vector>

#include "kiln/tensor/internal_ops.h"
#include "kiln/tensor/ops/index_checks.h"

namespace kiln::internal {
namespace {

// PyTorch still accepts 1-D empty tensors (shape [0]) beside tensors of any rank and skips them.
bool is_legacy_empty(const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; }

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  const Tensor* ref = nullptr;  // the first tensor that is not skipped; sets rank and sizes
  size_t ref_i = 0;
  DType dtype = DType::Bool;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined(), "cat: tensor ", i, " is undefined");
    KILN_CHECK(t.dim() > 0, "cat: tensor ", i, " is 0-d and cannot be concatenated; unsqueeze(0) it or use stack()");
    KILN_CHECK(t.device() == tensors[0].device(), "cat: expected all tensors on one device, but tensor 0 is on ",
               tensors[0].device(), " and tensor ", i, " on ", t.device());
    dtype = i == 0 ? t.dtype() : promote_types(dtype, t.dtype());
    if (!ref && !is_legacy_empty(t)) {
      ref = &t;
      ref_i = i;
    }
  }
  const TensorOptions options{.dtype = dtype, .device = tensors[0].device()};
  if (!ref) return empty({0}, options);

  const int64_t rank = ref->dim();
  const int64_t d = wrap_dim(dim, rank, "cat");
  Shape shape = ref->shape();
  shape[d] = 0;
  bool channels_last = rank == 4;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (is_legacy_empty(t)) continue;
    KILN_CHECK(t.dim() == rank, "cat: all tensors must have the same rank, but tensor ", ref_i, " has shape ",
               ref->shape(), " and tensor ", i, " has shape ", t.shape());
    for (int64_t j = 0; j < rank; ++j) {
      KILN_CHECK(j == d || t.size(j) == ref->size(j), "cat: sizes must match except in dim ", d, ", but tensor ", ref_i,
                 " has shape ", ref->shape(), " and tensor ", i, " has shape ", t.shape(), " (dim ", j, ": ",
                 ref->size(j), " != ", t.size(j), ")");
    }
    shape[d] += t.size(d);
    channels_last = channels_last && t.suggest_memory_format() == MemoryFormat::ChannelsLast;
  }
  TensorOptions out_options = options;
  if (channels_last) out_options.memory_format = MemoryFormat::ChannelsLast;
  Tensor out = empty(shape, out_options);
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (is_legacy_empty(t) || t.size(d) == 0) continue;
    Tensor part = narrow(out, d, offset, t.size(d));
    copy_(part, t);  // converts to the promoted dtype
    offset += t.size(d);
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  check_defined("stack", tensors[0], "tensor 0");
  const int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    KILN_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    KILN_CHECK(tensors[i].shape() == tensors[0].shape(),
               "stack: all tensors must have the same shape, but tensor 0 has ", "shape ", tensors[0].shape(),
               " and tensor ", i, " has shape ", tensors[i].shape());
    parts.push_back(unsqueeze(tensors[i], d));
  }
  return cat(parts, d);
}

}  // namespace kiln::internal
