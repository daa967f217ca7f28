// The text report: one section per part of the facts, then the diagnosis with each fix under its problem.
#include <cstdio>
#include <sstream>

#include "report.h"

namespace kiln::doctor {
namespace {

std::string gb(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f GB", bytes / 1e9);
  return b;
}

std::string fixed(double v, int digits) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.*f", digits, v);
  return b;
}

struct Writer {
  std::ostringstream out;
  void section(const char* title) { out << "\n" << title << "\n"; }
  void row(const std::string& key, const std::string& value) {
    out << "  " << key;
    for (size_t i = key.size(); i < 16; ++i) out << ' ';
    out << " " << value << "\n";
  }
};

std::string version_or(const std::string& v, const char* otherwise) { return v.empty() ? otherwise : v; }

}  // namespace

std::string text_report(const Facts& f, const std::vector<Finding>& findings, int exit_code) {
  Writer w;
  w.out << "kiln-doctor (kiln " << f.build.kiln_version << ")\n";

  w.section("System");
  w.row("OS", version_or(f.system.os, "unknown") + ", " + f.system.kernel + " " + f.system.machine + ", glibc " +
                  f.system.glibc);
  w.row("CPU", version_or(f.system.cpu, "unknown") + " (" + std::to_string(f.system.cpu_cores) + " threads), " +
                   gb(f.system.memory_bytes) + " memory");
  std::string devices;
  for (const auto& d : f.system.nvidia_device_files) devices += (devices.empty() ? "" : " ") + d;
  w.row("NVIDIA devices", devices.empty() ? "none in /dev" : devices);
  w.row("kernel module", f.system.proc_driver_nvidia ? version_or(f.system.proc_driver_version, "loaded")
                                                     : "not loaded (no /proc/driver/nvidia)");
  w.row("CUDA_VISIBLE_DEVICES",
        f.system.cuda_visible_devices ? "\"" + *f.system.cuda_visible_devices + "\"" : "(unset)");

  w.section("Build");
  w.row("kiln", f.build.kiln_version + " " + f.build.build_type + ", compiled by " + f.build.compiler);
  if (f.build.cuda) {
    w.row("CUDA", "on: runtime " + cuda_version_string(f.build.cudart_version) +
                      " (linked statically), CMAKE_CUDA_ARCHITECTURES=" + f.build.cuda_architectures);
    auto v = [](int code, int unit) {
      return std::to_string(code / unit) + "." + std::to_string((code % unit) / 100) + "." + std::to_string(code % 100);
    };
    w.row("built against", "cuBLAS " + v(f.build.cublas_version, 10000) + ", cuDNN " + v(f.build.cudnn_version, 10000) +
                               ", NCCL " + v(f.build.nccl_version, f.build.nccl_version >= 20900 ? 10000 : 1000));
  } else {
    w.row("CUDA", "off (KILN_CUDA=OFF): the CPU backend only");
  }
  w.row("other", "HDF5 " + version_or(f.build.hdf5_version, "?") + ", Eigen " + version_or(f.build.eigen_version, "?") +
                     ", MPI " + (f.build.mpi ? "on" : "off"));
  w.row("nvml.h", f.build.nvml_header ? "yes (GPU monitoring built in)" : "no (GPU monitoring unavailable)");

  w.section("Driver and libraries");
  const DriverFacts& d = f.driver;
  if (d.libcuda_found) {
    w.row("NVIDIA driver", version_or(d.driver_version, "version unknown") + ", supports CUDA up to " +
                               cuda_version_string(d.cuda_version) + "  " + d.libcuda_path);
  } else {
    w.row("NVIDIA driver", "not found: " + d.libcuda_error);
  }
  w.row("NVML", d.nvml_ok ? d.nvml_path : "unavailable: " + d.nvml_error);
  if (f.checks.ran) {
    w.row("CUDA runtime", cuda_version_string(f.checks.runtime_version) + " (inside kiln)" +
                              (f.checks.runtime_error.empty() ? "" : ", sees no GPU: " + f.checks.runtime_error));
  }
  for (const LibraryFacts& lib : f.libraries) {
    std::string s;
    if (!lib.found) {
      s = "NOT FOUND (" + lib.soname + "): " + lib.load_error;
    } else {
      s = version_or(lib.description.empty() ? lib.version() : lib.description, "version unknown");
      if (!lib.built_version().empty() && lib.built_version() != lib.version())
        s += " (built against " + lib.built_version() + ")";
      if (!lib.version_function.empty() && !lib.has_version_function) s = "no " + lib.version_function + "()";
      s += "  " + lib.path;
    }
    w.row(lib.name, s);
  }

  w.section("GPUs");
  if (f.gpus.empty()) w.out << "  none visible to CUDA\n";
  for (const GpuFacts& g : f.gpus) {
    w.out << "  cuda:" << g.index << "  " << g.name << "  compute capability " << g.cc_major << "." << g.cc_minor
          << ", " << g.multiprocessors << " SMs, " << gb(g.memory_bytes) << "\n";
    std::string clocks = "SM " + (g.clock_mhz > 0 ? std::to_string(g.clock_mhz) + " MHz" : std::string("?")) +
                         ", memory " +
                         (g.memory_clock_mhz > 0 ? std::to_string(g.memory_clock_mhz) + " MHz" : std::string("?"));
    if (g.memory_bus_bits > 0) clocks += " x " + std::to_string(g.memory_bus_bits) + " bits";
    w.row("  clocks (max)", clocks);
    w.row("  PCI bus id", g.pci_bus_id + (g.uuid.empty() ? "" : "  " + g.uuid));
    if (g.nvml) {
      w.row("  ECC", !g.ecc_enabled ? "not supported" : *g.ecc_enabled ? "on" : "off");
      if (g.power_limit_watts > 0) w.row("  power limit", fixed(g.power_limit_watts, 0) + " W");
      std::string peers;
      for (const auto& p : g.nvlink_peers) peers += (peers.empty() ? "" : ", ") + p;
      w.row("  NVLink", std::to_string(g.nvlinks_active) + " links up" + (peers.empty() ? "" : "; peers " + peers));
    } else {
      w.row("  ECC, NVLink", d.nvml_ok ? "unknown (NVML does not know this PCI bus id)" : "unknown (no NVML)");
    }
  }
  if (d.nvml_ok && d.nvml_device_count > static_cast<int>(f.gpus.size())) {
    w.out << "  (NVML counts " << d.nvml_device_count << " GPUs in the machine; CUDA sees " << f.gpus.size() << ")\n";
  }

  w.section("Checks");
  if (!f.checks.ran) {
    w.out << "  not run: " << (f.checks.load_error.empty() ? f.checks.skipped_reason : f.checks.load_error) << "\n";
  } else if (f.checks.results.empty()) {
    w.out << "  none ran: the CUDA runtime inside kiln sees no GPU\n";
  }
  for (const CheckResult& c : f.checks.results) {
    std::string head = c.name + (c.device >= 0 ? " (cuda:" + std::to_string(c.device) + ")" : " (all GPUs)");
    std::string s = c.status == CheckStatus::Passed ? "ok" : c.status == CheckStatus::Failed ? "FAILED" : "skipped";
    if (c.status == CheckStatus::Passed && !c.unit.empty())
      s += "  " + fixed(c.value, c.value < 10 ? 2 : 1) + " " + c.unit;
    if (c.status == CheckStatus::Failed) s += ": " + c.error;
    w.out << "  " << head;
    for (size_t i = head.size(); i < 34; ++i) w.out << ' ';
    w.out << " " << s << "\n";
    if (!c.detail.empty()) w.out << "  " << std::string(34, ' ') << " " << c.detail << "\n";
  }

  w.section("Diagnosis");
  int errors = 0, warnings = 0;
  for (const Finding& x : findings) {
    w.out << "  " << to_string(x.severity) << ": " << x.problem << "\n";
    if (!x.fix.empty()) w.out << "    fix: " << x.fix << "\n";
    errors += x.severity == Severity::Error;
    warnings += x.severity == Severity::Warning;
  }
  w.out << "\n"
        << (errors ? "BROKEN" : "OK") << ": " << errors << " error(s), " << warnings << " warning(s); exit code "
        << exit_code << "\n";
  return w.out.str();
}

}  // namespace kiln::doctor
