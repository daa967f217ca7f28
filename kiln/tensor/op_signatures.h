// kiln/tensor/op_signatures.h — the signatures kiln:: and kiln::internal share, each written once.
//
// The differentiable ops exist twice: kiln::name records a gradient (autograd/functions.h), internal::name is the
// raw op it calls (internal_ops.h). Both headers expand the lists below in their namespace, so the two always take
// the same arguments with the same defaults. The binary ops have theirs in binary_ops.h (KILN_BINARY_DECLARE_ALL)
// and the unary ones in unary_ops.h (KILN_UNARY_DECLARE_ALL). Ops that exist only in kiln::internal (pin_memory,
// argmax, addmm_, nonzero, ...) are declared in internal_ops.h alone; those without a gradient are brought into
// kiln with `using`.
//
// Dims is std::vector<int64_t> in both namespaces.
#pragma once

// clang-format off
// ---------------------------------------------------------------- copy and cast (copy.cpp, autograd/ops/copy.cpp)
#define KILN_COPY_DECLARE_ALL()                                                                             \
  Tensor& copy_(Tensor& dst, const Tensor& src, bool non_blocking = false);                                 \
  Tensor to(const Tensor& t, Device device, std::optional<DType> dtype = {}, bool non_blocking = false);    \
  Tensor cast(const Tensor& t, DType dtype);                                                                \
  Tensor contiguous(const Tensor& t, MemoryFormat format = MemoryFormat::Contiguous);                       \
  Tensor clone(const Tensor& t, MemoryFormat format = MemoryFormat::Preserve);                              \
  Tensor& fill_(Tensor& t, Scalar value);

// ---------------------------------------------------------------- views (view.cpp, autograd/ops/view.cpp)
#define KILN_VIEW_DECLARE_ALL()                                                                                      \
  Tensor view(const Tensor& t, const Shape& shape);                                                                  \
  Tensor reshape(const Tensor& t, const Shape& shape);                                                               \
  Tensor permute(const Tensor& t, const Dims& dims);                                                                 \
  Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1);                                                     \
  Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);                                        \
  Tensor slice(const Tensor& t, int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end,               \
               int64_t step = 1);                                                                                    \
  Tensor select(const Tensor& t, int64_t dim, int64_t index);                                                        \
  Tensor expand(const Tensor& t, const Shape& shape);                                                                \
  Tensor squeeze(const Tensor& t);                                                                                   \
  Tensor squeeze(const Tensor& t, int64_t dim);                                                                      \
  Tensor unsqueeze(const Tensor& t, int64_t dim);                                                                    \
  Tensor flatten(const Tensor& t, int64_t start_dim = 0, int64_t end_dim = -1);                                      \
  Tensor unflatten(const Tensor& t, int64_t dim, const Shape& sizes);                                                \
  Tensor as_strided(const Tensor& t, const Shape& sizes, const Strides& strides, std::optional<int64_t> offset = {}); \
  Tensor diagonal(const Tensor& t, int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1);                          \
  std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim = 0);                                   \
  std::vector<Tensor> split_with_sizes(const Tensor& t, const std::vector<int64_t>& sizes, int64_t dim = 0);         \
  std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim = 0);                                       \
  std::vector<Tensor> unbind(const Tensor& t, int64_t dim = 0);

// ---------------------------------------------------------------- reductions (reduce.cpp; autograd/ops/reduce.cpp,
// softmax.cpp). `dims` empty means all dims. Integer and bool sums give Int64, as in PyTorch.
#define KILN_REDUCE_DECLARE_ALL()                                                                                    \
  Tensor sum(const Tensor& a, const Dims& dims = {}, bool keepdim = false, std::optional<DType> dtype = {});         \
  Tensor mean(const Tensor& a, const Dims& dims = {}, bool keepdim = false);                                         \
  Tensor prod(const Tensor& a, const Dims& dims = {}, bool keepdim = false);                                         \
  Tensor amax(const Tensor& a, const Dims& dims = {}, bool keepdim = false);                                         \
  Tensor amin(const Tensor& a, const Dims& dims = {}, bool keepdim = false);                                         \
  Tensor max(const Tensor& a); /* over all elements, 0-d */                                                          \
  Tensor min(const Tensor& a);                                                                                       \
  std::tuple<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false); /* values, Int64 indices */    \
  std::tuple<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim = false);                                \
  Tensor var(const Tensor& a, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false);                  \
  Tensor std(const Tensor& a, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false);                  \
  std::tuple<Tensor, Tensor> var_mean(const Tensor& a, const Dims& dims = {}, int64_t correction = 1,                \
                                      bool keepdim = false);                                                         \
  Tensor norm(const Tensor& a, double p = 2, const Dims& dims = {}, bool keepdim = false); /* p may be INFINITY */   \
  Tensor logsumexp(const Tensor& a, const Dims& dims, bool keepdim = false);                                         \
  Tensor softmax(const Tensor& a, int64_t dim);                                                                      \
  Tensor log_softmax(const Tensor& a, int64_t dim);

// ---------------------------------------------------------------- linear algebra (linalg.cpp, autograd/ops/linalg.cpp)
// matmul follows torch.matmul: 1-D operands are promoted and squeezed, batch dims broadcast.
#define KILN_LINALG_DECLARE_ALL()                                                                                    \
  Tensor matmul(const Tensor& a, const Tensor& b);                                                                   \
  Tensor mm(const Tensor& a, const Tensor& b);  /* (M,K) x (K,N) */                                                  \
  Tensor bmm(const Tensor& a, const Tensor& b); /* (B,M,K) x (B,K,N) */                                              \
  Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b, Scalar beta = 1,                                   \
               Scalar alpha = 1); /* beta*c + alpha*a@b */                                                           \
  Tensor dot(const Tensor& a, const Tensor& b);                                                                      \
  Tensor outer(const Tensor& a, const Tensor& b);

// ---------------------------------------------------------------- indexing (index.cpp; autograd/ops/index.cpp,
// concat.cpp)
#define KILN_INDEX_DECLARE_ALL()                                                                                     \
  Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);                                            \
  Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);                                                  \
  Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);                              \
  Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, Scalar value);                                   \
  Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);                          \
  Tensor& scatter_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);                                  \
  Tensor& scatter_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);                              \
  Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);                            \
  Tensor masked_select(const Tensor& a, const Tensor& mask); /* 1-D */                                               \
  Tensor embedding(const Tensor& weight, const Tensor& index); /* weight (V, D), index (...) -> (..., D) */          \
  Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);                                                   \
  Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);                                                 \
  std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim = -1, bool descending = false, bool stable = true);   \
  std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim = -1, bool largest = true,                 \
                                  bool sorted = true);                                                               \
  Tensor tril(const Tensor& a, int64_t diagonal = 0);                                                                \
  Tensor triu(const Tensor& a, int64_t diagonal = 0);
// clang-format on
