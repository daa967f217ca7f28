// Loading kiln-doctor-checks and running it. The module links kiln with cuBLAS, cuDNN, NCCL and the CUDA
// runtime; it is opened only when the probes found all of them, and if it still fails to load, dlerror()
// names the library at fault.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checks/checks_abi.h"
#include "gather.h"

namespace kiln::doctor {
namespace {

std::string executable_dir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

// Beside the executable (the build tree), then where the install rules put it (<prefix>/lib/kiln).
std::vector<std::string> module_candidates() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("KILN_DOCTOR_CHECKS")) c.emplace_back(env);
  const std::string dir = executable_dir();
  if (!dir.empty()) {
    c.push_back(dir + "/" KILN_DOCTOR_CHECKS_FILE);
    c.push_back(dir + "/" KILN_DOCTOR_CHECKS_INSTALL_RELATIVE "/" KILN_DOCTOR_CHECKS_FILE);
  }
  return c;
}

CheckStatus status_of(const std::string& s) {
  if (s == "passed") return CheckStatus::Passed;
  if (s == "failed") return CheckStatus::Failed;
  return CheckStatus::Skipped;
}

}  // namespace

std::string checks_blocked_reason(const Facts& f) {
  if (!f.build.cuda) return "this kiln was built without CUDA";
  for (const LibraryFacts& lib : f.libraries) {
    if (!lib.required) continue;
    if (!lib.found || (!lib.version_function.empty() && !lib.has_version_function)) {
      return lib.name + " (" + lib.soname + ") is not usable, and the checks link it";
    }
    if (lib.major >= 0 && lib.built_major >= 0 && lib.major != lib.built_major) {
      return lib.name + " " + lib.version() + " is not the major version kiln was built against (" +
             lib.built_version() + ")";
    }
  }
  if (!f.driver.libcuda_found) return "no NVIDIA driver (libcuda.so.1)";
  if (f.driver.cuda_version > 0 && f.build.cudart_version > 0 &&
      f.driver.cuda_version / 1000 < f.build.cudart_version / 1000) {
    return "the driver is too old for kiln's CUDA runtime";
  }
  if (f.driver.init_result != 0 || f.driver.device_count == 0) return "no GPU is visible to CUDA";
  return {};
}

ChecksFacts run_checks(const Facts& facts) {
  ChecksFacts c;
  c.requested = true;
  c.skipped_reason = checks_blocked_reason(facts);
  if (!c.skipped_reason.empty()) return c;

  void* module = nullptr;
  std::string first_error;
  for (const std::string& path : module_candidates()) {
    if (!std::filesystem::exists(path)) continue;
    c.module_path = path;
    dlerror();
    module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (module) break;
    const char* e = dlerror();
    if (first_error.empty()) first_error = e ? e : "dlopen failed";
  }
  if (!module) {
    c.load_error = !first_error.empty()
                       ? first_error
                       : std::string(KILN_DOCTOR_CHECKS_FILE) + " is not beside kiln-doctor nor in " +
                             KILN_DOCTOR_CHECKS_INSTALL_RELATIVE + " (set KILN_DOCTOR_CHECKS to its path)";
    return c;
  }
  auto run = reinterpret_cast<KilnDoctorRunChecks>(dlsym(module, kKilnDoctorRunChecks));
  if (!run) {
    c.load_error = c.module_path + " has no " + kKilnDoctorRunChecks + ": it is not kiln-doctor's checks module";
    return c;
  }
  const nlohmann::json report = nlohmann::json::parse(run(0), nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded()) {
    c.load_error = "the checks module answered something that is not JSON";
    return c;
  }
  c.ran = true;
  c.runtime_version = report.value("runtime_version", 0);
  c.runtime_error = report.value("device_error", "");
  for (const auto& r : report.value("results", nlohmann::json::array())) {
    CheckResult out;
    out.name = r.value("name", "");
    out.device = r.value("device", -1);
    out.status = status_of(r.value("status", ""));
    out.detail = r.value("detail", "");
    out.value = r.value("value", 0.0);
    out.unit = r.value("unit", "");
    out.error = r.value("error", "");
    c.results.push_back(out);
  }
  // Left loaded: unloading a module with a CUDA runtime in it at exit is a known source of crashes.
  return c;
}

Facts gather_facts(const GatherOptions& options) {
  Facts f;
  f.system = gather_system();
  f.build = build_facts();
  f.libraries = probe_libraries(f.build);
  gather_driver(&f);
  if (options.run_checks) {
    f.checks = run_checks(f);
  } else {
    f.checks.skipped_reason = "--skip-checks";
  }
  return f;
}

}  // namespace kiln::doctor
