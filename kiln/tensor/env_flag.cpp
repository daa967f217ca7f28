// On/off switches from the environment (env_flag.h).
#include "kiln/tensor/env_flag.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <utility>

namespace kiln {

std::optional<bool> parse_flag(std::string_view value) {
  std::string lower;
  lower.reserve(value.size());
  for (const char c : value) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower == "1" || lower == "true" || lower == "on" || lower == "yes") return true;
  if (lower == "0" || lower == "false" || lower == "off" || lower == "no") return false;
  return std::nullopt;
}

bool env_flag(const char* name, bool default_value) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return default_value;
  if (const std::optional<bool> parsed = parse_flag(v)) return *parsed;
  static std::mutex mutex;
  static auto* warned = new std::set<std::pair<std::string, std::string>>();  // never destroyed (static init/exit)
  std::lock_guard<std::mutex> lock(mutex);
  if (warned->emplace(name, v).second) {
    std::fprintf(stderr,
                 "kiln: the environment variable %s=\"%s\" is not an on/off value; it stays %s. Use 1, true, on or "
                 "yes to turn it on, or 0, false, off or no to turn it off.\n",
                 name, v, default_value ? "on" : "off");
  }
  return default_value;
}

}  // namespace kiln
