// Tensor metadata: geometry, contiguity, element access.
#include "kiln/tensor/tensor.h"

#include <initializer_list>

#include "kiln/tensor/checked_size.h"
#include "kiln/tensor/dispatch.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln {

TensorImpl::TensorImpl(std::shared_ptr<Storage> storage, DType dtype, Shape sizes, Strides strides, int64_t offset)
    : storage_(std::move(storage)), dtype_(dtype) {
  set_geometry(std::move(sizes), std::move(strides), offset);
}

void TensorImpl::set_geometry(Shape sizes, Strides strides, int64_t offset) {
  KILN_CHECK(sizes.size() == strides.size(), "TensorImpl: ", sizes.size(), " sizes but ", strides.size(), " strides");
  const int64_t n = kiln::numel(sizes, "TensorImpl");  // refuses negative sizes and more than 2^63-1 elements
  sizes_ = std::move(sizes);
  strides_ = std::move(strides);
  offset_ = offset;
  numel_ = n;
}

void TensorImpl::set_data(const TensorImpl& other) {
  storage_ = other.storage_;
  dtype_ = other.dtype_;
  sizes_ = other.sizes_;
  strides_ = other.strides_;
  offset_ = other.offset_;
  numel_ = other.numel_;
  is_view_ = other.is_view_;
}

void Tensor::throw_undefined() {
  KILN_FAIL("this Tensor is undefined (default-constructed); assign it the result of an op first");
}

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_alias_of(const Tensor& other) const {
  return defined() && other.defined() && impl().storage() == other.impl().storage();
}

namespace {
// Contiguity in the order given by `perm` (outermost first): sizes-1 dims are free.
bool contiguous_in_order(const Shape& sizes, const Strides& strides, std::initializer_list<int> perm) {
  int64_t expected = 1;
  for (auto it = perm.end(); it != perm.begin();) {
    const int d = *--it;
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}
}  // namespace

bool Tensor::is_contiguous(MemoryFormat format) const {
  const auto& s = shape();
  if (numel() == 0) return true;
  switch (format) {
    case MemoryFormat::Contiguous:
    case MemoryFormat::Preserve: {
      const auto& st = strides();
      int64_t expected = 1;
      for (size_t d = s.size(); d-- > 0;) {
        if (s[d] == 1) continue;
        if (st[d] != expected) return false;
        expected *= s[d];
      }
      return true;
    }
    case MemoryFormat::ChannelsLast: return s.size() == 4 && contiguous_in_order(s, strides(), {0, 2, 3, 1});
  }
  return false;
}

MemoryFormat Tensor::suggest_memory_format() const {
  // Channels-last when the strides say NHWC and the tensor is not also plainly contiguous (C == 1, say).
  if (dim() == 4 && is_contiguous(MemoryFormat::ChannelsLast) && !is_contiguous()) return MemoryFormat::ChannelsLast;
  return MemoryFormat::Contiguous;
}

template <typename T>
T* Tensor::data_ptr() const {
  const TensorImpl& i = impl();
  if constexpr (!std::is_void_v<T>) {
    KILN_CHECK(dtype_of<std::remove_const_t<T>>() == i.dtype(), "data_ptr<", dtype_of<std::remove_const_t<T>>(),
               ">: the tensor's dtype is ", i.dtype(), "; call data_ptr<T>() with the matching type");
  }
  auto* base = static_cast<char*>(i.storage()->data());
  if (base == nullptr) return nullptr;
  return reinterpret_cast<T*>(base + i.offset() * static_cast<int64_t>(kiln::element_size(i.dtype())));
}
template void* Tensor::data_ptr<void>() const;
template bool* Tensor::data_ptr<bool>() const;
template uint8_t* Tensor::data_ptr<uint8_t>() const;
template int32_t* Tensor::data_ptr<int32_t>() const;
template int64_t* Tensor::data_ptr<int64_t>() const;
template Half* Tensor::data_ptr<Half>() const;
template BFloat16* Tensor::data_ptr<BFloat16>() const;
template float* Tensor::data_ptr<float>() const;
template double* Tensor::data_ptr<double>() const;
template Float8_e4m3fn* Tensor::data_ptr<Float8_e4m3fn>() const;
template Float8_e5m2* Tensor::data_ptr<Float8_e5m2>() const;

Scalar Tensor::item() const {
  KILN_CHECK(numel() == 1, "item: expected a tensor with one element, got shape ", shape(), " (", numel(),
             " elements); reduce it first, e.g. with sum() or select()");
  Tensor host = is_cpu() ? *this : internal::to(*this, Device::cpu());
  return visit_storage_dtype(dtype(), [&](auto tag) -> Scalar {
    using T = typename decltype(tag)::type;
    return Scalar(*host.data_ptr<T>());
  });
}

template <typename T>
T Tensor::item() const {
  return item().to<T>();
}
template bool Tensor::item<bool>() const;
template uint8_t Tensor::item<uint8_t>() const;
template int32_t Tensor::item<int32_t>() const;
template int64_t Tensor::item<int64_t>() const;
template Half Tensor::item<Half>() const;
template BFloat16 Tensor::item<BFloat16>() const;
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template Float8_e4m3fn Tensor::item<Float8_e4m3fn>() const;
template Float8_e5m2 Tensor::item<Float8_e5m2>() const;

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = internal::contiguous(internal::to(*this, Device::cpu(), dtype_of<T>()));
  const T* p = host.data_ptr<T>();
  return std::vector<T>(p, p + host.numel());
}
template std::vector<bool> Tensor::to_vector<bool>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<Half> Tensor::to_vector<Half>() const;
template std::vector<BFloat16> Tensor::to_vector<BFloat16>() const;
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<Float8_e4m3fn> Tensor::to_vector<Float8_e4m3fn>() const;
template std::vector<Float8_e5m2> Tensor::to_vector<Float8_e5m2>() const;

}  // namespace kiln
