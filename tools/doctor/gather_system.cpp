// The system: OS, kernel, CPU, memory, glibc, and the signs that an NVIDIA GPU is present (device files,
// the kernel module) which tell "no GPU here" apart from "a GPU that CUDA cannot use".
#include <gnu/libc-version.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gather.h"

namespace kiln::doctor {
namespace {

std::string unquote(std::string s) {
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) s = s.substr(1, s.size() - 2);
  return s;
}

std::string line_value(const std::string& file, const std::string& key, char separator) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    auto pos = line.find(separator);
    if (pos == std::string::npos) continue;
    std::string v = line.substr(pos + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    return unquote(v);
  }
  return {};
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

}  // namespace

SystemFacts gather_system() {
  SystemFacts s;
  s.os = line_value("/etc/os-release", "PRETTY_NAME=", '=');
  utsname u{};
  if (uname(&u) == 0) {
    s.kernel = std::string(u.sysname) + " " + u.release;
    s.machine = u.machine;
  }
  s.cpu = line_value("/proc/cpuinfo", "model name", ':');
  s.cpu_cores = static_cast<int>(std::thread::hardware_concurrency());
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) s.memory_bytes = static_cast<int64_t>(pages) * page;
  s.glibc = gnu_get_libc_version();

  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("nvidia", 0) == 0) s.nvidia_device_files.push_back(e.path().string());
  }
  std::sort(s.nvidia_device_files.begin(), s.nvidia_device_files.end());
  s.proc_driver_nvidia = fs::exists("/proc/driver/nvidia", ec);
  if (s.proc_driver_nvidia) {
    std::ifstream in("/proc/driver/nvidia/version");
    std::getline(in, s.proc_driver_version);
  }
  s.cuda_visible_devices = env("CUDA_VISIBLE_DEVICES");
  s.nvidia_visible_devices = env("NVIDIA_VISIBLE_DEVICES");
  return s;
}

}  // namespace kiln::doctor
