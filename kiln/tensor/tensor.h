// kiln/tensor/tensor.h — the n-dimensional array every part of kiln passes around.
//
//   Tensor x = kiln::randn({4, 3});                 // float32 on the CPU
//   Tensor y = x.transpose(0, 1).contiguous();      // views share storage; contiguous() copies if needed
//   Tensor z = (x * 2 + 1).relu().sum({1});          // shape (4,)
//   float v = z.select(0, 0).item<float>();
//   std::cout << z;                                 // values, shape, dtype and device, as PyTorch prints
//
// A Tensor is a handle: copying it shares the same tensor (and its memory), as torch::Tensor does.
// clone() makes an independent copy. A default-constructed Tensor is undefined (defined() == false).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kiln/tensor/binary_ops.h"
#include "kiln/tensor/device.h"
#include "kiln/tensor/dtype.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/scalar.h"
#include "kiln/tensor/shape.h"
#include "kiln/tensor/storage.h"
#include "kiln/tensor/tensor_options.h"
#include "kiln/tensor/unary_ops.h"

namespace kiln {

namespace autograd {
class Node;
}  // namespace autograd

// The autograd module attaches its per-tensor state through this base class; the tensor core only
// keeps it alive and never looks inside.
struct AutogradMetaBase {
  virtual ~AutogradMetaBase() = default;
};

// Shape, strides and offset over a shared Storage. Views share the storage (and its version counter).
class TensorImpl {
 public:
  // Elements of `dtype` over `storage`; strides and offset count elements. Throws when sizes and strides differ in
  // length or a size is negative.
  TensorImpl(std::shared_ptr<Storage> storage, DType dtype, Shape sizes, Strides strides, int64_t offset);

  // The memory, shared with every view of it.
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // The element type.
  DType dtype() const { return dtype_; }
  // The storage's device.
  Device device() const { return storage_->device(); }
  // The size of each dim.
  const Shape& sizes() const { return sizes_; }
  // The stride of each dim, in elements.
  const Strides& strides() const { return strides_; }
  // Where the first element sits in the storage, in elements.
  int64_t offset() const { return offset_; }
  // The number of elements (product of the sizes).
  int64_t numel() const { return numel_; }

  // Replaces shape and strides in place (used by in-place view ops such as squeeze_ and resize).
  void set_geometry(Shape sizes, Strides strides, int64_t offset);
  // Makes this tensor view other's memory, dtype and geometry, keeping its own autograd state: how a
  // module moves its parameters to another device or dtype while every handle to them stays valid.
  void set_data(const TensorImpl& other);

  // The autograd state slot, null until autograd attaches one; the autograd module fills or resets it.
  std::shared_ptr<AutogradMetaBase>& autograd_meta() { return autograd_meta_; }
  // The autograd state, or null when none is attached.
  AutogradMetaBase* autograd_meta_ptr() const { return autograd_meta_.get(); }

  // True for tensors made by a view op (view, slice, transpose, ...): they alias memory another tensor
  // owns. Autograd refuses in-place writes through views while it records, since the base would miss them.
  bool is_view() const { return is_view_; }
  // Marks (or unmarks) this tensor as a view; set by the view ops.
  void set_is_view(bool v) { is_view_ = v; }

