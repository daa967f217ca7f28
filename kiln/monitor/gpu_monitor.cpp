// gpu_stats: kiln's CUDA device -> its PCI bus id -> NVML's handle (found once, cached) -> a sample.
#include "kiln/monitor/gpu_monitor.h"

#include <cstdio>
#include <mutex>
#include <vector>

#include "kiln/monitor/nvml/nvml_library.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/error.h"

namespace kiln::monitor {
namespace {

// The NVML handle of each CUDA device, or why there is none. Looked up on first use: the PCI bus id and the
// handle do not change while the process runs, and finding them costs more than a sample.
struct DeviceEntry {
  bool looked_up = false;
  nvml::DeviceHandle handle = nullptr;
  std::string error;
};

class DeviceTable {
 public:
  // Returns the handle of `cuda_device`, or nullptr with *error set.
  nvml::DeviceHandle find(int cuda_device, std::string* error) {
    const int n = cuda::device_count();
    if (n == 0) {
      *error =
          "no CUDA device is visible to kiln (a build without CUDA, no driver, or CUDA_VISIBLE_DEVICES "
          "hides every GPU): run kiln-doctor to see which";
      return nullptr;
    }
    if (cuda_device < 0 || cuda_device >= n) {
      *error = "there is no cuda:" + std::to_string(cuda_device) + "; " + std::to_string(n) + " GPU(s) are visible";
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.empty()) entries_.resize(static_cast<size_t>(n));
    DeviceEntry& e = entries_[static_cast<size_t>(cuda_device)];
    if (!e.looked_up) {
      e.looked_up = true;
      const nvml::Library& lib = nvml::Library::instance();
      if (!lib.ok()) {
        e.error = lib.error();
      } else {
        try {
          const std::string bus_id = cuda::pci_bus_id(cuda_device);
          if (auto h = lib.device_by_pci_bus_id(bus_id, &e.error)) e.handle = *h;
        } catch (const Error& err) {
          e.error = err.what();
        }
      }
    }
    if (!e.handle) *error = e.error;
    return e.handle;
  }

 private:
  std::mutex mutex_;
  std::vector<DeviceEntry> entries_;
};

DeviceTable& table() {
  static DeviceTable t;
  return t;
}

}  // namespace

bool nvml_available() { return nvml::Library::instance().ok(); }

std::string nvml_unavailable_reason() { return nvml::Library::instance().error(); }

std::optional<GpuStats> gpu_stats(int cuda_device) {
  std::string error;
  nvml::DeviceHandle h = table().find(cuda_device, &error);
  if (!h) return std::nullopt;
  nvml::Sample s;
  if (!nvml::Library::instance().sample(h, &s)) return std::nullopt;
  GpuStats out;
  out.device = cuda_device;
  out.utilization_percent = s.gpu_utilization_percent;
  out.memory_utilization_percent = s.memory_utilization_percent;
  out.memory_used_bytes = static_cast<int64_t>(s.memory_used_bytes);
  out.memory_total_bytes = static_cast<int64_t>(s.memory_total_bytes);
  out.power_watts = s.power_watts;
  out.power_limit_watts = s.power_limit_watts;
  out.temperature_c = s.temperature_c;
  out.sm_clock_mhz = s.sm_clock_mhz;
  return out;
}

std::string gpu_stats_unavailable_reason(int cuda_device) {
  std::string error;
  nvml::DeviceHandle h = table().find(cuda_device, &error);
  if (!h) return error;
  nvml::Sample s;
  if (!nvml::Library::instance().sample(h, &s, &error)) return error;
  return {};
}

std::string format_gpu_stats(const GpuStats& s) {
  char buf[160];
  std::string line;
  if (s.utilization_percent >= 0) {
    std::snprintf(buf, sizeof(buf), "gpu %d%%", s.utilization_percent);
    line += buf;
  }
  if (s.memory_total_bytes > 0) {
    std::snprintf(buf, sizeof(buf), "%smem %.1f/%.1f GB", line.empty() ? "" : "  ", s.memory_used_bytes / 1e9,
                  s.memory_total_bytes / 1e9);
    line += buf;
  }
  if (s.power_watts >= 0) {
    if (s.power_limit_watts > 0) {
      std::snprintf(buf, sizeof(buf), "%s%.0f/%.0f W", line.empty() ? "" : "  ", s.power_watts, s.power_limit_watts);
    } else {
      std::snprintf(buf, sizeof(buf), "%s%.0f W", line.empty() ? "" : "  ", s.power_watts);
    }
    line += buf;
  }
  if (s.temperature_c >= 0) {
    std::snprintf(buf, sizeof(buf), "%s%d C", line.empty() ? "" : "  ", s.temperature_c);
    line += buf;
  }
  return line;
}

}  // namespace kiln::monitor
