// CUDA kernels and host logic: copy (device <-> device, host <-> device, GPU <-> GPU), fill, arange, linspace.
//
// copy() picks the cheapest route that keeps cpu/convert.h's semantics:
//  - one GPU, same dtype, both contiguous: cudaMemcpyAsync on stream_for(dst);
//  - one GPU otherwise: the conversion / relayout kernel of convert.cu;
//  - host <-> device: one cudaMemcpyAsync between contiguous buffers of one dtype, staging through a
//    contiguous temporary where needed (relayout on the CPU through kiln::ops, dtype conversion on the
//    GPU). The host waits for the copy unless non_blocking and the host memory is page-locked;
//  - two GPUs: cudaMemcpyPeerAsync of contiguous buffers, ordered after the source stream's work, with
//    the source stream then waiting for the copy (so memory freed on it is not reused too early).
#include <algorithm>  // std::max

#include "kiln/tensor/cuda/convert.cuh"     // convert_value, copy_on_device
#include "kiln/tensor/cuda/index_errors.h"  // throw_index_error
#include "kiln/tensor/cuda/loops.cuh"       // launch_elementwise, kThreads, device_t, from_compute
#include "kiln/tensor/internal_ops.h"       // empty, contiguous: staging tensors

namespace kiln::cuda {
namespace {

// Whether `ptr` is page-locked host memory (cudaHostAlloc'ed or registered); the only kind that lets
// cudaMemcpyAsync return before the copy is done.
bool is_pinned(const void* ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky, but it must not surface at the next checked launch
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

// A contiguous tensor of `t`'s shape with `dtype` on `device`.
Tensor contiguous_temp(const Tensor& t, DType dtype, Device device) {
  return internal::empty(t.shape(), TensorOptions{.dtype = dtype, .device = device});
}

void host_to_device(const Tensor& dst, const Tensor& src, bool non_blocking) {
  // Relayout on the CPU (kiln::ops), conversion on the GPU (after the upload, in src's dtype).
  const Tensor host = src.is_contiguous() ? src : internal::contiguous(src);
  const bool direct = dst.is_contiguous() && dst.dtype() == src.dtype();
  const Tensor dev = direct ? dst : contiguous_temp(dst, src.dtype(), dst.device());
  cudaStream_t stream = stream_for(dst);
  KILN_CUDA_CHECK(cudaMemcpyAsync(dev.data_ptr(), host.data_ptr(), host.nbytes(), cudaMemcpyHostToDevice, stream),
                  "copy_ (host to device)");
  if (!direct) copy_on_device(dst, dev);  // same stream: ordered after the upload
  // A CPU temporary, or pageable source memory, must not be released or changed before the copy is done.
  if (!(non_blocking && host.is_same(src) && is_pinned(host.data_ptr())))
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream), "copy_ (host to device)");
}

void device_to_host(const Tensor& dst, const Tensor& src, bool non_blocking) {
  // Conversion and relayout on the GPU; a CPU temporary when dst itself is not contiguous.
  Tensor dev = src;
  if (!src.is_contiguous() || src.dtype() != dst.dtype()) {
    dev = contiguous_temp(src, dst.dtype(), src.device());
    copy_on_device(dev, src);
  }
  const bool direct = dst.is_contiguous();
  const Tensor host = direct ? dst : contiguous_temp(dst, dst.dtype(), Device::cpu());
  cudaStream_t stream = stream_for(src);
  KILN_CUDA_CHECK(cudaMemcpyAsync(host.data_ptr(), dev.data_ptr(), host.nbytes(), cudaMemcpyDeviceToHost, stream),
                  "copy_ (device to host)");
  if (direct && non_blocking && is_pinned(host.data_ptr())) return;
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream), "copy_ (device to host)");
  detail::throw_index_error(src.device().index());  // what the kernels before the copy found
  if (!direct) {
    Tensor out = dst;            // shares dst's storage
    internal::copy_(out, host);  // CPU relayout
  }
}

void device_to_device_peer(const Tensor& dst, const Tensor& src) {
  // Contiguous, in dst's dtype, on the source GPU (converting there halves the traffic for narrower dtypes).
  Tensor from = src;
  if (!src.is_contiguous() || src.dtype() != dst.dtype()) {
    from = contiguous_temp(src, dst.dtype(), src.device());
    copy_on_device(from, src);
  }
  cudaStream_t src_stream = stream_for(src);
  const bool direct = dst.is_contiguous();
  const Tensor to = direct ? dst : contiguous_temp(dst, dst.dtype(), dst.device());
  cudaStream_t dst_stream = stream_for(dst);  // leaves dst's device current
  // dst's stream waits for the source's pending work; the source stream then waits for the copy.
  cudaEvent_t ready = nullptr, done = nullptr;
  KILN_CUDA_CHECK(cudaSetDevice(src.device().index()), "copy_ (peer)");
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "copy_ (peer)");
  KILN_CUDA_CHECK(cudaEventRecord(ready, src_stream), "copy_ (peer)");
  KILN_CUDA_CHECK(cudaSetDevice(dst.device().index()), "copy_ (peer)");
  KILN_CUDA_CHECK(cudaStreamWaitEvent(dst_stream, ready, 0), "copy_ (peer)");
  KILN_CUDA_CHECK(cudaEventDestroy(ready), "copy_ (peer)");  // released once it has happened
  KILN_CUDA_CHECK(cudaMemcpyPeerAsync(to.data_ptr(), dst.device().index(), from.data_ptr(), src.device().index(),
                                      to.nbytes(), dst_stream),
                  "copy_ (peer)");
  if (!direct) copy_on_device(dst, to);
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "copy_ (peer)");
  KILN_CUDA_CHECK(cudaEventRecord(done, dst_stream), "copy_ (peer)");
  KILN_CUDA_CHECK(cudaStreamWaitEvent(src_stream, done, 0), "copy_ (peer)");
  KILN_CUDA_CHECK(cudaEventDestroy(done), "copy_ (peer)");
}

