// NVML through dlopen: the entry points kiln uses, resolved by name from the driver's libnvidia-ml.so.1.
#include "kiln/monitor/nvml/nvml_library.h"

#include <dlfcn.h>
#include <link.h>

#if KILN_WITH_NVML_H
#include <nvml.h>
#endif

namespace kiln::monitor::nvml {

#if KILN_WITH_NVML_H

// Declared types from nvml.h keep the calls honest: a signature that changed in the header fails to compile.
// The versioned names (_v2) are the ones the header's macros map the plain names to; dlsym needs them spelt.
struct Library::Functions {
  decltype(&nvmlInit_v2) init = nullptr;
  decltype(&nvmlShutdown) shutdown = nullptr;
  decltype(&nvmlErrorString) error_string = nullptr;
  decltype(&nvmlSystemGetDriverVersion) driver_version = nullptr;
  decltype(&nvmlDeviceGetCount_v2) device_count = nullptr;
  decltype(&nvmlDeviceGetHandleByIndex_v2) handle_by_index = nullptr;
  decltype(&nvmlDeviceGetHandleByPciBusId_v2) handle_by_pci_bus_id = nullptr;
  decltype(&nvmlDeviceGetMemoryInfo) memory_info = nullptr;
  decltype(&nvmlDeviceGetUtilizationRates) utilization = nullptr;
  // Optional: a driver without them still gives the fields above.
  decltype(&nvmlSystemGetCudaDriverVersion_v2) cuda_driver_version = nullptr;
  decltype(&nvmlDeviceGetName) name = nullptr;
  decltype(&nvmlDeviceGetUUID) uuid = nullptr;
  decltype(&nvmlDeviceGetPciInfo_v3) pci_info = nullptr;
  decltype(&nvmlDeviceGetCudaComputeCapability) compute_capability = nullptr;
  decltype(&nvmlDeviceGetClockInfo) clock = nullptr;
  decltype(&nvmlDeviceGetMaxClockInfo) max_clock = nullptr;
  decltype(&nvmlDeviceGetPowerUsage) power = nullptr;
  decltype(&nvmlDeviceGetEnforcedPowerLimit) power_limit = nullptr;
  // Deprecated in the 13.0 header in favour of nvmlDeviceGetTemperatureV, which older drivers lack; typed
  // by hand so that naming it does not warn.
  nvmlReturn_t (*temperature)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned int*) = nullptr;
  decltype(&nvmlDeviceGetEccMode) ecc_mode = nullptr;
  decltype(&nvmlDeviceGetNvLinkState) nvlink_state = nullptr;
  decltype(&nvmlDeviceGetP2PStatus) p2p_status = nullptr;
};

namespace {
template <class F>
bool resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

std::string text(const Library::Functions& fn, nvmlReturn_t r) {
  const char* s = fn.error_string ? fn.error_string(r) : nullptr;
  return s ? std::string(s) : "NVML error " + std::to_string(static_cast<int>(r));
}
}  // namespace

