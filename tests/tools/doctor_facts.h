// tests/tools/doctor_facts.h — made-up facts for the diagnosis tests: a healthy one-H200 machine that each
// test breaks in one way.
#pragma once

#include "facts.h"

namespace kiln::doctor::testing {

inline LibraryFacts library(const char* name, const char* soname, const char* function, int major, int minor,
                            int patch) {
  LibraryFacts l;
  l.name = name;
  l.soname = soname;
  l.required = true;
  l.found = true;
  l.path = std::string("/usr/lib/x86_64-linux-gnu/") + soname;
  l.version_function = function;
  l.has_version_function = true;
  l.major = l.built_major = major;
  l.minor = l.built_minor = minor;
  l.patch = l.built_patch = patch;
  return l;
}

inline Facts healthy_gpu_machine() {
  Facts f;
  f.system.os = "Ubuntu 24.04.1 LTS";
  f.system.nvidia_device_files = {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"};
  f.system.proc_driver_nvidia = true;
  f.build.kiln_version = "0.1.0";
  f.build.cuda = true;
  f.build.mpi = true;
  f.build.cuda_architectures = "90";
  f.build.cudart_version = 13000;
  f.build.cublas_version = 130100;
  f.build.cudnn_version = 91400;
  f.build.nccl_version = 22803;
  f.build.nvml_header = true;
  f.libraries = {library("cuBLAS", "libcublas.so.13", "cublasGetProperty", 13, 1, 0),
                 library("cuBLASLt", "libcublasLt.so.13", "cublasLtGetVersion", 13, 1, 0),
                 library("cuDNN", "libcudnn.so.9", "cudnnGetVersion", 9, 14, 0),
                 library("NCCL", "libnccl.so.2", "ncclGetVersion", 2, 28, 3)};
  f.driver.libcuda_found = true;
  f.driver.libcuda_path = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
  f.driver.cuda_version = 13000;
  f.driver.init_result = 0;
  f.driver.device_count = 1;
  f.driver.driver_version = "580.159";
  f.driver.nvml_ok = true;
  f.driver.nvml_device_count = 1;
  GpuFacts g;
  g.index = 0;
  g.name = "NVIDIA H200";
  g.cc_major = 9;
  g.cc_minor = 0;
  g.memory_bytes = 150'000'000'000;
  f.gpus = {g};
  f.checks.requested = true;
  f.checks.ran = true;
  for (const char* name :
       {"kernel launch", "copy host to device", "copy device to host", "cuBLAS GEMM", "cuDNN convolution"}) {
    f.checks.results.push_back({name, 0, CheckStatus::Passed, "", 1.0, "", ""});
  }
  f.checks.results.push_back({"NCCL all-reduce", -1, CheckStatus::Passed, "", 0.0, "", ""});
  return f;
}

// A machine with no NVIDIA hardware and no driver (CI, a laptop), running a CUDA build of kiln.
inline Facts cpu_only_machine() {
  Facts f = healthy_gpu_machine();
  f.system.nvidia_device_files.clear();
  f.system.proc_driver_nvidia = false;
  f.driver = {};
  f.driver.libcuda_error = "libcuda.so.1: cannot open shared object file: No such file or directory";
  f.driver.nvml_error = "no NVIDIA driver's NVML library (libnvidia-ml.so.1) found";
  f.gpus.clear();
  f.checks = {};
  f.checks.requested = true;
  f.checks.skipped_reason = "no NVIDIA driver (libcuda.so.1)";
  return f;
}

inline LibraryFacts& lib(Facts& f, const std::string& name) {
  for (auto& l : f.libraries) {
    if (l.name == name) return l;
  }
  throw std::runtime_error("no library " + name);
}

}  // namespace kiln::doctor::testing
