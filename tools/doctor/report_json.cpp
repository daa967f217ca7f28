// The JSON report (--json): every fact and finding under stable keys, for scripts and CI.
#include <nlohmann/json.hpp>

#include "report.h"

namespace kiln::doctor {
namespace {

using nlohmann::json;

json library_json(const LibraryFacts& l) {
  return {{"name", l.name},
          {"soname", l.soname},
          {"required", l.required},
          {"found", l.found},
          {"path", l.path},
          {"load_error", l.load_error},
          {"version_function", l.version_function},
          {"has_version_function", l.has_version_function},
          {"version", l.version()},
          {"description", l.description},
          {"built_version", l.built_version()}};
}

json gpu_json(const GpuFacts& g) {
  json j = {{"index", g.index},
            {"name", g.name},
            {"pci_bus_id", g.pci_bus_id},
            {"uuid", g.uuid},
            {"compute_capability", std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor)},
            {"memory_bytes", g.memory_bytes},
            {"multiprocessors", g.multiprocessors},
            {"max_sm_clock_mhz", g.clock_mhz},
            {"max_memory_clock_mhz", g.memory_clock_mhz},
            {"memory_bus_bits", g.memory_bus_bits},
            {"nvml", g.nvml},
            {"power_limit_watts", g.power_limit_watts},
            {"nvlinks_active", g.nvlinks_active},
            {"nvlink_peers", g.nvlink_peers}};
  j["ecc_enabled"] = g.ecc_enabled ? json(*g.ecc_enabled) : json(nullptr);
  return j;
}

const char* status_name(CheckStatus s) {
  return s == CheckStatus::Passed ? "passed" : s == CheckStatus::Failed ? "failed" : "skipped";
}

}  // namespace

std::string json_report(const Facts& f, const std::vector<Finding>& findings, int exit_code) {
  json j;
  const SystemFacts& s = f.system;
  j["system"] = {{"os", s.os},
                 {"kernel", s.kernel},
                 {"machine", s.machine},
                 {"cpu", s.cpu},
                 {"cpu_threads", s.cpu_cores},
                 {"memory_bytes", s.memory_bytes},
                 {"glibc", s.glibc},
                 {"nvidia_device_files", s.nvidia_device_files},
                 {"proc_driver_nvidia", s.proc_driver_nvidia},
                 {"cuda_visible_devices", s.cuda_visible_devices ? json(*s.cuda_visible_devices) : json(nullptr)}};
  const BuildFacts& b = f.build;
  j["build"] = {{"kiln_version", b.kiln_version},
                {"compiler", b.compiler},
                {"build_type", b.build_type},
                {"cuda", b.cuda},
                {"mpi", b.mpi},
                {"cuda_architectures", b.cuda_architectures},
                {"cudart_version", b.cudart_version},
                {"cublas_version", b.cublas_version},
                {"cudnn_version", b.cudnn_version},
                {"nccl_version", b.nccl_version},
                {"hdf5_version", b.hdf5_version},
                {"eigen_version", b.eigen_version},
                {"nvml_header", b.nvml_header}};
  const DriverFacts& d = f.driver;
  j["driver"] = {
      {"libcuda_found", d.libcuda_found}, {"libcuda_path", d.libcuda_path}, {"libcuda_error", d.libcuda_error},
      {"version", d.driver_version},      {"cuda_version", d.cuda_version}, {"init_result", d.init_result},
      {"init_error", d.init_error},       {"device_count", d.device_count}, {"nvml_ok", d.nvml_ok},
      {"nvml_path", d.nvml_path},         {"nvml_error", d.nvml_error},     {"nvml_device_count", d.nvml_device_count}};
  j["libraries"] = json::array();
  for (const auto& l : f.libraries) j["libraries"].push_back(library_json(l));
  j["gpus"] = json::array();
  for (const auto& g : f.gpus) j["gpus"].push_back(gpu_json(g));
  json checks = {{"requested", f.checks.requested},           {"ran", f.checks.ran},
                 {"skipped_reason", f.checks.skipped_reason}, {"module_path", f.checks.module_path},
                 {"load_error", f.checks.load_error},         {"runtime_version", f.checks.runtime_version},
                 {"runtime_error", f.checks.runtime_error},   {"results", json::array()}};
  for (const auto& c : f.checks.results) {
    checks["results"].push_back({{"name", c.name},
                                 {"device", c.device},
                                 {"status", status_name(c.status)},
                                 {"detail", c.detail},
                                 {"value", c.value},
                                 {"unit", c.unit},
                                 {"error", c.error}});
  }
  j["checks"] = std::move(checks);
  j["findings"] = json::array();
  for (const auto& x : findings) {
    j["findings"].push_back(
        {{"severity", to_string(x.severity)}, {"code", x.code}, {"problem", x.problem}, {"fix", x.fix}});
  }
  j["exit_code"] = exit_code;
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";  // dlerror() text need not be UTF-8
}

}  // namespace kiln::doctor
