// tools/doctor/facts.h — what kiln-doctor found out about the machine and the build, as plain data.
//
//   doctor::Facts facts = doctor::gather_facts({.run_checks = true});  // gather.h: probes the machine
//   auto findings = doctor::diagnose(facts, {});                       // diagnose.h: pure, testable
//
// Gathering and judging are separate so that the diagnosis can be tested with facts made up in a test
// (a driver too old, a library of the wrong version) on any machine. Unknown numbers stay at -1 or 0.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::doctor {

struct SystemFacts {
  std::string os;       // PRETTY_NAME of /etc/os-release
  std::string kernel;   // uname -sr
  std::string machine;  // x86_64, aarch64
  std::string cpu;      // model name
  int cpu_cores = 0;
  int64_t memory_bytes = 0;
  std::string glibc;
  // Signs that an NVIDIA GPU should be usable here, whatever CUDA says.
  std::vector<std::string> nvidia_device_files;  // /dev/nvidia0, /dev/nvidiactl, ...
  bool proc_driver_nvidia = false;               // /proc/driver/nvidia exists: the kernel module is loaded
  std::string proc_driver_version;               // its first line, when readable
  std::optional<std::string> cuda_visible_devices;
  std::optional<std::string> nvidia_visible_devices;  // set by container runtimes
};

// How this kiln was built, recorded at compile time (build_info.cpp).
struct BuildFacts {
  std::string kiln_version;
  std::string compiler;            // "GNU 12.2.0"
  std::string build_type;          // Release
  bool cuda = false;               // KILN_CUDA
  bool mpi = false;                // KILN_MPI
  std::string cuda_architectures;  // CMAKE_CUDA_ARCHITECTURES, e.g. "90" or "80;90-real"
  int cudart_version = 0;          // CUDART_VERSION, 13000 = 13.0
  int cublas_version = 0;          // CUBLAS_VERSION, 130100 = 13.1.0
  int cudnn_version = 0;           // CUDNN_VERSION, 91900 = 9.19.0
  int nccl_version = 0;            // NCCL_VERSION_CODE, 22809 = 2.28.9
  std::string hdf5_version;
  std::string eigen_version;
  std::string mpi_library;  // the MPI library file kiln linked
  std::string hdf5_library;
  bool nvml_header = false;  // built with nvml.h
};

// A shared library looked for with dlopen, by the soname kiln's programs need.
struct LibraryFacts {
  std::string name;       // "cuDNN"
  std::string soname;     // "libcudnn.so.9"
  bool required = false;  // this build's programs link it: without it they do not start
  bool found = false;
  std::string path;              // the file dlopen loaded
  std::string load_error;        // dlerror() when not found
  std::string version_function;  // "cudnnGetVersion"
  bool has_version_function = false;
  int major = -1, minor = -1, patch = -1;                    // as the library reports itself
  std::string description;                                   // its own words, where it has them ("Open MPI v4.1.4")
  int built_major = -1, built_minor = -1, built_patch = -1;  // what kiln was compiled against; -1: unknown
  std::string version() const;                               // "9.14.0", "" if unknown
  std::string built_version() const;                         // "9.19.0", "" if unknown
};

struct GpuFacts {
  int index = 0;  // the CUDA device index (after CUDA_VISIBLE_DEVICES), as kiln numbers cuda:N
  std::string name;
  std::string pci_bus_id;
  int cc_major = -1, cc_minor = -1;
  int64_t memory_bytes = 0;
  int multiprocessors = 0;
  int clock_mhz = -1;         // maximum SM clock
  int memory_clock_mhz = -1;  // maximum memory clock
  int memory_bus_bits = 0;
  // From NVML (absent without it):
  bool nvml = false;
  std::string uuid;
  std::optional<bool> ecc_enabled;
  double power_limit_watts = -1;
  int nvlinks_active = 0;
  std::vector<std::string> nvlink_peers;  // "cuda:1" where the peer is visible, else its PCI bus id
};

// The driver, through libcuda.so.1 (driver API) and NVML.
struct DriverFacts {
  bool libcuda_found = false;
  std::string libcuda_path;
  std::string libcuda_error;   // dlerror()
  int cuda_version = 0;        // cuDriverGetVersion: the highest CUDA the driver supports
  int init_result = -1;        // cuInit's CUresult; 0 = success, -1 = not called
  std::string init_error;      // "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"
  int device_count = 0;        // visible to CUDA
  std::string driver_version;  // "580.159", from NVML or /proc/driver/nvidia/version
  bool nvml_ok = false;
  std::string nvml_path;
  std::string nvml_error;     // why NVML is not usable, with the fix
  int nvml_device_count = 0;  // every GPU of the machine (NVML ignores CUDA_VISIBLE_DEVICES)
};

enum class CheckStatus { Passed, Failed, Skipped };

struct CheckResult {
  std::string name;  // "kernel launch", "copy host to device", "cuBLAS GEMM", "cuDNN convolution", "NCCL all-reduce"
  int device = -1;   // -1: all visible GPUs together
  CheckStatus status = CheckStatus::Skipped;
  std::string detail;  // what was done: "bf16 4096x4096x4096, best of 10"
  double value = 0;    // the measured figure, in unit
  std::string unit;    // "GB/s", "TFLOP/s", "us"
  std::string error;   // why it failed
};

struct ChecksFacts {
  bool requested = false;
  bool ran = false;
  std::string skipped_reason;  // why they did not run
  std::string module_path;
  std::string load_error;     // dlopen's dlerror(): names the library at fault
  int runtime_version = 0;    // cudaRuntimeGetVersion of the (static) runtime kiln runs with
  std::string runtime_error;  // why that runtime counts no GPU (cudaGetDeviceCount), when it does not
  std::vector<CheckResult> results;
};

struct Facts {
  SystemFacts system;
  BuildFacts build;
  std::vector<LibraryFacts> libraries;
  DriverFacts driver;
  std::vector<GpuFacts> gpus;
  ChecksFacts checks;

  const LibraryFacts* library(const std::string& name) const;  // by LibraryFacts::name; nullptr if not probed
};

}  // namespace kiln::doctor
