// kiln/monitor/nvml/nvml_library.h — NVML, the NVIDIA driver's management library, loaded at run time
// (private to kiln_monitor and kiln-doctor; not installed).
//
//   const auto& nvml = kiln::monitor::nvml::Library::instance();  // dlopen + nvmlInit, once per process
//   if (!nvml.ok()) { std::cerr << nvml.error() << "\n"; return; }
//   auto dev = nvml.device_by_pci_bus_id("0000:3B:00.0");         // the id kiln::cuda::pci_bus_id gives
//   nvml::Sample s;
//   if (dev && nvml.sample(*dev, &s)) std::cout << s.gpu_utilization_percent << "% busy\n";
//
// Why loaded and not linked: libnvidia-ml.so.1 comes with the driver, not with the CUDA toolkit, so a
// program linked to it would not even start on a machine without a driver (CI, a laptop). Here a missing
// library, a driver too old for a function, or a build without nvml.h are answers (error()), not crashes.
// Nothing here includes nvml.h or needs the CUDA runtime: kiln-doctor uses it where CUDA is broken.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::monitor::nvml {

using DeviceHandle = void*;  // an nvmlDevice_t; valid while the process runs

// What a GPU is: read once (kiln-doctor's GPU section). Fields NVML does not report on this GPU are left
// at their defaults (-1, empty, nullopt).
struct DeviceInfo {
  std::string name;
  std::string pci_bus_id;  // NVML's form: "00000000:3B:00.0"
  std::string uuid;
  int compute_capability_major = -1;
  int compute_capability_minor = -1;
  uint64_t memory_total_bytes = 0;
  int max_sm_clock_mhz = -1;
  int max_memory_clock_mhz = -1;
  double power_limit_watts = -1;
  std::optional<bool> ecc_enabled;        // nullopt: the GPU has no ECC (or does not say)
  int nvlinks_active = 0;                 // NVLink links up
  std::vector<std::string> nvlink_peers;  // PCI bus ids of the other GPUs this one reaches over NVLink
};

// What a GPU is doing now (kiln::monitor::gpu_stats). -1 where this GPU does not report a value.
struct Sample {
  int gpu_utilization_percent = -1;     // share of the last sample period a kernel was running
  int memory_utilization_percent = -1;  // share of that period device memory was read or written
  uint64_t memory_used_bytes = 0;
  uint64_t memory_total_bytes = 0;
  double power_watts = -1;
  double power_limit_watts = -1;
  int temperature_c = -1;
  int sm_clock_mhz = -1;
};

class Library {
 public:
  // libnvidia-ml.so.1, loaded and initialised on first use; shut down at exit.
  static const Library& instance();

  // Loads the library at `path` (a soname or a file) and initialises NVML. Tests use it with fake libraries.
  explicit Library(const char* path);
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  bool ok() const { return error_.empty(); }
  // Why NVML is not usable: what is missing and what to do. Empty when ok().
  const std::string& error() const { return error_; }
  const std::string& loaded_from() const { return path_; }  // the library file, once loaded

  std::string driver_version() const;  // "580.159"; empty when not ok()
  int cuda_driver_version() const;     // the highest CUDA the driver supports, 13000 = 13.0; 0 if unknown
  int device_count() const;            // every GPU of the machine: NVML ignores CUDA_VISIBLE_DEVICES

  // Device handles. On failure nullopt, and *why (when given) says what NVML answered.
  std::optional<DeviceHandle> device_by_index(int nvml_index, std::string* why = nullptr) const;
  std::optional<DeviceHandle> device_by_pci_bus_id(const std::string& bus_id, std::string* why = nullptr) const;

  DeviceInfo device_info(DeviceHandle device) const;
  // Reads utilisation, memory, power, temperature and clock: a few driver calls, no GPU synchronisation.
  bool sample(DeviceHandle device, Sample* out, std::string* why = nullptr) const;

  struct Functions;  // the resolved entry points (nvml_library.cpp)

 private:
  void* handle_ = nullptr;  // from dlopen
  Functions* fn_ = nullptr;
  bool initialised_ = false;
  std::string path_;
  std::string error_;
};

// Whether this build had nvml.h (PyPI's nvidia-nvml-dev in third_party/nvml/) to compile against.
bool built_with_header();
// The NVML API version of that header (e.g. 13); 0 when built without it.
int header_api_version();

}  // namespace kiln::monitor::nvml
