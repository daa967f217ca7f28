// GPUs: counting them, the current device, synchronising, profiler ranges, and the backend instance.
#include <cuda_profiler_api.h>  // cudaProfilerStart, cudaProfilerStop
#include <cuda_runtime.h>

#include <cstdlib>  // setenv
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

namespace {

// CUDA gives each process 8 hardware work queues per GPU unless CUDA_DEVICE_MAX_CONNECTIONS says otherwise (1 to
// 32); streams beyond that share a queue. A training process has more streams than 8: the one training runs on, the
// data loader's copy stream, one per GPU JPEG decoder, NCCL's. kiln asks for the 32 queues CUDA allows. Measured on
// one H100 (bench/results/2026-12-06k), ResNet-50 fed by GPU-decoded JPEGs stepped in 43.7 ms (median of 4 runs,
// 42.5-49.3) with 8 queues and 41.3 ms (41.26-41.35) with 32, against 40.4 ms fed from memory, which 32 queues left
// as it was. The driver reads the variable when it creates a device's context, later than this (the library
// loading); a value already in the environment is kept.
const bool kQueuesRequested = [] {
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  return true;
}();

}  // namespace

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
