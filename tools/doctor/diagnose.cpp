// The diagnosis rules, in the order a person would check them: the build, the libraries, the driver, the
// GPUs, then the checks. Each rule looks at facts only.
#include "diagnose.h"

#include <algorithm>
#include <cctype>
#include <sstream>

namespace kiln::doctor {

const char* to_string(Severity s) {
  switch (s) {
    case Severity::Info: return "info";
    case Severity::Warning: return "warning";
    case Severity::Error: return "error";
  }
  return "?";
}

std::string cuda_version_string(int v) {
  if (v <= 0) return "unknown";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string minimum_driver_for_cuda(int cuda_major) {
  // NVIDIA's CUDA release notes, "CUDA Toolkit and Corresponding Driver Versions" (Linux, minor version
  // compatibility: the oldest driver any release of that major version runs on).
  switch (cuda_major) {
    case 11: return "450.80.02";
    case 12: return "525.60.13";
    case 13: return "580.65.06";
    default: return "";
  }
}

bool architectures_run_on(const std::string& architectures, int major, int minor, bool* through_ptx) {
  const int cc = major * 10 + minor;
  bool sass = false, ptx = false, unknown = false;
  std::string list = architectures;
  std::replace_if(
      list.begin(), list.end(), [](char c) { return c == ';' || c == ',' || c == ' '; }, '\n');
  std::istringstream in(list);
  std::string entry;
  while (std::getline(in, entry)) {
    if (entry.empty()) continue;
    std::transform(entry.begin(), entry.end(), entry.begin(), [](unsigned char c) { return std::tolower(c); });
    bool real = true, virt = true;  // CMake: "90" means SASS for sm_90 and PTX for compute_90
    if (entry.size() > 5 && entry.ends_with("-real")) {
      virt = false;
      entry.resize(entry.size() - 5);
    } else if (entry.size() > 8 && entry.ends_with("-virtual")) {
      real = false;
      entry.resize(entry.size() - 8);
    }
    size_t digits = 0;
    while (digits < entry.size() && std::isdigit(static_cast<unsigned char>(entry[digits]))) ++digits;
    if (digits == 0) {  // "native", "all", "all-major": decided by CMake at build time
      unknown = true;
      continue;
    }
    const int n = std::stoi(entry.substr(0, digits));
    const std::string variant = entry.substr(digits);  // "", "a" (this exact GPU), "f" (its family)
    const int x = n / 10, y = n % 10;
    // SASS for sm_XY runs on X.Y and later minor versions of X; sm_XYa only on X.Y itself.
    if (real && (variant == "a" ? cc == n : (major == x && minor >= y))) sass = true;
    // PTX for compute_XY is compiled by the driver for any later GPU; the a/f variants stay within X.Y / X.
    if (virt && (variant == "a" ? cc == n : variant == "f" ? (major == x && minor >= y) : cc >= n)) ptx = true;
  }
  if (through_ptx) *through_ptx = !sass && ptx;
  return sass || ptx || unknown;
}

namespace {

struct Rules {
  const Facts& facts;
  const DiagnoseOptions& options;
  std::vector<Finding> out;

  void add(Severity s, std::string code, std::string problem, std::string fix = {}) {
    out.push_back({s, std::move(code), std::move(problem), std::move(fix)});
  }
  bool has(Severity s) const {
    return std::any_of(out.begin(), out.end(), [&](const Finding& f) { return f.severity == s; });
  }
  bool has_code(const std::string& code) const {
    return std::any_of(out.begin(), out.end(), [&](const Finding& f) { return f.code == code; });
  }

  bool gpu_hints() const { return !facts.system.nvidia_device_files.empty() || facts.system.proc_driver_nvidia; }
  // What says an NVIDIA GPU is in this machine, for messages: "/dev/nvidia0, the nvidia kernel module".
  std::string hint_text() const {
    std::string s;
    for (const auto& f : facts.system.nvidia_device_files) {
      if (f.find("nvidia") != std::string::npos && std::isdigit(static_cast<unsigned char>(f.back()))) {
        s = f;
        break;
      }
    }
    if (s.empty() && !facts.system.nvidia_device_files.empty()) s = facts.system.nvidia_device_files.front();
    if (facts.system.proc_driver_nvidia) s += std::string(s.empty() ? "" : " and ") + "/proc/driver/nvidia";
    if (facts.driver.nvml_device_count > 0) {
      s += std::string(s.empty() ? "" : ", ") + "NVML lists " + std::to_string(facts.driver.nvml_device_count) +
           " GPU(s)";
    }
    return s;
  }

  void no_gpu(const std::string& why) {
    if (options.require_gpu) {
      add(Severity::Error, "no-gpu", "no GPU visible (" + why + "), and --require-gpu was given",
          "run on a machine with an NVIDIA GPU and its driver (nvidia-smi must list the GPU)");
    } else {
      add(Severity::Info, "no-gpu", "no GPU visible (" + why + "): kiln runs on the CPU");
    }
  }

  void build() {
    if (facts.build.cuda) return;
    const int gpus = std::max(facts.driver.device_count, facts.driver.nvml_device_count);
    if (gpus > 0 || gpu_hints()) {
      add(Severity::Error, "build-without-cuda",
          "this kiln was built without CUDA (KILN_CUDA=OFF), but the machine has an NVIDIA GPU (" + hint_text() +
              "): kiln runs on the CPU only",
          "reconfigure with -DKILN_CUDA=ON (it needs the CUDA toolkit, cuDNN and NCCL) and rebuild");
    } else {
      no_gpu("this kiln was built without CUDA, and the machine shows no NVIDIA GPU");
    }
  }

  static std::string package_hint(const LibraryFacts& lib) {
    if (lib.name == "cuDNN")
      return "cuDNN " + std::to_string(lib.built_major) + " (apt: libcudnn" + std::to_string(lib.built_major) +
             "-cuda-<CUDA major>)";
    if (lib.name == "NCCL")
      return "NCCL " + std::to_string(lib.built_major) + " (apt: libnccl" + std::to_string(lib.built_major) + ")";
    if (lib.name == "cuBLAS" || lib.name == "cuBLASLt") {
      return "the CUDA " + std::to_string(lib.built_major) + " toolkit's cuBLAS (apt: libcublas-" +
             std::to_string(lib.built_major) + "-<minor>)";
    }
    return lib.name + (lib.built_major >= 0 ? " " + std::to_string(lib.built_major) : std::string());
  }

  void libraries() {
    for (const LibraryFacts& lib : facts.libraries) {
      const Severity missing = lib.required ? Severity::Error : Severity::Warning;
      const std::string consequence =
          lib.required ? "every kiln program of this build fails to start" : "kiln reports it as unknown";
      if (!lib.found) {
        add(missing, "library-missing",
            lib.name + " (" + lib.soname + ") is not found: " + lib.load_error + "; " + consequence,
            "install " + package_hint(lib) + ", or add the folder that holds " + lib.soname + " to LD_LIBRARY_PATH");
        continue;
      }
      if (!lib.version_function.empty() && !lib.has_version_function) {
        add(missing, "library-no-version",
            lib.path + " has no " + lib.version_function + "(): it is not " + lib.name + ", or a broken copy",
            "remove that file from the library path (LD_LIBRARY_PATH) or reinstall " + package_hint(lib));
        continue;
      }
      if (lib.major < 0 || lib.built_major < 0) continue;
      if (lib.major != lib.built_major) {
        add(missing, "library-wrong-version",
            lib.name + " " + lib.version() + " is loaded (from " + lib.path + "), but kiln was built against " +
                lib.name + " " + lib.built_version() + ": a different major version, with a different interface",
            "install " + package_hint(lib) + " and put its folder first on LD_LIBRARY_PATH, or rebuild kiln against " +
                lib.name + " " + std::to_string(lib.major));
        continue;
      }
      const int have = lib.minor * 1000 + std::max(lib.patch, 0);
      const int built = lib.built_minor * 1000 + std::max(lib.built_patch, 0);
      if (lib.built_minor >= 0 && have < built) {
        add(Severity::Warning, "library-older",
            lib.name + " " + lib.version() + " is loaded (from " + lib.path + "), older than the " +
                lib.built_version() + " kiln was built against: what was added since may fail",
            "update " + lib.name + " to " + lib.built_version() + " or later, or rebuild kiln on this machine");
      }
    }
  }

  void driver() {
    const DriverFacts& d = facts.driver;
    if (!facts.build.cuda) return;
    if (!d.libcuda_found) {
      if (gpu_hints()) {
        add(Severity::Error, "driver-library-missing",
            "the machine has an NVIDIA GPU (" + hint_text() +
                "), but the driver's CUDA library libcuda.so.1 is not found: " + d.libcuda_error,
            "install the NVIDIA driver's user-space libraries for the loaded kernel module (Ubuntu: "
            "libnvidia-compute-<driver major>), or in a container start it with the GPUs (docker run --gpus all)");
      } else {
        no_gpu("no NVIDIA driver: libcuda.so.1 is not installed");
      }
      return;
    }
    const int built = facts.build.cudart_version;
    if (d.cuda_version > 0 && built > 0 && d.cuda_version < built) {
      const std::string have = d.driver_version.empty() ? std::string() : " " + d.driver_version;
      if (d.cuda_version / 1000 < built / 1000) {
        const std::string minimum = minimum_driver_for_cuda(built / 1000);
        add(Severity::Error, "driver-too-old",
            "the NVIDIA driver" + have + " supports CUDA up to " + cuda_version_string(d.cuda_version) +
                ", but kiln was built with the CUDA " + cuda_version_string(built) + " runtime" +
                (minimum.empty() ? std::string() : ", which needs driver " + minimum + " or newer"),
            "update the NVIDIA driver" + (minimum.empty() ? std::string() : " to " + minimum + " or newer") +
                ", or rebuild kiln with a CUDA toolkit no newer than " + cuda_version_string(d.cuda_version));
        return;
      }
      add(Severity::Warning, "driver-older-minor",
          "the NVIDIA driver" + have + " supports CUDA " + cuda_version_string(d.cuda_version) +
              ", older than the CUDA " + cuda_version_string(built) +
              " runtime kiln was built with: it runs (minor version compatibility), "
              "but PTX from the newer toolkit cannot be compiled by this driver",
          "update the NVIDIA driver, or build kiln with SASS for this GPU (CMAKE_CUDA_ARCHITECTURES=<its compute "
          "capability>)");
    }
    if (d.init_result == 0) {
      if (d.device_count == 0) no_gpu("the driver loaded but lists no device");
      return;
    }
    constexpr int kNoDevice = 100;  // CUDA_ERROR_NO_DEVICE
    const auto& cvd = facts.system.cuda_visible_devices;
    if (d.init_result == kNoDevice) {
      if (cvd && (d.nvml_device_count > 0 || gpu_hints())) {
        add(Severity::Error, "cuda-visible-devices",
            "CUDA_VISIBLE_DEVICES=\"" + *cvd + "\" hides every GPU: CUDA sees none, while the machine has " +
                (d.nvml_device_count > 0 ? std::to_string(d.nvml_device_count) + " (NVML)" : hint_text()),
            "unset CUDA_VISIBLE_DEVICES, or set it to GPU indices (0.." +
                std::to_string(std::max(d.nvml_device_count, 1) - 1) + ") or UUIDs that nvidia-smi -L lists");
      } else if (d.nvml_device_count > 0 || gpu_hints()) {
        add(Severity::Error, "no-device",
            "the NVIDIA driver is installed and the machine has a GPU (" + hint_text() +
                "), but CUDA sees none: " + d.init_error,
            "check nvidia-smi; in a container start it with the GPUs (docker run --gpus all), otherwise reinstall the "
            "driver and reboot");
      } else {
        no_gpu("the NVIDIA driver is installed, but no GPU is present");
      }
      return;
    }
    add(Severity::Error, "cuda-init-failed", "the CUDA driver did not start (cuInit): " + d.init_error,
        "check nvidia-smi and dmesg: after a driver update reboot (the kernel module and the library must match); "
        "otherwise make /dev/nvidia* accessible to this user");
  }

  void gpus() {
    if (!facts.build.cuda) return;
    for (const GpuFacts& g : facts.gpus) {
      if (g.cc_major < 0) continue;
      bool through_ptx = false;
      const std::string cc = std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor);
      const std::string sm = std::to_string(g.cc_major) + std::to_string(g.cc_minor);
      const std::string archs = facts.build.cuda_architectures;
      if (!architectures_run_on(archs, g.cc_major, g.cc_minor, &through_ptx)) {
        add(Severity::Error, "gpu-not-compiled-for",
            "cuda:" + std::to_string(g.index) + " (" + g.name + ", compute capability " + cc +
                ") cannot run this build: kiln was compiled for CMAKE_CUDA_ARCHITECTURES=" + archs,
            "reconfigure with -DCMAKE_CUDA_ARCHITECTURES=" + sm + " (or \"" + archs + ";" + sm +
                "\" for both) and rebuild");
      } else if (through_ptx) {
        add(Severity::Warning, "gpu-ptx-only",
            "cuda:" + std::to_string(g.index) + " (" + g.name + ", compute capability " + cc +
                ") has no compiled code in this build (CMAKE_CUDA_ARCHITECTURES=" + archs +
                "): the driver compiles kiln's PTX at start-up, which is slow the first time and may run slower",
            "add " + sm + " to CMAKE_CUDA_ARCHITECTURES and rebuild");
      }
    }
    if (facts.driver.device_count > 0 && !facts.driver.nvml_ok) {
      add(Severity::Warning, "nvml-unavailable", "no GPU monitoring: " + facts.driver.nvml_error,
          facts.build.nvml_header ? "install the driver's NVML library (libnvidia-ml.so.1 comes with the driver)"
                                  : "run scripts/setup.sh (it fetches nvml.h from PyPI's nvidia-nvml-dev) and rebuild");
    }
  }

  static std::string check_fix(const CheckResult& c, const std::string& archs) {
    std::string e = c.error;
    std::transform(e.begin(), e.end(), e.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (e.find("no kernel image") != std::string::npos || e.find("nokernelimage") != std::string::npos ||
        e.find("invalid device function") != std::string::npos) {
      return "rebuild kiln with this GPU's compute capability in CMAKE_CUDA_ARCHITECTURES (now " + archs + ")";
    }
    if (e.find("out of memory") != std::string::npos || e.find("memoryallocation") != std::string::npos) {
      return "free the GPU's memory (nvidia-smi lists the processes holding it) and run again";
    }
    if (c.name.find("NCCL") != std::string::npos) {
      return "rerun with NCCL_DEBUG=INFO to see which transport failed, and check the links with nvidia-smi topo -m";
    }
    if (e.find("mismatch") != std::string::npos || e.find("wrong") != std::string::npos) {
      return "a wrong result points at a broken library or GPU: rerun, and if it repeats update the driver and the "
             "library named, or test another GPU";
    }
    return "rerun; if it fails again, the message names the failing call (and nvidia-smi, dmesg may say more)";
  }

  void checks() {
    const ChecksFacts& c = facts.checks;
    if (!c.requested) return;
    if (!c.ran) {
      if (!c.load_error.empty()) {
        add(Severity::Error, "checks-module-load",
            "the GPU checks (" + (c.module_path.empty() ? std::string("kiln-doctor-checks") : c.module_path) +
                ") could not be loaded: " + c.load_error,
            "install the library that message names, or add its folder to LD_LIBRARY_PATH: kiln programs need it too");
      } else if (!c.skipped_reason.empty()) {
        add(Severity::Info, "checks-skipped", "GPU checks not run: " + c.skipped_reason);
      }
      return;
    }
    if (c.results.empty() && facts.driver.device_count > 0) {
      add(Severity::Error, "checks-no-device",
          "the CUDA runtime inside kiln (" + cuda_version_string(c.runtime_version) +
              ") sees no GPU, while the driver (" + facts.driver.libcuda_path + ") lists " +
              std::to_string(facts.driver.device_count) +
              (c.runtime_error.empty() ? std::string() : ": " + c.runtime_error),
          "reinstall the NVIDIA driver so that libcuda.so.1 matches its kernel module and is new enough for CUDA " +
              cuda_version_string(facts.build.cudart_version) +
              " (check that LD_LIBRARY_PATH holds no other libcuda.so.1)");
    }
    for (const CheckResult& r : c.results) {
      if (r.status != CheckStatus::Failed) continue;
      add(Severity::Error, "check-failed",
          r.name + (r.device >= 0 ? " on cuda:" + std::to_string(r.device) : std::string()) + " failed: " + r.error,
          check_fix(r, facts.build.cuda_architectures));
    }
  }

  void finish() {
    if (options.require_gpu && (!facts.build.cuda || facts.driver.device_count == 0) && !has_code("no-gpu")) {
      add(Severity::Error, "no-gpu", "no GPU is usable by kiln here, and --require-gpu was given",
          "fix the errors above; kiln needs a CUDA build, the NVIDIA driver and a visible GPU");
    }
    if (!has(Severity::Error) && !has(Severity::Warning)) {
      const int n = facts.build.cuda ? facts.driver.device_count : 0;
      add(Severity::Info, "ok",
          n > 0 ? "kiln has what it needs to train on " + std::to_string(n) + " GPU(s)"
                : "kiln has what it needs to train on the CPU");
    }
  }
};

}  // namespace

std::vector<Finding> diagnose(const Facts& facts, const DiagnoseOptions& options) {
  Rules rules{facts, options, {}};
  rules.build();
  rules.libraries();
  rules.driver();
  rules.gpus();
  rules.checks();
  rules.finish();
  return rules.out;
}

int exit_code(const std::vector<Finding>& findings) {
  return std::any_of(findings.begin(), findings.end(), [](const Finding& f) { return f.severity == Severity::Error; })
             ? 1
             : 0;
}

}  // namespace kiln::doctor
