// kiln::monitor::gpu_stats and the NVML loader under it: without a GPU or driver (nothing, and the reason
// names what is missing), with fake NVML libraries (an old driver, a driver not loaded), and on real GPUs
// (Cuda*: the figures against what CUDA says, under load, and the cost of a call).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include <chrono>
#include <iostream>
#include <thread>

#include "kiln/autograd/functions.h"
#include "kiln/monitor/gpu_monitor.h"
#include "kiln/monitor/nvml/nvml_library.h"
#include "kiln/tensor/cuda.h"

#if KILN_TEST_CUDA
#include <cuda_runtime.h>
#endif

namespace kiln {
namespace {

using ::testing::HasSubstr;

TEST(GpuMonitor, WithoutAGpuGivesNothingAndSaysWhy) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  EXPECT_FALSE(monitor::gpu_stats(0).has_value());
  EXPECT_THAT(monitor::gpu_stats_unavailable_reason(0), HasSubstr("no CUDA device is visible to kiln"));
  if (!monitor::nvml_available()) {
    const std::string why = monitor::nvml_unavailable_reason();
    if (monitor::nvml::built_with_header()) {
      EXPECT_THAT(why, HasSubstr("no NVIDIA driver's NVML library (libnvidia-ml.so.1) found"));
    } else {
      EXPECT_THAT(why, HasSubstr("kiln was built without nvml.h (PyPI's nvidia-nvml-dev): run scripts/setup.sh"));
    }
  }
}

TEST(GpuMonitor, DeviceThatDoesNotExist) {
  const int n = cuda::device_count();
  EXPECT_FALSE(monitor::gpu_stats(n).has_value());
  EXPECT_FALSE(monitor::gpu_stats(-1).has_value());
  if (n > 0) {
    EXPECT_THAT(monitor::gpu_stats_unavailable_reason(n), HasSubstr("there is no cuda:" + std::to_string(n)));
  }
}

TEST(GpuMonitor, FormatLeavesOutWhatIsNotReported) {
  monitor::GpuStats s;
  s.utilization_percent = 97;
  s.memory_used_bytes = 61'200'000'000;
  s.memory_total_bytes = 143'800'000'000;
  s.power_watts = 512.4;
  s.power_limit_watts = 700;
  s.temperature_c = 63;
  EXPECT_EQ(monitor::format_gpu_stats(s), "gpu 97%  mem 61.2/143.8 GB  512/700 W  63 C");
  s.utilization_percent = -1;  // under MIG
  s.power_watts = -1;
  s.temperature_c = -1;
  EXPECT_EQ(monitor::format_gpu_stats(s), "mem 61.2/143.8 GB");
}

TEST(NvmlLibrary, MissingLibraryNamesItAndTheFix) {
  const monitor::nvml::Library lib("libnvidia-ml-not-here.so.1");
  EXPECT_FALSE(lib.ok());
  if (!monitor::nvml::built_with_header()) GTEST_SKIP() << lib.error();
  EXPECT_THAT(lib.error(), HasSubstr("no NVIDIA driver's NVML library (libnvidia-ml-not-here.so.1) found"));
  EXPECT_THAT(lib.error(), HasSubstr("install the NVIDIA driver"));
  EXPECT_EQ(lib.device_count(), 0);
  std::string why;
  EXPECT_FALSE(lib.device_by_pci_bus_id("0000:3B:00.0", &why).has_value());
  EXPECT_EQ(why, lib.error());
}

TEST(NvmlLibrary, DriverTooOldForTheFunctionsKilnNeeds) {
  if (!monitor::nvml::built_with_header()) GTEST_SKIP() << "built without nvml.h";
  const monitor::nvml::Library lib(KILN_FAKE_NVML_OLD);
  EXPECT_FALSE(lib.ok());
  EXPECT_THAT(lib.error(), HasSubstr("lacks nvmlDeviceGetHandleByPciBusId_v2, nvmlDeviceGetMemoryInfo"));
  EXPECT_THAT(lib.error(), HasSubstr("the NVIDIA driver is too old"));
  EXPECT_EQ(lib.loaded_from(), KILN_FAKE_NVML_OLD);
}

TEST(NvmlLibrary, KernelDriverNotLoaded) {
  if (!monitor::nvml::built_with_header()) GTEST_SKIP() << "built without nvml.h";
  const monitor::nvml::Library lib(KILN_FAKE_NVML_NO_DRIVER);
  EXPECT_FALSE(lib.ok());
  EXPECT_THAT(lib.error(), HasSubstr("nvmlInit: Driver Not Loaded"));
  EXPECT_THAT(lib.error(), HasSubstr("the NVIDIA kernel driver is not loaded"));
}

TEST(CudaGpuMonitor, StatsOfEveryVisibleGpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU visible";
  ASSERT_TRUE(monitor::nvml_available()) << monitor::nvml_unavailable_reason();
  for (int d = 0; d < cuda::device_count(); ++d) {
    auto s = monitor::gpu_stats(d);
    ASSERT_TRUE(s.has_value()) << monitor::gpu_stats_unavailable_reason(d);
    EXPECT_EQ(monitor::gpu_stats_unavailable_reason(d), "");
    std::cout << "cuda:" << d << " (" << cuda::pci_bus_id(d) << "): " << monitor::format_gpu_stats(*s) << ", SM "
              << s->sm_clock_mhz << " MHz\n";
    EXPECT_EQ(s->device, d);
    EXPECT_GE(s->utilization_percent, 0);
    EXPECT_LE(s->utilization_percent, 100);
    EXPECT_GE(s->memory_utilization_percent, 0);
    EXPECT_LE(s->memory_utilization_percent, 100);
    EXPECT_GT(s->power_watts, 0);
    EXPECT_GT(s->power_limit_watts, 0);
    EXPECT_GT(s->temperature_c, 0);
    EXPECT_GT(s->sm_clock_mhz, 0);
    EXPECT_GT(s->memory_used_bytes, 0);
    EXPECT_LE(s->memory_used_bytes, s->memory_total_bytes);
#if KILN_TEST_CUDA
    // NVML counts all of the GPU's memory; CUDA leaves out what the driver reserves for itself (a few hundred
    // MiB), so CUDA's total is a little smaller, never larger.
    cuda::DeviceGuard guard(d);
    size_t free_bytes = 0, total_bytes = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
    std::cout << "  memory total: NVML " << s->memory_total_bytes << ", CUDA " << total_bytes << "\n";
    EXPECT_GE(s->memory_total_bytes, static_cast<int64_t>(total_bytes));
    EXPECT_LE(s->memory_total_bytes - static_cast<int64_t>(total_bytes), s->memory_total_bytes / 20);
#endif
  }
}

TEST(CudaGpuMonitor, MemoryAndUtilizationFollowTheWork) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU visible";
  ASSERT_TRUE(monitor::nvml_available()) << monitor::nvml_unavailable_reason();
  const Device dev = Device::cuda(0);
  const auto before = monitor::gpu_stats(0);
  ASSERT_TRUE(before.has_value());
  Tensor a = randn({8192, 8192}, {.dtype = DType::BFloat16, .device = dev});
  Tensor b = randn({8192, 8192}, {.dtype = DType::BFloat16, .device = dev});
  Tensor c = matmul(a, b);
  cuda::synchronize(0);
  // Keep launching products for 1.5 s: the launch queue fills and the host waits on it, so the GPU is busy
  // all along and still has queued work when the loop ends. NVML's utilisation covers its last sample period
  // (1/6 s to 1 s), so the reading taken then must show a busy GPU.
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1500)) c = matmul(a, b);
  const auto busy = monitor::gpu_stats(0);
  const bool still_running = !cuda::current_stream(0).query();
  cuda::synchronize(0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(busy.has_value());
  std::cout << "before: " << monitor::format_gpu_stats(*before) << "\nbusy:   " << monitor::format_gpu_stats(*busy)
            << " (the products took " << seconds << " s)\n";
  ASSERT_TRUE(still_running) << "the work ended before the reading; make it longer";
  EXPECT_GE(busy->utilization_percent, 50);
  EXPECT_GE(busy->memory_used_bytes - before->memory_used_bytes, 3 * 8192ll * 8192 * 2 * 9 / 10);  // a, b, c
}

TEST(CudaGpuMonitor, CheapEnoughForAProgressLine) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU visible";
  ASSERT_TRUE(monitor::gpu_stats(0).has_value()) << monitor::gpu_stats_unavailable_reason(0);
  // The median of many calls: a machine busy with other work makes single calls slow now and then.
  constexpr int kCalls = 201;
  std::vector<double> times;
  for (int i = 0; i < kCalls; ++i) {
    const auto t = std::chrono::steady_clock::now();
    ASSERT_TRUE(monitor::gpu_stats(0).has_value());
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count());
  }
  std::sort(times.begin(), times.end());
  const double us = times[kCalls / 2];
  std::cout << "gpu_stats: median " << us << " us per call (fastest " << times.front() << ", slowest " << times.back()
            << ")\n";
  EXPECT_LT(us, 2000.0);  // a progress line every few steps of tens of milliseconds
}

}  // namespace
}  // namespace kiln
