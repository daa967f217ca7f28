// kiln/monitor/gpu_monitor.h — what a GPU is doing now: utilisation, memory, power, temperature, clock,
// read through NVML (the NVIDIA driver's management library).
//
//   using namespace kiln;
//   if (auto s = monitor::gpu_stats(0)) {               // kiln's cuda:0 (CUDA_VISIBLE_DEVICES honoured)
//     std::cout << "step " << step << "  " << monitor::format_gpu_stats(*s) << "\n";
//     // "gpu 97%  mem 61.2/143.8 GB  512/700 W  63 C"
//   } else {
//     std::cout << monitor::gpu_stats_unavailable_reason(0) << "\n";  // what is missing, what to do
//   }
//
// A call is a few driver queries (tens of microseconds) and never waits for the GPU, so a progress line may
// call it every few steps. NVML is loaded at run time, not linked: it comes with the driver, so programs
// still start without one, and then gpu_stats returns nothing and the reason says why.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kiln::monitor {

// One reading of one GPU. A value this GPU does not report stays at -1 (utilisation under MIG, power and
// temperature on some boards).
struct GpuStats {
  int device = 0;                       // kiln's CUDA device index (cuda:<device>)
  int utilization_percent = -1;         // share of NVML's last sample period (1/6 s to 1 s) with a kernel running
  int memory_utilization_percent = -1;  // share of that period with device memory being read or written
  int64_t memory_used_bytes = 0;        // by every process and the driver, as nvidia-smi counts it
  int64_t memory_total_bytes = 0;       // the GPU's memory; a little more than CUDA lets kiln allocate
  double power_watts = -1;              // the board's draw now
  double power_limit_watts = -1;        // the enforced limit
  int temperature_c = -1;               // the GPU die's, in degrees Celsius
  int sm_clock_mhz = -1;                // the SM clock now, in MHz
};

// Whether NVML is loaded and started (libnvidia-ml.so.1 found, the driver answers, kiln built with nvml.h).
bool nvml_available();
// Why not: names the missing piece and the fix. Empty when nvml_available().
std::string nvml_unavailable_reason();

// The stats of kiln's CUDA device `cuda_device`, matched to NVML's GPU through its PCI bus id. Nothing when
// there is no such GPU or NVML is unavailable; gpu_stats_unavailable_reason then says which.
std::optional<GpuStats> gpu_stats(int cuda_device);
std::string gpu_stats_unavailable_reason(int cuda_device);  // empty when gpu_stats(cuda_device) has a value

// One short line for a progress display: "gpu 97%  mem 61.2/143.8 GB  512/700 W  63 C" (unreported parts left out).
std::string format_gpu_stats(const GpuStats& stats);

}  // namespace kiln::monitor
