// tests/support/binary_table_support.h — where the tests of the binary op table (kiln/tensor/binary_ops.h) sample
// each row's inputs: the ranges of its `domain` column, and deterministic values in them.
//
//   for (const BinaryRange& r : binary_ranges("NonzeroDivisor")) ... r.a_lo, r.b_hi ...
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

namespace kiln::testing {

struct BinaryRange {
  const char* suffix;  // appended to the row's name in test labels
  double a_lo, a_hi, b_lo, b_hi;
};

// All: [-1, 1] each; NonzeroDivisor: |b| in [0.5, 2], both signs; PositiveBase: a in [0.5, 2], b in [-2, 2];
// WithinDivisor: 0.1 <= |a| <= 0.9 and 1.1 <= |b| <= 2, all four sign pairs (a / b never crosses an integer).
inline std::vector<BinaryRange> binary_ranges(std::string_view domain) {
  if (domain == "NonzeroDivisor") return {{"_positive_b", -1, 1, 0.5, 2}, {"_negative_b", -1, 1, -2, -0.5}};
  if (domain == "PositiveBase") return {{"", 0.5, 2, -2, 2}};
  if (domain == "WithinDivisor") {
    return {{"_pp", 0.1, 0.9, 1.1, 2},
            {"_np", -0.9, -0.1, 1.1, 2},
            {"_pn", 0.1, 0.9, -2, -1.1},
            {"_nn", -0.9, -0.1, -2, -1.1}};
  }
  return {{"", -1, 1, -1, 1}};  // All
}

// n deterministic values spread over [lo, hi] (a low-discrepancy sequence; no two equal).
inline std::vector<double> spread(int64_t n, double lo, double hi, uint64_t seed) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) {
    const double t = static_cast<double>(i + 1) * 0.6180339887498949 + static_cast<double>(seed) * 0.3183098861837907;
    v.push_back(lo + (hi - lo) * (t - std::floor(t)));
  }
  return v;
}

}  // namespace kiln::testing
