// kiln-doctor-checks: small real workloads on each visible GPU through the paths kiln's users take
// (kiln tensors and ops, nn::conv2d, kiln::cuda::Event), and one NCCL all-reduce across all GPUs. Loaded by
// kiln-doctor only after its probes found every library this module links.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checks_abi.h"
#include "kiln/autograd/functions.h"  // kiln::matmul, randn, ...
#include "kiln/layers/conv.h"         // nn::conv2d
#include "kiln/tensor/cuda.h"         // DeviceGuard, Event, Stream

namespace {

using nlohmann::json;
using namespace kiln;

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

// Largest difference between two float32 CPU tensors, and whether it is within float32 rounding of the
// reference's scale (FFT and Winograd convolutions round differently from a direct sum; a broken result is off
// by the values themselves).
float checked_difference(const Tensor& got, const Tensor& want, const std::string& what) {
  const float err = (got - want).abs().max().item<float>();
  const float scale = want.abs().max().item<float>();
  if (!(err <= 2e-4f * (1.0f + scale))) {
    fail(what + " differs from the CPU by " + std::to_string(err) + " (values up to " + std::to_string(scale) + ")");
  }
  return err;
}

// Runs one check; an exception (kiln::Error included) makes it failed with its message.
template <class Body>
void run_check(json& results, const std::string& name, int device, Body&& body) {
  json r = {{"name", name}, {"device", device}, {"status", "passed"}};
  try {
    body(r);
  } catch (const std::exception& e) {
    r["status"] = "failed";
    r["error"] = e.what();
    cudaGetLastError();  // a failed launch leaves a sticky error behind; clear it for the next check
  }
  results.push_back(std::move(r));
}

// Milliseconds of `work` on the current stream, timed by kiln's CUDA events; the best of `repeat` runs.
template <class Work>
float best_ms(int repeat, Work&& work) {
  float best = 1e30f;
  for (int i = 0; i < repeat; ++i) {
    cuda::Event start(true), stop(true);
    start.record();
    work();
    stop.record();
    stop.synchronize();
    best = std::min(best, start.elapsed_ms(stop));
  }
  return best;
}

void kernel_launch(json& r, int d) {
  // (1M) elementwise kernels: the result proves the kernel ran (a GPU the build has no code for fails here
  // with "no kernel image"), the timing of 100 small launches gives the launch overhead.
  const Device dev = Device::cuda(d);
  Tensor x = arange(0, 1 << 20, 1, {.dtype = DType::Float32, .device = dev});
  Tensor y = (x * 2 + 1).to(Device::cpu());
  const float* p = y.data_ptr<float>();
  for (int64_t i = 0; i < y.numel(); i += 4099) {
    if (p[i] != 2.0f * static_cast<float>(i) + 1.0f) fail("wrong result at " + std::to_string(i));
  }
  Tensor small = ones({16}, {.device = dev});
  const float ms = best_ms(3, [&] {
    for (int i = 0; i < 100; ++i) small.mul_(1.0);
  });
  r["detail"] = "x * 2 + 1 over 1M floats checked; 100 launches of a 16-element kernel timed";
  r["value"] = ms * 1000.0f / 100.0f;
  r["unit"] = "us per launch";
}

void copy(json& r, int d, bool to_device) {
  // 256 MiB between pinned host memory and the GPU, the way the data loader delivers batches.
  constexpr int64_t kBytes = 256ll << 20;
  const Device dev = Device::cuda(d);
  Tensor host = empty({kBytes}, {.dtype = DType::UInt8, .pinned_memory = true});
  uint8_t* h = host.data_ptr<uint8_t>();
  for (int64_t i = 0; i < kBytes; ++i) h[i] = static_cast<uint8_t>(i * 7 + 3);
  Tensor gpu = empty({kBytes}, {.dtype = DType::UInt8, .device = dev});
  gpu.copy_(host);
  Tensor back = empty({kBytes}, {.dtype = DType::UInt8, .pinned_memory = true});
  const float ms = to_device ? best_ms(5, [&] { gpu.copy_(host, true); }) : best_ms(5, [&] { back.copy_(gpu, true); });
  if (to_device) back.copy_(gpu);
  if (std::memcmp(back.data_ptr<uint8_t>(), h, kBytes) != 0) fail("the copied bytes differ from the source");
  r["detail"] = "256 MiB, pinned host memory, best of 5";
  r["value"] = kBytes / (ms * 1e-3) / 1e9;
  r["unit"] = "GB/s";
}

void gemm(json& r, int d) {
  // Correctness in float32 without TF32 against the CPU, then the rate of a bf16 4096^3 product (cuBLASLt).
  const Device dev = Device::cuda(d);
  const bool tf32 = cuda::allow_tf32();
  cuda::set_allow_tf32(false);
  Tensor a = randn({256, 192}), b = randn({192, 128});
  Tensor want = matmul(a, b);
  Tensor got = matmul(a.to(dev), b.to(dev)).to(Device::cpu());
  cuda::set_allow_tf32(tf32);
  const float err = checked_difference(got, want, "float32 256x192 @ 192x128");
  constexpr int64_t n = 4096;
  Tensor x = randn({n, n}, {.dtype = DType::BFloat16, .device = dev});
  Tensor w = randn({n, n}, {.dtype = DType::BFloat16, .device = dev});
  Tensor out = matmul(x, w);  // warm-up: the plan is chosen once per shape
  const float ms = best_ms(10, [&] { out = matmul(x, w); });
  r["detail"] = "float32 checked against the CPU (max error " + std::to_string(err) + "); bf16 4096^3, best of 10";
  r["value"] = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
  r["unit"] = "TFLOP/s";
}

void convolution(json& r, int d) {
  // A 3x3 convolution through cuDNN, against kiln's CPU convolution (composed of independent ops).
  const Device dev = Device::cuda(d);
  const bool tf32 = cuda::allow_tf32();
  cuda::set_allow_tf32(false);
  Tensor x = randn({8, 16, 32, 32}), w = randn({32, 16, 3, 3}), b = randn({32});  // (N, C, H, W), (K, C, 3, 3)
  Tensor want = nn::conv2d(x, w, b, {.padding = 1});
  Tensor got = nn::conv2d(x.to(dev), w.to(dev), b.to(dev), {.padding = 1}).to(Device::cpu());
  cuda::set_allow_tf32(tf32);
  const float err = checked_difference(got, want, "cuDNN's convolution");
  r["detail"] = "float32 (8, 16, 32, 32) * (32, 16, 3, 3), padding 1, max error " + std::to_string(err);
}

#define NCCL_OK(call)                                                                  \
  do {                                                                                 \
    ncclResult_t rc_ = (call);                                                         \
    if (rc_ != ncclSuccess) fail(std::string(#call) + ": " + ncclGetErrorString(rc_)); \
  } while (0)
#define CUDA_OK(call)                                                                                 \
  do {                                                                                                \
    cudaError_t rc_ = (call);                                                                         \
    if (rc_ != cudaSuccess)                                                                           \
      fail(std::string(#call) + ": " + cudaGetErrorName(rc_) + " (" + cudaGetErrorString(rc_) + ")"); \
  } while (0)

void all_reduce(json& r, int n) {
  // One process drives every GPU (ncclCommInitAll); GPU i contributes i + 1, so each element must end as
  // n (n + 1) / 2. 64 MiB per GPU; bus bandwidth as nccl-tests counts it: bytes * 2 (n - 1) / n / time.
  constexpr size_t kCount = 16u << 20;  // floats
  std::vector<ncclComm_t> comms(n);
  std::vector<int> devices(n);
  for (int i = 0; i < n; ++i) devices[i] = i;
  NCCL_OK(ncclCommInitAll(comms.data(), n, devices.data()));
  std::vector<float*> buffers(n, nullptr);
  std::vector<cudaStream_t> streams(n, nullptr);
  std::vector<cudaEvent_t> start(n, nullptr), stop(n, nullptr);
  std::string error;
  try {
    for (int i = 0; i < n; ++i) {
      cuda::DeviceGuard g(i);
      CUDA_OK(cudaMalloc(&buffers[i], kCount * sizeof(float)));
      CUDA_OK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
      CUDA_OK(cudaEventCreate(&start[i]));
      CUDA_OK(cudaEventCreate(&stop[i]));
    }
    auto fill_and_reduce = [&](bool timed) {
      for (int i = 0; i < n; ++i) {
        cuda::DeviceGuard g(i);
        std::vector<float> v(kCount, static_cast<float>(i + 1));
        CUDA_OK(cudaMemcpy(buffers[i], v.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
      }
      for (int i = 0; i < n; ++i) {
        cuda::DeviceGuard g(i);
        if (timed) CUDA_OK(cudaEventRecord(start[i], streams[i]));
      }
      NCCL_OK(ncclGroupStart());
      for (int i = 0; i < n; ++i) {
        NCCL_OK(ncclAllReduce(buffers[i], buffers[i], kCount, ncclFloat, ncclSum, comms[i], streams[i]));
      }
      NCCL_OK(ncclGroupEnd());
      for (int i = 0; i < n; ++i) {
        cuda::DeviceGuard g(i);
        if (timed) CUDA_OK(cudaEventRecord(stop[i], streams[i]));
        CUDA_OK(cudaStreamSynchronize(streams[i]));
      }
    };
    fill_and_reduce(false);  // warm-up: connections are set up on the first call
    fill_and_reduce(true);
    const float want = n * (n + 1) / 2.0f;
    float ms = 0;
    for (int i = 0; i < n; ++i) {
      cuda::DeviceGuard g(i);
      std::vector<float> v(kCount);
      CUDA_OK(cudaMemcpy(v.data(), buffers[i], kCount * sizeof(float), cudaMemcpyDeviceToHost));
      for (size_t k = 0; k < kCount; k += 997) {
        if (v[k] != want)
          fail("GPU " + std::to_string(i) + " holds " + std::to_string(v[k]) + ", not " + std::to_string(want));
      }
      float t = 0;
      CUDA_OK(cudaEventElapsedTime(&t, start[i], stop[i]));
      ms = std::max(ms, t);
    }
    const double bytes = kCount * sizeof(float);
    r["detail"] = std::to_string(n) + " GPU(s) in one process (ncclCommInitAll), 64 MiB float32 each, sum checked";
    if (n > 1) {
      r["value"] = bytes * 2.0 * (n - 1) / n / (ms * 1e-3) / 1e9;
      r["unit"] = "GB/s bus bandwidth";
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(i);
    if (buffers[i]) cudaFree(buffers[i]);
    if (streams[i]) cudaStreamDestroy(streams[i]);
    if (start[i]) cudaEventDestroy(start[i]);
    if (stop[i]) cudaEventDestroy(stop[i]);
    ncclCommDestroy(comms[i]);
  }
  if (!error.empty()) fail(error);
}

}  // namespace

extern "C" const char* kiln_doctor_run_checks(int /*flags*/) {
  static std::string text;
  json report;
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  report["runtime_version"] = runtime;
  report["driver_version"] = driver;
  // Asked first and directly: kiln's device_count() answers 0 for every failure, and the reason matters here
  // (a libcuda.so.1 the runtime cannot use, a driver too old for it).
  int visible = 0;
  const cudaError_t count_error = cudaGetDeviceCount(&visible);
  if (count_error != cudaSuccess) {
    report["device_error"] = std::string(cudaGetErrorName(count_error)) + " (" + cudaGetErrorString(count_error) + ")";
    cudaGetLastError();
  }
  json results = json::array();
  const int n = cuda::device_count();
  for (int d = 0; d < n; ++d) {
    cuda::DeviceGuard guard(d);
    run_check(results, "kernel launch", d, [&](json& r) { kernel_launch(r, d); });
    run_check(results, "copy host to device", d, [&](json& r) { copy(r, d, true); });
    run_check(results, "copy device to host", d, [&](json& r) { copy(r, d, false); });
    run_check(results, "cuBLAS GEMM", d, [&](json& r) { gemm(r, d); });
    run_check(results, "cuDNN convolution", d, [&](json& r) { convolution(r, d); });
  }
  if (n > 0) run_check(results, "NCCL all-reduce", -1, [&](json& r) { all_reduce(r, n); });
  report["results"] = std::move(results);
  text = report.dump();
  return text.c_str();
}
