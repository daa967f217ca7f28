// Reading kiln's environment variables (env_vars.h).
#include "kiln/tensor/env_vars.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <utility>

namespace kiln {

namespace {
// Says once per (variable, value) on standard error that the value was not understood and what happens instead.
void warn_once(const char* name, const char* value, const char* takes, const std::string& kept) {
  static std::mutex mutex;
  static auto* warned = new std::set<std::pair<std::string, std::string>>();  // never destroyed (static init/exit)
  std::lock_guard<std::mutex> lock(mutex);
  if (!warned->emplace(name, value).second) return;
  std::fprintf(stderr, "kiln: the environment variable %s=\"%s\" is not understood; %s. It takes %s.\n", name, value,
               kept.c_str(), takes);
}
}  // namespace

std::optional<bool> parse_flag(std::string_view value) {
  std::string lower;
  lower.reserve(value.size());
  for (const char c : value) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower == "1" || lower == "true" || lower == "on" || lower == "yes") return true;
  if (lower == "0" || lower == "false" || lower == "off" || lower == "no") return false;
  return std::nullopt;
}

std::optional<int64_t> parse_positive_int(std::string_view value) {
  if (value.empty() || value.size() > 10) return std::nullopt;
  int64_t n = 0;
  for (const char c : value) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  if (n < 1 || n > 2147483647) return std::nullopt;
  return n;
}

bool env_flag(const char* name, bool default_value) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return default_value;
  if (const std::optional<bool> parsed = parse_flag(v)) return *parsed;
  warn_once(name, v, "1, true, on or yes to turn it on, and 0, false, off or no to turn it off",
            std::string("it stays ") + (default_value ? "on" : "off"));
  return default_value;
}

int64_t env_positive_int(const char* name, int64_t default_value) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return default_value;
  if (const std::optional<int64_t> parsed = parse_positive_int(v)) return *parsed;
  warn_once(name, v, "a whole number of at least 1, such as 8",
            "the default, " + std::to_string(default_value) + ", is used");
  return default_value;
}

}  // namespace kiln
