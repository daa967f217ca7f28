// bench_cuda_reduce: GPU reductions against the device's copy bandwidth.
//
//   bench_cuda_reduce [--quick]
//
// A sum reads its input once, so its ceiling is the memory bandwidth. The reference is a
// device-to-device cudaMemcpyAsync of the same buffer in this program (it reads and writes: 2 bytes
// moved per byte copied). Target: a full float32 sum of 256M elements at >= 80% of the copy's rate.
// Shapes: a full sum, rows (sum over the last dim), columns (sum over dim 0), and a float32 var.
#include <cuda_runtime.h>

#include <kiln/kiln.h>
#include <kiln/tensor/cuda.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>  // std::exit
#include <functional>
#include <string>

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

// Warm-up runs, then the mean over `iters` runs. The device is synchronised around the timed runs
// (all its streams), so the figure holds whichever stream kiln launches on; at >= 20 runs of ~0.3 ms
// the synchronisation adds well under 1%.
double time_ms(int iters, const std::function<void()>& body) {
  for (int i = 0; i < 3; ++i) body();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) body();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - t0;
  return ms.count() / iters;
}

}  // namespace

int main(int argc, char** argv) {
  if (!kiln::cuda::is_available()) {
    std::printf("no GPU visible\n");
    return 0;
  }
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int iters = quick ? 2 : 20;
  const int64_t n = quick ? (int64_t{1} << 20) : (int64_t{1} << 28);  // 256M float32 = 1 GiB
  const double gb = static_cast<double>(n) * sizeof(float) / 1e9;
  const kiln::TensorOptions gpu{.dtype = kiln::DType::Float32, .device = kiln::Device::cuda(0)};
  kiln::Generator gen(1);
  kiln::Tensor x = kiln::rand({n}, gpu, &gen);
  kiln::Tensor y = kiln::empty({n}, gpu);

  const double copy_ms = time_ms(iters, [&] {
    check(cudaMemcpyAsync(y.data_ptr<float>(), x.data_ptr<float>(), static_cast<size_t>(n) * sizeof(float),
                          cudaMemcpyDeviceToDevice, nullptr),
          "cudaMemcpyAsync");
  });
  const double copy_bw = 2 * gb / (copy_ms * 1e-3);  // read + write
  std::printf("copy  d2d %8.3f ms  %7.1f GB/s (read + write)\n", copy_ms, copy_bw);

  auto report = [&](const char* name, double ms, double bytes_gb) {
    const double bw = bytes_gb / (ms * 1e-3);
    std::printf("%-34s %8.3f ms  %7.1f GB/s  %5.1f%% of copy\n", name, ms, bw, 100 * bw / copy_bw);
  };
  kiln::Tensor total;
  report("sum  (all)", time_ms(iters, [&] { total = kiln::sum(x); }), gb);
  const double got = total.cpu().item<double>(), expect = 0.5 * static_cast<double>(n);
  std::printf("  sum = %.6g (expected about %.6g)\n", got, expect);
  const int64_t cols = quick ? 1024 : 65536, rows = n / cols;
  kiln::Tensor m = x.view({rows, cols});
  report("sum  rows    (R, 65536) dim 1", time_ms(iters, [&] { total = kiln::sum(m, {1}); }), gb);
  kiln::Tensor t = x.view({cols, rows});
  report("sum  columns (65536, C) dim 0", time_ms(iters, [&] { total = kiln::sum(t, {0}); }), gb);
  kiln::Tensor narrow = x.view({n / 4, 4});
  report("sum  columns (N, 4) dim 0", time_ms(iters, [&] { total = kiln::sum(narrow, {0}); }), gb);
  report("var  (all, two passes: 2 reads)", time_ms(iters, [&] { total = kiln::var(x); }), 2 * gb);
  report("amax (all)", time_ms(iters, [&] { total = kiln::amax(x); }), gb);
  report("softmax (R, 1024) dim 1 (read + write)",
         time_ms(iters,
                 [&] {
                   total = kiln::softmax(x.view({n / 1024, 1024}), 1);
                 }),
         2 * gb);
  return 0;
}
