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
  TensorImpl(std::shared_ptr<Storage> storage, DType dtype, Shape sizes, Strides strides, int64_t offset);

  const std::shared_ptr<Storage>& storage() const { return storage_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }
  const Shape& sizes() const { return sizes_; }
  const Strides& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int64_t numel() const { return numel_; }

  // Replaces shape and strides in place (used by in-place view ops such as squeeze_ and resize).
  void set_geometry(Shape sizes, Strides strides, int64_t offset);
  // Makes this tensor view other's memory, dtype and geometry, keeping its own autograd state: how a
  // module moves its parameters to another device or dtype while every handle to them stays valid.
  void set_data(const TensorImpl& other);

  std::shared_ptr<AutogradMetaBase>& autograd_meta() { return autograd_meta_; }
  AutogradMetaBase* autograd_meta_ptr() const { return autograd_meta_.get(); }

  // True for tensors made by a view op (view, slice, transpose, ...): they alias memory another tensor
  // owns. Autograd refuses in-place writes through views while it records, since the base would miss them.
  bool is_view() const { return is_view_; }
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
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  TensorImpl& impl() const {  // throws on an undefined tensor
    if (impl_ == nullptr) throw_undefined();
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  DType dtype() const { return impl().dtype(); }
  Device device() const { return impl().device(); }
  TensorOptions options() const { return {.dtype = dtype(), .device = device()}; }
  const Shape& shape() const { return impl().sizes(); }
  const Shape& sizes() const { return impl().sizes(); }
  const Strides& strides() const { return impl().strides(); }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl().sizes().size()); }
  int64_t numel() const { return impl().numel(); }
  int64_t offset() const { return impl().offset(); }
  size_t element_size() const { return kiln::element_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  MemoryFormat suggest_memory_format() const;  // ChannelsLast when the strides are NHWC, else Contiguous
  bool is_cuda() const { return device().is_cuda(); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_floating_point() const { return kiln::is_floating_point(dtype()); }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  bool is_alias_of(const Tensor& other) const;  // shares storage with other

  // Pointer to the first element (storage data + offset). T must match dtype(), or be void.
  template <typename T = void>
  T* data_ptr() const;
  // The element of a 1-element tensor, converted to T (copies from the GPU if needed).
  template <typename T>
  T item() const;
  Scalar item() const;
  // Copies all elements to a host vector in row-major order, converted to T.
  template <typename T>
  std::vector<T> to_vector() const;

  std::string str() const;  // the printed form

  // ---- conversion and copying ----
  Tensor to(Device device, bool non_blocking = false) const;  // returns *this when already there
  Tensor to(DType dtype) const;                               // returns *this when already that dtype
  Tensor to(Device device, DType dtype, bool non_blocking = false) const;
  Tensor to(MemoryFormat format) const;  // same as contiguous(format)
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor cuda(int index = 0) const { return to(Device::cuda(index)); }
  Tensor contiguous(MemoryFormat format = MemoryFormat::Contiguous) const;
  Tensor clone(MemoryFormat format = MemoryFormat::Preserve) const;
  // A copy in page-locked host memory (this tensor if it already is), for asynchronous copies to a GPU.
  Tensor pin_memory() const;
  bool is_pinned() const;
  Tensor& copy_(const Tensor& src, bool non_blocking = false);  // any layout, dtype and device; src broadcasts
  Tensor& fill_(Scalar value);
  Tensor& zero_() { return fill_(0); }

  // ---- views (no copy) ----
  Tensor view(const Shape& shape) const;     // needs compatible strides; one size may be -1
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // transpose of a matrix (or a 1-D tensor unchanged)
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor expand(const Shape& shape) const;  // -1 keeps a size
  Tensor expand_as(const Tensor& other) const { return expand(other.shape()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor unflatten(int64_t dim, const Shape& sizes) const;
  Tensor as_strided(const Shape& sizes, const Strides& strides, std::optional<int64_t> offset = {}) const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  Tensor diagonal(int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1) const;

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
  Tensor square() const;
  Tensor pow(Scalar exponent) const;
  Tensor clamp(std::optional<Scalar> min, std::optional<Scalar> max) const;
  // The binary ops of the table (binary_ops.h): t.add(other, alpha), t.mul(other), t.pow(exponent), t.eq(other),
  // t.logical_xor(other), ...; in place t.add_(other, alpha), t.mul_(2.5), ..., computed in the promoted dtype and
  // stored in this tensor's (promotion beyond it, such as float into int, is an error).
#define KILN_X(Enum, name, result, autocast, forms, ...) KILN_BINARY_METHODS(name, forms)
  KILN_BINARY_OPS(KILN_X)
#undef KILN_X
#define KILN_X(Enum, name, ...) Tensor name(const Tensor& other) const;
  KILN_BINARY_PREDICATES(KILN_X)
#undef KILN_X
  Tensor masked_fill(const Tensor& mask, Scalar value) const;

  // in place: the result is computed in this tensor's dtype; promotion beyond it is an error
  Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max);
  Tensor& masked_fill_(const Tensor& mask, Scalar value);

  // ---- reductions (empty dims = all dims) ----
  Tensor sum(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor mean(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor prod(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor max() const;  // over all elements
  Tensor min() const;
  Tensor amax(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor amin(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor argmax(std::optional<int64_t> dim = {}, bool keepdim = false) const;
  Tensor argmin(std::optional<int64_t> dim = {}, bool keepdim = false) const;
  Tensor var(const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor std(const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false) const;
  Tensor norm(double p = 2, const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor logsumexp(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor all() const;
  Tensor any() const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;

  // ---- linear algebra and indexing ----
  Tensor matmul(const Tensor& other) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor masked_select(const Tensor& mask) const;

  // ---- autograd (kiln/autograd; every method above records the graph when an input requires grad) ----
  bool requires_grad() const;
  Tensor& requires_grad_(bool requires_grad = true);  // leaves only: gradients accumulate into grad()
  bool is_leaf() const;                               // not the result of a recorded op
  const Tensor& grad() const;                         // undefined until a backward reaches this leaf
  Tensor& mutable_grad();                             // assign or reset (set to Tensor()) the gradient
  std::shared_ptr<autograd::Node> grad_fn() const;    // the backward node of a recorded result
  Tensor detach() const;                              // same memory, no history, requires_grad false
  Tensor& detach_();
  // Backward from this tensor: gradient defaults to 1 for a one-element tensor. The graph's saved
  // tensors are freed unless retain_graph.
  void backward(const Tensor& gradient = {}, bool retain_graph = false) const;
  void retain_grad() const;  // keep grad() on a non-leaf too
  bool retains_grad() const;
  // hook(grad) runs when this tensor's gradient is computed; returning a defined tensor replaces it.
  uint64_t register_hook(std::function<Tensor(const Tensor&)> hook) const;
  // hook(leaf) runs after a backward has accumulated into this leaf's grad().
  uint64_t register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;
  void remove_hook(uint64_t handle) const;
  uint64_t version() const { return impl().storage()->version(); }  // counts in-place writes to the memory

 private:
  [[noreturn]] static void throw_undefined();
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- operators (elementwise, broadcasting, with type promotion) ----
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(Scalar a, const Tensor& b);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator==(const Tensor& a, Scalar b);
Tensor operator!=(const Tensor& a, Scalar b);
Tensor operator<(const Tensor& a, Scalar b);
Tensor operator<=(const Tensor& a, Scalar b);
Tensor operator>(const Tensor& a, Scalar b);
Tensor operator>=(const Tensor& a, Scalar b);
// On bool tensors only (masks): logical not, and, or, xor.
Tensor operator~(const Tensor& a);
Tensor operator&(const Tensor& a, const Tensor& b);
Tensor operator|(const Tensor& a, const Tensor& b);
Tensor operator^(const Tensor& a, const Tensor& b);
Tensor& operator+=(Tensor& a, const Tensor& b);
Tensor& operator-=(Tensor& a, const Tensor& b);
Tensor& operator*=(Tensor& a, const Tensor& b);
Tensor& operator/=(Tensor& a, const Tensor& b);
Tensor& operator+=(Tensor& a, Scalar b);
Tensor& operator-=(Tensor& a, Scalar b);
Tensor& operator*=(Tensor& a, Scalar b);
Tensor& operator/=(Tensor& a, Scalar b);

}  // namespace kiln