 private:
  std::shared_ptr<Storage> storage_;
  DType dtype_;
  Shape sizes_;
  Strides strides_;
  int64_t offset_;
  int64_t numel_;
  bool is_view_ = false;
  std::shared_ptr<AutogradMetaBase> autograd_meta_;
};

// An n-dimensional array on a device (CPU or CUDA) with a dtype, shape and strides; views share memory. Copying a
// Tensor copies a handle to the same data (as a torch.Tensor does); tensors that require gradients record the ops
// autograd differentiates.
class Tensor {
 public:
  Tensor() = default;
  // Wraps impl, sharing it; a null impl gives an undefined tensor.
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  TensorImpl& impl() const {  // throws on an undefined tensor
    if (impl_ == nullptr) throw_undefined();
    return *impl_;
  }
  // The shared impl; null for an undefined tensor.
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  // The element type.
  DType dtype() const { return impl().dtype(); }
  // The device the memory is on.
  Device device() const { return impl().device(); }
  // This tensor's dtype and device, for making tensors like it.
  TensorOptions options() const { return {.dtype = dtype(), .device = device()}; }
  // The size of each dim, as torch.Tensor.shape (same as sizes()).
  const Shape& shape() const { return impl().sizes(); }
  // The size of each dim.
  const Shape& sizes() const { return impl().sizes(); }
  // The stride of each dim, in elements.
  const Strides& strides() const { return impl().strides(); }
  int64_t size(int64_t dim) const;    // negative dims count from the end
  int64_t stride(int64_t dim) const;  // in elements; negative dims count from the end
  // The number of dims (0 for a scalar tensor).
  int64_t dim() const { return static_cast<int64_t>(impl().sizes().size()); }
  // The number of elements.
  int64_t numel() const { return impl().numel(); }
  // Where the first element sits in the storage, in elements.
  int64_t offset() const { return impl().offset(); }
  // Bytes per element.
  size_t element_size() const { return kiln::element_size(dtype()); }
  // Bytes the elements take: numel() * element_size() (not the whole storage's size).
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  // True when the strides are row-major (Contiguous, Preserve) or NHWC for a 4-D tensor (ChannelsLast); size-1 dims
  // are ignored and an empty tensor always is.
  bool is_contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  MemoryFormat suggest_memory_format() const;  // ChannelsLast when the strides are NHWC, else Contiguous
  // On a CUDA device.
  bool is_cuda() const { return device().is_cuda(); }
  // On the CPU.
  bool is_cpu() const { return device().is_cpu(); }
  // The dtype is a floating-point one (see kiln::is_floating_point).
  bool is_floating_point() const { return kiln::is_floating_point(dtype()); }
  // Both handles share one TensorImpl (not merely the same memory, see is_alias_of).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  bool is_alias_of(const Tensor& other) const;  // shares storage with other

  // Pointer to the first element (storage data + offset). T must match dtype(), or be void.
  template <typename T = void>
  T* data_ptr() const;
  // The element of a 1-element tensor, converted to T (copies from the GPU if needed).
  template <typename T>
  T item() const;
  Scalar item() const;  // the element of a 1-element tensor, as a Scalar of its dtype
  // Copies all elements to a host vector in row-major order, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;

  std::string str() const;  // the printed form

  // ---- conversion and copying ----
  Tensor to(Device device, bool non_blocking = false) const;               // returns *this when already there
  Tensor to(DType dtype) const;                                            // returns *this when already that dtype
  Tensor to(Device device, DType dtype, bool non_blocking = false) const;  // returns *this when nothing changes
  Tensor to(MemoryFormat format) const;                                    // same as contiguous(format)
  // A copy on the CPU (this tensor if it is there already).
  Tensor cpu() const { return to(Device::cpu()); }
  // A copy on CUDA device `index` (this tensor if it is there already).
  Tensor cuda(int index = 0) const { return to(Device::cuda(index)); }
  // This tensor when already contiguous in `format`, else a copy that is (Preserve picks suggest_memory_format()).
  Tensor contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  // A copy in new memory, recorded by autograd as torch.Tensor.clone; Preserve keeps a channels-last layout.
  Tensor clone(MemoryFormat format = MemoryFormat::Preserve) const;
  // A copy in page-locked host memory (this tensor if it already is), for asynchronous copies to a GPU.
  Tensor pin_memory() const;
  bool is_pinned() const;                                       // in page-locked host memory
  Tensor& copy_(const Tensor& src, bool non_blocking = false);  // any layout, dtype and device; src broadcasts
  Tensor& fill_(Scalar value);                                  // sets every element to value; returns *this
  // Sets every element to zero; returns *this.
  Tensor& zero_() { return fill_(0); }

  // ---- views (no copy) ----
  Tensor view(const Shape& shape) const;                            // needs compatible strides; one size may be -1
  Tensor reshape(const Shape& shape) const;                         // a view when possible, else a copy
  Tensor permute(const std::vector<int64_t>& dims) const;           // dim i of the result is dims[i] of this
  Tensor transpose(int64_t dim0, int64_t dim1) const;               // swaps two dims
  Tensor t() const;                                                 // transpose of a matrix (or a 1-D tensor unchanged)
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;  // `length` entries of dim from start
  // t[start:end:step] along dim, with Python's rules: negative bounds count from the end, out-of-range ones clamp;
  // step must be positive.
  Tensor slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // entry index of dim, dropping dim; index may be negative
  // select(0, index).
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor expand(const Shape& shape) const;  // -1 keeps a size
  // expand(other.shape()).
  Tensor expand_as(const Tensor& other) const { return expand(other.shape()); }
  Tensor squeeze() const;               // drops every size-1 dim
  Tensor squeeze(int64_t dim) const;    // drops dim if its size is 1, else returns the tensor as is
  Tensor unsqueeze(int64_t dim) const;  // inserts a size-1 dim at dim
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;  // merges start_dim..end_dim; copies if needed
  Tensor unflatten(int64_t dim, const Shape& sizes) const;            // splits dim into sizes (one may be -1)
  // A view of the same storage with the given geometry; offset (in elements) defaults to this tensor's.
  Tensor as_strided(const Shape& sizes, const Strides& strides, std::optional<int64_t> offset = {}) const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;  // views of split_size (the last may be less)
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;      // at most `chunks` views, as torch.chunk
  Tensor diagonal(int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1) const;  // a view, as torch.diagonal