Library::Library(const char* path) {
  handle_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* why = dlerror();
    error_ = std::string("no NVIDIA driver's NVML library (") + path + ") found: " + (why ? why : "dlopen failed") +
             "; install the NVIDIA driver (NVML comes with it), or in a container start it with the GPUs "
             "(docker run --gpus all)";
    return;
  }
  link_map* map = nullptr;
  if (dlinfo(handle_, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) path_ = map->l_name;
  if (path_.empty()) path_ = path;

  fn_ = new Functions;
  Functions& f = *fn_;
  std::string missing;
  auto need = [&](const char* name, auto* slot) {
    if (!resolve(handle_, name, slot)) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  need("nvmlInit_v2", &f.init);
  need("nvmlShutdown", &f.shutdown);
  need("nvmlErrorString", &f.error_string);
  need("nvmlSystemGetDriverVersion", &f.driver_version);
  need("nvmlDeviceGetCount_v2", &f.device_count);
  need("nvmlDeviceGetHandleByIndex_v2", &f.handle_by_index);
  need("nvmlDeviceGetHandleByPciBusId_v2", &f.handle_by_pci_bus_id);
  need("nvmlDeviceGetMemoryInfo", &f.memory_info);
  need("nvmlDeviceGetUtilizationRates", &f.utilization);
  if (!missing.empty()) {
    error_ = path_ + " lacks " + missing +
             ": the NVIDIA driver is too old for kiln's GPU monitoring (or this is not NVML); update the driver";
    return;
  }
  resolve(handle_, "nvmlSystemGetCudaDriverVersion_v2", &f.cuda_driver_version);
  resolve(handle_, "nvmlDeviceGetName", &f.name);
  resolve(handle_, "nvmlDeviceGetUUID", &f.uuid);
  resolve(handle_, "nvmlDeviceGetPciInfo_v3", &f.pci_info);
  resolve(handle_, "nvmlDeviceGetCudaComputeCapability", &f.compute_capability);
  resolve(handle_, "nvmlDeviceGetClockInfo", &f.clock);
  resolve(handle_, "nvmlDeviceGetMaxClockInfo", &f.max_clock);
  resolve(handle_, "nvmlDeviceGetPowerUsage", &f.power);
  resolve(handle_, "nvmlDeviceGetEnforcedPowerLimit", &f.power_limit);
  resolve(handle_, "nvmlDeviceGetTemperature", &f.temperature);
  resolve(handle_, "nvmlDeviceGetEccMode", &f.ecc_mode);
  resolve(handle_, "nvmlDeviceGetNvLinkState", &f.nvlink_state);
  resolve(handle_, "nvmlDeviceGetP2PStatus", &f.p2p_status);

  const nvmlReturn_t r = f.init();
  if (r != NVML_SUCCESS) {
    error_ = "NVML (" + path_ + ") could not start: nvmlInit: " + text(f, r);
    if (r == NVML_ERROR_DRIVER_NOT_LOADED) {
      error_ += "; the NVIDIA kernel driver is not loaded (check nvidia-smi; reinstall the driver or reboot)";
    } else if (r == NVML_ERROR_NO_PERMISSION) {
      error_ += "; this user may not open /dev/nvidia* (add it to the group that owns them)";
    } else if (r == NVML_ERROR_LIB_RM_VERSION_MISMATCH) {
      error_ += "; the driver library and the loaded kernel module differ (after a driver update: reboot)";
    }
    return;
  }
  initialised_ = true;
}

Library::~Library() {
  if (initialised_) fn_->shutdown();
  delete fn_;
  if (handle_) dlclose(handle_);
}

std::string Library::driver_version() const {
  if (!ok()) return {};
  char v[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
  return fn_->driver_version(v, sizeof(v)) == NVML_SUCCESS ? std::string(v) : std::string();
}

int Library::cuda_driver_version() const {
  int v = 0;
  if (!ok() || !fn_->cuda_driver_version || fn_->cuda_driver_version(&v) != NVML_SUCCESS) return 0;
  return v;
}

int Library::device_count() const {
  unsigned n = 0;
  if (!ok() || fn_->device_count(&n) != NVML_SUCCESS) return 0;
  return static_cast<int>(n);
}

std::optional<DeviceHandle> Library::device_by_index(int nvml_index, std::string* why) const {
  if (!ok()) {
    if (why) *why = error_;
    return std::nullopt;
  }
  nvmlDevice_t d = nullptr;
  const nvmlReturn_t r = fn_->handle_by_index(static_cast<unsigned>(nvml_index), &d);
  if (r != NVML_SUCCESS) {
    if (why) *why = "NVML has no GPU " + std::to_string(nvml_index) + ": " + text(*fn_, r);
    return std::nullopt;
  }
  return static_cast<DeviceHandle>(d);
}

std::optional<DeviceHandle> Library::device_by_pci_bus_id(const std::string& bus_id, std::string* why) const {
  if (!ok()) {
    if (why) *why = error_;
    return std::nullopt;
  }
  nvmlDevice_t d = nullptr;
  const nvmlReturn_t r = fn_->handle_by_pci_bus_id(bus_id.c_str(), &d);
  if (r != NVML_SUCCESS) {
    if (why) *why = "NVML knows no GPU at PCI bus id " + bus_id + ": " + text(*fn_, r);
    return std::nullopt;
  }
  return static_cast<DeviceHandle>(d);
}

DeviceInfo Library::device_info(DeviceHandle device) const {
  DeviceInfo info;
  if (!ok()) return info;
  auto d = static_cast<nvmlDevice_t>(device);
  const Functions& f = *fn_;
  char buf[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
  if (f.name && f.name(d, buf, sizeof(buf)) == NVML_SUCCESS) info.name = buf;
  char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
  if (f.uuid && f.uuid(d, uuid, sizeof(uuid)) == NVML_SUCCESS) info.uuid = uuid;
  nvmlPciInfo_t pci{};
  if (f.pci_info && f.pci_info(d, &pci) == NVML_SUCCESS) info.pci_bus_id = pci.busId;
  int major = -1, minor = -1;
  if (f.compute_capability && f.compute_capability(d, &major, &minor) == NVML_SUCCESS) {
    info.compute_capability_major = major;
    info.compute_capability_minor = minor;
  }
  nvmlMemory_t mem{};
  if (f.memory_info(d, &mem) == NVML_SUCCESS) info.memory_total_bytes = mem.total;
  unsigned v = 0;
  if (f.max_clock && f.max_clock(d, NVML_CLOCK_SM, &v) == NVML_SUCCESS) info.max_sm_clock_mhz = static_cast<int>(v);
  if (f.max_clock && f.max_clock(d, NVML_CLOCK_MEM, &v) == NVML_SUCCESS) {
    info.max_memory_clock_mhz = static_cast<int>(v);
  }
  if (f.power_limit && f.power_limit(d, &v) == NVML_SUCCESS) info.power_limit_watts = v / 1000.0;
  nvmlEnableState_t current{}, pending{};
  if (f.ecc_mode && f.ecc_mode(d, &current, &pending) == NVML_SUCCESS) {
    info.ecc_enabled = current == NVML_FEATURE_ENABLED;
  }
  if (f.nvlink_state) {
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
      nvmlEnableState_t active{};
      const nvmlReturn_t r = f.nvlink_state(d, link, &active);
      if (r == NVML_ERROR_NOT_SUPPORTED) break;  // no NVLink at all (PCIe cards), or no more links
      if (r == NVML_SUCCESS && active == NVML_FEATURE_ENABLED) ++info.nvlinks_active;
    }
  }
  // Which other GPUs are reached over NVLink (through an NVSwitch or directly): the peers NCCL will use.
  if (f.p2p_status && info.nvlinks_active > 0) {
    const int n = device_count();
    for (int i = 0; i < n; ++i) {
      nvmlDevice_t other = nullptr;
      if (f.handle_by_index(static_cast<unsigned>(i), &other) != NVML_SUCCESS || other == d) continue;
      nvmlGpuP2PStatus_t status{};
      if (f.p2p_status(d, other, NVML_P2P_CAPS_INDEX_NVLINK, &status) == NVML_SUCCESS && status == NVML_P2P_STATUS_OK) {
        nvmlPciInfo_t other_pci{};
        if (f.pci_info && f.pci_info(other, &other_pci) == NVML_SUCCESS) info.nvlink_peers.push_back(other_pci.busId);
      }
    }
  }
  return info;
}

bool Library::sample(DeviceHandle device, Sample* out, std::string* why) const {
  if (!ok()) {
    if (why) *why = error_;
    return false;
  }
  auto d = static_cast<nvmlDevice_t>(device);
  const Functions& f = *fn_;
  Sample s;
  nvmlMemory_t mem{};
  const nvmlReturn_t r = f.memory_info(d, &mem);
  if (r != NVML_SUCCESS) {  // the GPU fell off the bus, or the handle is stale
    if (why) *why = "NVML could not read the GPU's memory: " + text(f, r);
    return false;
  }
  s.memory_used_bytes = mem.used;
  s.memory_total_bytes = mem.total;
  nvmlUtilization_t u{};
  if (f.utilization(d, &u) == NVML_SUCCESS) {  // NOT_SUPPORTED under MIG
    s.gpu_utilization_percent = static_cast<int>(u.gpu);
    s.memory_utilization_percent = static_cast<int>(u.memory);
  }
  unsigned v = 0;
  if (f.power && f.power(d, &v) == NVML_SUCCESS) s.power_watts = v / 1000.0;  // milliwatts
  if (f.power_limit && f.power_limit(d, &v) == NVML_SUCCESS) s.power_limit_watts = v / 1000.0;
  if (f.temperature && f.temperature(d, NVML_TEMPERATURE_GPU, &v) == NVML_SUCCESS)
    s.temperature_c = static_cast<int>(v);
  if (f.clock && f.clock(d, NVML_CLOCK_SM, &v) == NVML_SUCCESS) s.sm_clock_mhz = static_cast<int>(v);
  *out = s;
  return true;
}

bool built_with_header() { return true; }
int header_api_version() { return NVML_API_VERSION; }

#else  // built without nvml.h: every answer is "not available", and says how to get it

struct Library::Functions {};

Library::Library(const char*) {
  error_ = "kiln was built without nvml.h (PyPI's nvidia-nvml-dev): run scripts/setup.sh and rebuild";
}
Library::~Library() = default;
std::string Library::driver_version() const { return {}; }
int Library::cuda_driver_version() const { return 0; }
int Library::device_count() const { return 0; }
std::optional<DeviceHandle> Library::device_by_index(int, std::string* why) const {
  if (why) *why = error_;
  return std::nullopt;
}
std::optional<DeviceHandle> Library::device_by_pci_bus_id(const std::string&, std::string* why) const {
  if (why) *why = error_;
  return std::nullopt;
}
DeviceInfo Library::device_info(DeviceHandle) const { return {}; }
bool Library::sample(DeviceHandle, Sample*, std::string* why) const {
  if (why) *why = error_;
  return false;
}
bool built_with_header() { return false; }
int header_api_version() { return 0; }

#endif

const Library& Library::instance() {
  static const Library library("libnvidia-ml.so.1");
  return library;
}

}  // namespace kiln::monitor::nvml
