// fuzz/fuzz_safetensors.cpp — libFuzzer target: any bytes, read as a whole safetensors file in memory.
//
// It parses and checks the header (kiln/io/safetensors_header.cpp) and then copies every tensor's bytes out of
// the input, as the reader does, into a buffer of exactly that size: a header check that lets a lie through
// shows up as an AddressSanitizer report (a read past the input or the buffer) or a broken invariant below.
// kiln::Error is the expected outcome for bad input; any other exception or crash is a finding.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kiln/io/safetensors.h"
#include "kiln/tensor/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  try {
    const io::SafetensorsHeader header = io::parse_safetensors_header(data, size, "fuzz-input");
    uint64_t covered = header.data_start;
    for (const io::SafetensorsEntry& e : header.entries) {
      // Invariants the reader relies on: consecutive, in bounds, sized as dtype x shape.
      uint64_t numel = 1;
      for (int64_t d : e.shape) {
        if (d < 0) std::abort();
        numel *= static_cast<uint64_t>(d);
      }
      if (header.data_start + e.begin != covered || e.end < e.begin || header.data_start + e.end > size ||
          numel * element_size(e.dtype) != e.end - e.begin) {
        std::abort();
      }
      covered = header.data_start + e.end;
      std::vector<uint8_t> bytes(e.end - e.begin);
      if (!bytes.empty()) std::memcpy(bytes.data(), data + header.data_start + e.begin, bytes.size());
      if (e.dtype == DType::Bool) io::detail::check_safetensors_bools(bytes.data(), bytes.size(), e, "fuzz-input");
    }
    if (covered != size) std::abort();
  } catch (const Error&) {
    // A clear refusal: the expected outcome for bad bytes.
  }
  return 0;
}