// ---- fill ----
template <typename T>
struct FillF {
  compute_t<T> value;
  __device__ compute_t<T> operator()() const { return value; }
};

// ---- arange / linspace: out[i * stride] for a 1-D destination of n elements ----
template <typename T>
__global__ void __launch_bounds__(kThreads)
    arange_int_kernel(char* out, int64_t stride, int64_t n, int64_t start, int64_t step) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  // Integers step exactly in int64, as the CPU does.
  if (i < n)
    *reinterpret_cast<device_t<T>*>(out + i * stride) = from_compute<T>(convert_value<T, int64_t>(start + i * step));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    arange_float_kernel(char* out, int64_t stride, int64_t n, double start, double step) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n)
    *reinterpret_cast<device_t<T>*>(out + i * stride) =
        from_compute<T>(convert_value<T, double>(start + static_cast<double>(i) * step));
}

// Symmetric, as the CPU and PyTorch: the first half steps up from start, the second half down from end.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    linspace_kernel(char* out, int64_t stride, int64_t n, double start, double end, double step) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  const double v = i < n / 2 ? start + static_cast<double>(i) * step : end - static_cast<double>(n - 1 - i) * step;
  *reinterpret_cast<device_t<T>*>(out + i * stride) = from_compute<T>(convert_value<T, double>(v));
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::max<int64_t>(1, (n + kThreads - 1) / kThreads)); }

}  // namespace

void CudaBackend::copy(const Tensor& dst, const Tensor& src, bool non_blocking) {
  if (dst.numel() == 0) return;
  if (dst.is_cuda() && src.is_cuda()) {
    if (dst.device() != src.device()) return device_to_device_peer(dst, src);
    if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() && src.shape() == dst.shape()) {
      cudaStream_t stream = stream_for(dst);
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream),
                      "copy_");
      return;
    }
    return copy_on_device(dst, src);
  }
  if (dst.is_cuda()) {
    KILN_CHECK(src.is_cpu(), "cuda::copy: unexpected source device ", src.device());
    return host_to_device(dst, src, non_blocking);
  }
  KILN_CHECK(src.is_cuda() && dst.is_cpu(), "cuda::copy: expected a GPU on one side, got ", dst.device(), " <- ",
             src.device());
  device_to_host(dst, src, non_blocking);
}

void CudaBackend::fill(const Tensor& dst, Scalar value) {
  if (dst.numel() == 0) return;
  if (is_float8(dst.dtype())) {  // converted on the host (float8.h, as the CPU does), stored as the code
    const uint8_t code =
        dst.dtype() == DType::Float8_e4m3fn ? value.to<Float8_e4m3fn>().bits : value.to<Float8_e5m2>().bits;
    return launch_elementwise("fill_", Types<uint8_t>{}, {dst}, FillF<uint8_t>{code});
  }
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Converted like the CPU (Scalar::to<T>), then widened exactly to the compute type.
    const FillF<T> f{static_cast<compute_t<T>>(value.to<T>())};
    launch_elementwise("fill_", Types<T>{}, {dst}, f);
  });
}

void CudaBackend::arange(const Tensor& dst, Scalar start, Scalar step) {
  KILN_CHECK(dst.dim() == 1, "cuda::arange: expected a 1-D destination, got shape ", dst.shape());
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int64_t stride = dst.stride(0) * static_cast<int64_t>(dst.element_size());
  char* out = static_cast<char*>(dst.data_ptr());
  cudaStream_t stream = stream_for(dst);
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>) {
      arange_int_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(out, stride, n, start.to_int64(), step.to_int64());
    } else {
      arange_float_kernel<T>
          <<<blocks_for(n), kThreads, 0, stream>>>(out, stride, n, start.to_double(), step.to_double());
    }
  });
  KILN_CUDA_CHECK_LAUNCH("arange");
}

void CudaBackend::linspace(const Tensor& dst, double start, double end) {
  KILN_CHECK(dst.dim() == 1, "cuda::linspace: expected a 1-D destination, got shape ", dst.shape());
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (n == 1) end = start;  // one element: start (the formula below would give end)
  const double step = n > 1 ? (end - start) / static_cast<double>(n - 1) : 0.0;
  const int64_t stride = dst.stride(0) * static_cast<int64_t>(dst.element_size());
  char* out = static_cast<char*>(dst.data_ptr());
  cudaStream_t stream = stream_for(dst);
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    linspace_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(out, stride, n, start, end, step);
  });
  KILN_CUDA_CHECK_LAUNCH("linspace");
}

}  // namespace kiln::cuda
