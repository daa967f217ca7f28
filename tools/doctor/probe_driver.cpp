// The driver and the GPUs: the CUDA driver API from libcuda.so.1 (opened here, never linked) for what CUDA
// sees, and NVML (kiln_nvml) for what the driver knows beyond it: ECC, NVLink, power, GPUs hidden from CUDA.
#include <dlfcn.h>

#include <cstdio>
#include <fstream>
#include <regex>

#include "gather.h"
#include "kiln/monitor/nvml/nvml_library.h"

#if __has_include(<cuda.h>)
#include <cuda.h>
#endif

namespace kiln::doctor {
namespace {

// The driver API's types and the attribute numbers used here: stable ABI values of cuda.h, written out so
// that the doctor builds without the CUDA toolkit (and checked against cuda.h where it is there).
using CuResult = int;
using CuDevice = int;
constexpr int kAttrClockRate = 13;  // kHz
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrMemoryClockRate = 36;       // kHz
constexpr int kAttrGlobalMemoryBusWidth = 37;  // bits
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
#if __has_include(<cuda.h>)
static_assert(kAttrClockRate == CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
static_assert(kAttrMultiprocessorCount == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
static_assert(kAttrMemoryClockRate == CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
static_assert(kAttrGlobalMemoryBusWidth == CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
static_assert(kAttrComputeCapabilityMajor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
static_assert(kAttrComputeCapabilityMinor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
#endif

struct DriverApi {
  CuResult (*init)(unsigned) = nullptr;
  CuResult (*driver_get_version)(int*) = nullptr;
  CuResult (*device_get_count)(int*) = nullptr;
  CuResult (*device_get)(CuDevice*, int) = nullptr;
  CuResult (*device_get_name)(char*, int, CuDevice) = nullptr;
  CuResult (*device_get_attribute)(int*, int, CuDevice) = nullptr;
  CuResult (*device_total_mem)(size_t*, CuDevice) = nullptr;
  CuResult (*device_get_pci_bus_id)(char*, int, CuDevice) = nullptr;
  CuResult (*get_error_name)(CuResult, const char**) = nullptr;
  CuResult (*get_error_string)(CuResult, const char**) = nullptr;
};

template <class F>
void resolve(void* h, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(h, name));
}

std::string error_text(const DriverApi& api, CuResult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.get_error_name) api.get_error_name(r, &name);
  if (api.get_error_string) api.get_error_string(r, &text);
  std::string s = name ? name : "CUresult " + std::to_string(r);
  if (text) s += std::string(": ") + text;
  return s;
}

// "0000:3B:00.0" (CUDA) and "00000000:3B:00.0" (NVML) name the same GPU: compare the numbers.
bool same_pci_bus_id(const std::string& a, const std::string& b) {
  unsigned d1 = 0, b1 = 0, s1 = 0, d2 = 0, b2 = 0, s2 = 0;
  if (std::sscanf(a.c_str(), "%x:%x:%x", &d1, &b1, &s1) != 3 ||
      std::sscanf(b.c_str(), "%x:%x:%x", &d2, &b2, &s2) != 3) {
    return false;
  }
  return d1 == d2 && b1 == b2 && s1 == s2;
}

void add_nvml_facts(Facts* facts) {
  const auto& nvml = monitor::nvml::Library::instance();
  DriverFacts& d = facts->driver;
  d.nvml_ok = nvml.ok();
  d.nvml_error = nvml.error();
  d.nvml_path = nvml.loaded_from();
  if (!nvml.ok()) return;
  d.driver_version = nvml.driver_version();
  d.nvml_device_count = nvml.device_count();
  if (d.cuda_version == 0) d.cuda_version = nvml.cuda_driver_version();
  for (GpuFacts& g : facts->gpus) {
    auto handle = nvml.device_by_pci_bus_id(g.pci_bus_id);
    if (!handle) continue;
    const monitor::nvml::DeviceInfo info = nvml.device_info(*handle);
    g.nvml = true;
    g.uuid = info.uuid;
    g.ecc_enabled = info.ecc_enabled;
    g.power_limit_watts = info.power_limit_watts;
    g.nvlinks_active = info.nvlinks_active;
    if (info.max_sm_clock_mhz > 0) g.clock_mhz = info.max_sm_clock_mhz;
    if (info.max_memory_clock_mhz > 0) g.memory_clock_mhz = info.max_memory_clock_mhz;
    for (const std::string& peer : info.nvlink_peers) {
      std::string name = peer;
      for (const GpuFacts& other : facts->gpus) {
        if (same_pci_bus_id(other.pci_bus_id, peer)) name = "cuda:" + std::to_string(other.index);
      }
      g.nvlink_peers.push_back(name);
    }
  }
}

}  // namespace

void gather_driver(Facts* facts) {
  DriverFacts& d = facts->driver;
  dlerror();
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // kept open: the checks use the same driver
  if (!h) {
    const char* e = dlerror();
    d.libcuda_error = e ? e : "dlopen failed";
  } else {
    d.libcuda_found = true;
    d.libcuda_path = loaded_path(h);
    DriverApi api;
    resolve(h, "cuInit", &api.init);
    resolve(h, "cuDriverGetVersion", &api.driver_get_version);
    resolve(h, "cuDeviceGetCount", &api.device_get_count);
    resolve(h, "cuDeviceGet", &api.device_get);
    resolve(h, "cuDeviceGetName", &api.device_get_name);
    resolve(h, "cuDeviceGetAttribute", &api.device_get_attribute);
    resolve(h, "cuDeviceTotalMem_v2", &api.device_total_mem);
    resolve(h, "cuDeviceGetPCIBusId", &api.device_get_pci_bus_id);
    resolve(h, "cuGetErrorName", &api.get_error_name);
    resolve(h, "cuGetErrorString", &api.get_error_string);
    if (api.driver_get_version) api.driver_get_version(&d.cuda_version);
    if (!api.init || !api.device_get_count || !api.device_get) {
      d.init_error =
          d.libcuda_path + " lacks the driver API's cuInit/cuDeviceGetCount: a broken or foreign libcuda.so.1";
      d.init_result = 999;
    } else {
      d.init_result = api.init(0);
      if (d.init_result != 0) {
        d.init_error = error_text(api, d.init_result);
      } else if (api.device_get_count(&d.device_count) != 0) {
        d.device_count = 0;
      }
    }
    for (int i = 0; i < d.device_count; ++i) {
      CuDevice dev = 0;
      if (api.device_get(&dev, i) != 0) continue;
      GpuFacts g;
      g.index = i;
      char buf[256] = {};
      if (api.device_get_name && api.device_get_name(buf, sizeof(buf), dev) == 0) g.name = buf;
      auto attr = [&](int a) {
        int v = -1;
        return api.device_get_attribute && api.device_get_attribute(&v, a, dev) == 0 ? v : -1;
      };
      g.cc_major = attr(kAttrComputeCapabilityMajor);
      g.cc_minor = attr(kAttrComputeCapabilityMinor);
      g.multiprocessors = std::max(0, attr(kAttrMultiprocessorCount));
      const int clock_khz = attr(kAttrClockRate), memory_khz = attr(kAttrMemoryClockRate);
      g.clock_mhz = clock_khz > 0 ? clock_khz / 1000 : -1;
      g.memory_clock_mhz = memory_khz > 0 ? memory_khz / 1000 : -1;
      g.memory_bus_bits = std::max(0, attr(kAttrGlobalMemoryBusWidth));
      size_t bytes = 0;
      if (api.device_total_mem && api.device_total_mem(&bytes, dev) == 0) g.memory_bytes = static_cast<int64_t>(bytes);
      char bus[64] = {};
      if (api.device_get_pci_bus_id && api.device_get_pci_bus_id(bus, sizeof(bus), dev) == 0) g.pci_bus_id = bus;
      facts->gpus.push_back(g);
    }
  }
  add_nvml_facts(facts);
  if (d.driver_version.empty()) {  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159  Thu ..."
    std::smatch m;
    const std::string& line = facts->system.proc_driver_version;
    if (std::regex_search(line, m, std::regex(R"(Kernel Module\s+(\S+))"))) d.driver_version = m[1];
  }
}

}  // namespace kiln::doctor
