// CUDA kernels: copying between two tensors on one GPU with a layout change and/or a dtype conversion
// (all 64 dtype pairs). The contiguous same-dtype case never gets here: copy.cu uses cudaMemcpyAsync.
#include "kiln/tensor/cuda/convert.cuh"  // convert_value
#include "kiln/tensor/cuda/loops.cuh"    // launch_elementwise

namespace kiln::cuda {
namespace {

template <typename To, typename From>
struct ConvertF {
  __device__ compute_t<To> operator()(compute_t<From> v) const { return convert_value<To, From>(v); }
};

// Same dtype: the bits move through an unsigned integer of the element's width (NaN payloads intact).
template <typename Bits>
struct MoveBitsF {
  __device__ Bits operator()(Bits v) const { return v; }
};

}  // namespace

void copy_on_device(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype()) {
    switch (dst.element_size()) {
      case 1: return launch_elementwise("copy_", Types<uint8_t, uint8_t>{}, {dst, src}, MoveBitsF<uint8_t>{});
      case 2: return launch_elementwise("copy_", Types<uint16_t, uint16_t>{}, {dst, src}, MoveBitsF<uint16_t>{});
      case 4: return launch_elementwise("copy_", Types<uint32_t, uint32_t>{}, {dst, src}, MoveBitsF<uint32_t>{});
      case 8: return launch_elementwise("copy_", Types<uint64_t, uint64_t>{}, {dst, src}, MoveBitsF<uint64_t>{});
    }
    KILN_FAIL("cuda::copy: unexpected element size ", dst.element_size());
  }
  visit_dtype(dst.dtype(), [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    visit_dtype(src.dtype(), [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      if constexpr (!std::is_same_v<To, From>) {
        launch_elementwise("copy_", Types<To, From>{}, {dst, src}, ConvertF<To, From>{});
      }
    });
  });
}

}  // namespace kiln::cuda
