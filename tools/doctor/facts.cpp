// Small helpers of the fact structs.
#include "facts.h"

#include <cstdio>

namespace kiln::doctor {
namespace {
std::string dotted(int major, int minor, int patch) {
  if (major < 0) return {};
  char buf[48];
  if (minor < 0) {
    std::snprintf(buf, sizeof(buf), "%d", major);
  } else if (patch < 0) {
    std::snprintf(buf, sizeof(buf), "%d.%d", major, minor);
  } else {
    std::snprintf(buf, sizeof(buf), "%d.%d.%d", major, minor, patch);
  }
  return buf;
}
}  // namespace

std::string LibraryFacts::version() const { return dotted(major, minor, patch); }
std::string LibraryFacts::built_version() const { return dotted(built_major, built_minor, built_patch); }

const LibraryFacts* Facts::library(const std::string& name) const {
  for (const auto& lib : libraries) {
    if (lib.name == name) return &lib;
  }
  return nullptr;
}

}  // namespace kiln::doctor
