// GPUs: counting them, the current device, synchronising, profiler ranges, and the backend instance.
#include <cuda_profiler_api.h>  // cudaProfilerStart, cudaProfilerStop
#include <cuda_runtime.h>

#include <string>

#include "kiln/tensor/cuda.h"
#include "kiln/tensor/cuda/cuda_backend.h"
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/cuda/index_errors.h"

namespace kiln::cuda {
namespace detail {

void throw_cuda_error(cudaError_t err, const char* call, const char* op, const char* file, int line) {
  std::string message = ::kiln::detail::str_cat(op, ": CUDA error ", cudaGetErrorName(err), " (",
                                                cudaGetErrorString(err), ") in ", call, " at ", file, ":", line);
  if (err == cudaErrorMemoryAllocation) throw OutOfMemoryError(message);
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) {
    message += "; check that the NVIDIA driver is installed and a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)";
  }
  throw CudaError(message);
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* op, const char* file, int line) {
  throw CudaError(::kiln::detail::str_cat(op, ": cuBLAS error ", cublasGetStatusName(status), " (",
                                          cublasGetStatusString(status), ") in ", call, " at ", file, ":", line));
}

}  // namespace detail

int device_count() {
  // Counted once: the driver's answer does not change during a process. No driver or no GPU means 0.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error so later calls do not report it
      return 0;
    }
    return n;
  }();
  return count;
}

bool is_available() { return device_count() > 0; }

namespace {
void check_device(int device, const char* op) {
  const int n = device_count();
  KILN_CHECK(n > 0, op, ": no CUDA device is visible (check the driver with nvidia-smi, and CUDA_VISIBLE_DEVICES)");
  KILN_CHECK(device >= 0 && device < n, op, ": device cuda:", device, " does not exist; ", n, " GPU(s) are visible");
}
}  // namespace

int compute_capability(int device) {
  check_device(device, "compute_capability");
  int major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "compute_capability");
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "compute_capability");
  return major * 10 + minor;
}

int current_device() {
  check_device(0, "current_device");
  int d = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&d), "current_device");
  return d;
}

void set_device(int device) {
  check_device(device, "set_device");
  KILN_CUDA_CHECK(cudaSetDevice(device), "set_device");
}

void synchronize(int device) {
  if (device < 0) device = current_device();
  DeviceGuard guard(device);
  KILN_CUDA_CHECK(cudaDeviceSynchronize(), "synchronize");
  detail::throw_index_error(device);
}

void profiler_start() { KILN_CUDA_CHECK(cudaProfilerStart(), "profiler_start"); }
void profiler_stop() { KILN_CUDA_CHECK(cudaProfilerStop(), "profiler_stop"); }

std::string pci_bus_id(int device) {
  check_device(device, "pci_bus_id");
  char id[32] = {};  // "0000:3B:00.0" needs 13; NVML's buffer size for the same string is 32
  KILN_CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof(id), device), "pci_bus_id");
  return id;
}

DeviceGuard::DeviceGuard(int device) : previous_(current_device()) {
  if (device != previous_) set_device(device);
}

DeviceGuard::~DeviceGuard() {
  int now = 0;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

int CudaBackend::device_count() const { return cuda::device_count(); }

void CudaBackend::synchronize(int device_index) { cuda::synchronize(device_index); }

CudaBackend& cuda_backend() {
  static CudaBackend instance;
  return instance;
}

Backend& backend_instance() { return cuda_backend(); }

}  // namespace kiln::cuda