  // ---- elementwise ----
  // The unary ops of the table (unary_ops.h): t.exp(), and t.exp_() in place; t.isnan(), ...
#define KILN_X(Enum, name, ...) \
  Tensor name() const;          \
  Tensor& name##_();
  KILN_UNARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Enum, name, ...) Tensor name() const;
  KILN_UNARY_PREDICATES(KILN_X)
#undef KILN_X
  Tensor square() const;                                                     // x * x
  Tensor pow(Scalar exponent) const;                                         // x ** exponent
  Tensor clamp(std::optional<Scalar> min, std::optional<Scalar> max) const;  // limits to [min, max]; either may be {}
  // The binary ops of the table (binary_ops.h): t.add(other, alpha), t.mul(other), t.pow(exponent), t.eq(other),
  // t.logical_xor(other), ...; in place t.add_(other, alpha), t.mul_(2.5), ..., computed in the promoted dtype and
  // stored in this tensor's (promotion beyond it, such as float into int, is an error).
#define KILN_X(Enum, name, result, autocast, forms, ...) KILN_BINARY_METHODS(name, forms)
  KILN_BINARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Enum, name, ...) Tensor name(const Tensor& other) const;
  KILN_BINARY_PREDICATES(KILN_X)
#undef KILN_X
  Tensor masked_fill(const Tensor& mask, Scalar value) const;  // a copy with value where the Bool mask is true

  // in place: the result is computed in this tensor's dtype; promotion beyond it is an error
  Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max);
  Tensor& masked_fill_(const Tensor& mask, Scalar value);  // value where the Bool mask is true

  // ---- reductions (empty dims = all dims) ----
  Tensor sum(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor mean(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;  // floating-point dtypes only
  Tensor prod(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;  // integers and Bool give Int64
  Tensor max() const;                                                              // over all elements
  Tensor min() const;                                                              // over all elements
  Tensor amax(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;  // the largest values
  Tensor amin(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;  // the smallest values
  // Int64 index of the largest value along dim, or into the row-major flattened tensor when dim is {}.
  Tensor argmax(std::optional<int64_t> dim = {}, bool keepdim = false) const;
  Tensor argmin(std::optional<int64_t> dim = {}, bool keepdim = false) const;  // as argmax, of the smallest
  // Variance over dims with divisor N - correction (1: Bessel's); floating dtypes only.
  Tensor var(const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor std(const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false) const;  // sqrt of var
  Tensor norm(double p = 2, const std::vector<int64_t>& dims = {}, bool keepdim = false) const;  // p may be INFINITY
  Tensor logsumexp(const std::vector<int64_t>& dims, bool keepdim = false) const;  // log(sum(exp(x))) over dims
  Tensor all() const;                                                              // 0-d Bool: every element is nonzero
  Tensor any() const;                                                              // 0-d Bool: some element is nonzero
  Tensor softmax(int64_t dim) const;                                               // along dim
  Tensor log_softmax(int64_t dim) const;                                           // along dim

  // ---- linear algebra and indexing ----
  Tensor matmul(const Tensor& other) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;  // as torch.index_select
  Tensor gather(int64_t dim, const Tensor& index) const;        // as torch.gather
  Tensor masked_select(const Tensor& mask) const;               // 1-D: the elements where mask is true

  // ---- autograd (kiln/autograd; every method above records the graph when an input requires grad) ----
  bool requires_grad() const;
  Tensor& requires_grad_(bool requires_grad = true);  // leaves only: gradients accumulate into grad()
  bool is_leaf() const;                               // not the result of a recorded op
  const Tensor& grad() const;                         // undefined until a backward reaches this leaf
  Tensor& mutable_grad();                             // assign or reset (set to Tensor()) the gradient
  std::shared_ptr<autograd::Node> grad_fn() const;    // the backward node of a recorded result
  Tensor detach() const;                              // same memory, no history, requires_grad false
  Tensor& detach_();                                  // drops history and requires_grad in place
  // Backward from this tensor: gradient defaults to 1 for a one-element tensor. The graph's saved
  // tensors are freed unless retain_graph.
  void backward(const Tensor& gradient = {}, bool retain_graph = false) const;
  void retain_grad() const;   // keep grad() on a non-leaf too
  bool retains_grad() const;  // retain_grad() was called on this non-leaf
  // hook(grad) runs when this tensor's gradient is computed; returning a defined tensor replaces it.
  uint64_t register_hook(std::function<Tensor(const Tensor&)> hook) const;
  // hook(leaf) runs after a backward has accumulated into this leaf's grad().
  uint64_t register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;
  void remove_hook(uint64_t handle) const;  // either kind of hook; an unknown handle is ignored
  // Counts in-place writes to the memory (shared by every view of it).
  uint64_t version() const { return impl().storage()->version(); }

 private:
  [[noreturn]] static void throw_undefined();
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);  // writes t.str()

// ---- operators (elementwise, broadcasting, with type promotion) ----
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, const Tensor& b);   // add(a, b)
Tensor operator-(const Tensor& a, const Tensor& b);   // sub(a, b)
Tensor operator*(const Tensor& a, const Tensor& b);   // mul(a, b)
Tensor operator/(const Tensor& a, const Tensor& b);   // div(a, b): true division
Tensor operator+(const Tensor& a, Scalar b);          // add(a, b)
Tensor operator-(const Tensor& a, Scalar b);          // sub(a, b)
Tensor operator*(const Tensor& a, Scalar b);          // mul(a, b)
Tensor operator/(const Tensor& a, Scalar b);          // div(a, b): true division
Tensor operator+(Scalar a, const Tensor& b);          // add(b, a)
Tensor operator-(Scalar a, const Tensor& b);          // a - b, as rsub(b, a)
Tensor operator*(Scalar a, const Tensor& b);          // mul(b, a)
Tensor operator/(Scalar a, const Tensor& b);          // div(a, b)
Tensor operator==(const Tensor& a, const Tensor& b);  // eq(a, b), Bool
Tensor operator!=(const Tensor& a, const Tensor& b);  // ne(a, b), Bool
Tensor operator<(const Tensor& a, const Tensor& b);   // lt(a, b), Bool
Tensor operator<=(const Tensor& a, const Tensor& b);  // le(a, b), Bool
Tensor operator>(const Tensor& a, const Tensor& b);   // gt(a, b), Bool
Tensor operator>=(const Tensor& a, const Tensor& b);  // ge(a, b), Bool
Tensor operator==(const Tensor& a, Scalar b);         // eq(a, b), Bool
Tensor operator!=(const Tensor& a, Scalar b);         // ne(a, b), Bool
Tensor operator<(const Tensor& a, Scalar b);          // lt(a, b), Bool
Tensor operator<=(const Tensor& a, Scalar b);         // le(a, b), Bool
Tensor operator>(const Tensor& a, Scalar b);          // gt(a, b), Bool
Tensor operator>=(const Tensor& a, Scalar b);         // ge(a, b), Bool
// On bool tensors only (masks): logical not, and, or, xor.
Tensor operator~(const Tensor& a);
Tensor operator&(const Tensor& a, const Tensor& b);  // logical_and
Tensor operator|(const Tensor& a, const Tensor& b);  // logical_or
Tensor operator^(const Tensor& a, const Tensor& b);  // logical_xor
Tensor& operator+=(Tensor& a, const Tensor& b);      // add_(a, b)
Tensor& operator-=(Tensor& a, const Tensor& b);      // sub_(a, b)
Tensor& operator*=(Tensor& a, const Tensor& b);      // mul_(a, b)
Tensor& operator/=(Tensor& a, const Tensor& b);      // div_(a, b)
Tensor& operator+=(Tensor& a, Scalar b);             // add_(a, b)
Tensor& operator-=(Tensor& a, Scalar b);             // sub_(a, b)
Tensor& operator*=(Tensor& a, Scalar b);             // mul_(a, b)
Tensor& operator/=(Tensor& a, Scalar b);             // div_(a, b)

}  // namespace kiln
