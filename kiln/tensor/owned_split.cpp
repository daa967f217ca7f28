// internal::split_owned (owned_split.h).
#include "kiln/tensor/owned_split.h"

#include <memory>
#include <utility>

#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::internal {

std::vector<Tensor> split_owned(Tensor t, const std::vector<int64_t>& rows) {
  KILN_CHECK(t.defined() && t.dim() >= 1, "split_owned: expected a tensor of at least one dimension");
  int64_t total = 0;
  for (int64_t r : rows) {
    KILN_CHECK(r >= 0, "split_owned: a piece of ", r, " rows");
    total += r;
  }
  KILN_CHECK(total == t.size(0), "split_owned: pieces of ", total, " rows in all from a tensor of ", t.size(0),
             " rows");
  std::vector<Tensor> pieces;
  pieces.reserve(rows.size());
  const std::shared_ptr<Storage> storage = t.impl().storage();
  // t's reference and `storage` above: nothing else holds either (t may be a view of memory nothing else sees).
  const bool owned = t.impl_ptr().use_count() == 1 && storage != nullptr && storage.use_count() == 2 &&
                     t.is_contiguous() && t.nbytes() > 0;
  if (!owned) {
    int64_t start = 0;
    for (int64_t r : rows) {
      pieces.push_back(narrow(t, 0, start, r));
      start += r;
    }
    return pieces;
  }
  const int64_t row_bytes = t.nbytes() / t.size(0);
  char* base = static_cast<char*>(t.data_ptr());
  Shape shape = t.shape();
  const Strides strides = t.strides();
  const DType dtype = t.dtype();
  const Device device = t.device();
  int64_t start = 0;
  for (int64_t r : rows) {
    shape[0] = r;
    // Each piece's Storage keeps the whole allocation alive (its deleter holds it) and covers its own rows only.
    auto piece = std::make_shared<Storage>(base + start * row_bytes, static_cast<size_t>(r * row_bytes), device,
                                           [keep = storage](void*) {});
    pieces.emplace_back(std::make_shared<TensorImpl>(std::move(piece), dtype, shape, strides, 0));
    start += r;
  }
  return pieces;
}

}  // namespace kiln::internal
