// tests/support/formula.h — the hash that golden tests and their PyTorch scripts share, so that both sides set
// weights and inputs to the same bits without weight files (tests/golden/make_golden.py, `uniform_formula`).
//
//   uint64_t h = formula::fnv1a64("conv1.weight");
//   double u = formula::uniform(h, i);            // element i, uniform in [-1, 1), exactly as the script's
//   uint64_t r = formula::splitmix64(h + i);      // integers (labels, token ids): r % m
#pragma once

#include <cstdint>
#include <string>

namespace kiln::testing::formula {

// FNV-1a, 64 bits, of the name's bytes.
inline uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// splitmix64's output for state x (x + the golden gamma, then the mix), modulo 2^64.
inline uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1): exact (53-bit integer times a power of two, minus 1).
inline double uniform(uint64_t hash, int64_t i) {
  return static_cast<double>(splitmix64(hash + static_cast<uint64_t>(i)) >> 11) * 0x1p-53 * 2.0 - 1.0;
}

}  // namespace kiln::testing::formula
