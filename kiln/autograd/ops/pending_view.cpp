// Not differentiable yet: these forward to the raw ops and record nothing. Each moves into its
// family's file (forward and backward side by side) as it gains a gradient; this file then goes.
#include "kiln/autograd/functions.h"

namespace kiln {

Tensor& copy_(Tensor& dst, const Tensor& src, bool non_blocking) { return ops::copy_(dst, src, non_blocking); }
Tensor to(const Tensor& t, Device device, std::optional<DType> dtype, bool non_blocking) { return ops::to(t, device, dtype, non_blocking); }
Tensor cast(const Tensor& t, DType dtype) { return ops::cast(t, dtype); }
Tensor contiguous(const Tensor& t, MemoryFormat format) { return ops::contiguous(t, format); }
Tensor clone(const Tensor& t, MemoryFormat format) { return ops::clone(t, format); }
Tensor view(const Tensor& t, const Shape& shape) { return ops::view(t, shape); }
Tensor reshape(const Tensor& t, const Shape& shape) { return ops::reshape(t, shape); }
Tensor permute(const Tensor& t, const Dims& dims) { return ops::permute(t, dims); }
Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1) { return ops::transpose(t, dim0, dim1); }
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) { return ops::narrow(t, dim, start, length); }
Tensor slice(const Tensor& t, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) { return ops::slice(t, dim, start, end, step); }
Tensor select(const Tensor& t, int64_t dim, int64_t index) { return ops::select(t, dim, index); }
Tensor expand(const Tensor& t, const Shape& shape) { return ops::expand(t, shape); }
Tensor squeeze(const Tensor& t) { return ops::squeeze(t); }
Tensor squeeze(const Tensor& t, int64_t dim) { return ops::squeeze(t, dim); }
Tensor unsqueeze(const Tensor& t, int64_t dim) { return ops::unsqueeze(t, dim); }
Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) { return ops::flatten(t, start_dim, end_dim); }
Tensor unflatten(const Tensor& t, int64_t dim, const Shape& sizes) { return ops::unflatten(t, dim, sizes); }
Tensor as_strided(const Tensor& t, const Shape& sizes, const Strides& strides, std::optional<int64_t> offset) { return ops::as_strided(t, sizes, strides, offset); }
Tensor diagonal(const Tensor& t, int64_t offset, int64_t dim1, int64_t dim2) { return ops::diagonal(t, offset, dim1, dim2); }
std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim) { return ops::split(t, split_size, dim); }
std::vector<Tensor> split_with_sizes(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim) { return ops::split_with_sizes(t, sizes, dim); }
std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim) { return ops::chunk(t, chunks, dim); }
std::vector<Tensor> unbind(const Tensor& t, int64_t dim) { return ops::unbind(t, dim); }
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) { return ops::index_select(a, dim, index); }
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) { return ops::gather(a, dim, index); }
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) { return ops::scatter(a, dim, index, src); }
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, Scalar value) { return ops::scatter(a, dim, index, value); }
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) { return ops::scatter_add(a, dim, index, src); }
Tensor& scatter_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) { return ops::scatter_(a, dim, index, src); }
Tensor& scatter_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) { return ops::scatter_add_(a, dim, index, src); }
Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) { return ops::index_add(a, dim, index, src); }
Tensor masked_select(const Tensor& a, const Tensor& mask) { return ops::masked_select(a, mask); }
Tensor embedding(const Tensor& weight, const Tensor& index) { return ops::embedding(weight, index); }
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) { return ops::cat(tensors, dim); }
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) { return ops::stack(tensors, dim); }
std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim, bool descending, bool stable) { return ops::sort(a, dim, descending, stable); }
std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) { return ops::topk(a, k, dim, largest, sorted); }
Tensor tril(const Tensor& a, int64_t diagonal) { return ops::tril(a, diagonal); }
Tensor triu(const Tensor& a, int64_t diagonal) { return ops::triu(a, diagonal); }

}  // namespace kiln
