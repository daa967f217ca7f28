// Counts of ops in a profile, for tests that check what a backward or a forward ran (header-only).
#pragma once

#include <cstddef>
#include <string>

#include "kiln/profiler/profiler.h"

namespace kiln::testing {

// The additions of float32 tensors of `shape` ("[2, 16, 64]", as the profiler prints shapes) among a profile's ops.
inline size_t additions_of(const profiler::Result& result, const std::string& shape) {
  size_t n = 0;
  for (const profiler::Event& e : result.events()) {
    if (e.kind == trace::Kind::Op && e.name.rfind("add", 0) == 0 && e.shapes.find(shape + " f32") != std::string::npos)
      ++n;
  }
  return n;
}

}  // namespace kiln::testing
