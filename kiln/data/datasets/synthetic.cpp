// kiln/data/datasets/synthetic.cpp — one Philox stream per (seed, field, sample), one 32-bit word per element.
#include "kiln/data/datasets/synthetic.h"

#include <array>
#include <cmath>

#include "kiln/tensor/error.h"
#include "kiln/tensor/generator.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::data {

namespace {

constexpr int kTableBits = 12;
constexpr int kCells = 1 << kTableBits;

// SplitMix64's finaliser: unrelated keys for nearby (seed, field) pairs.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The standard normal quantile by bisection on erfc (run once, 4097 values).
double normal_quantile(double p) {
  double lo = -40, hi = 40;
  for (int it = 0; it < 200 && hi - lo > 1e-13; ++it) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// value(w) = table[c] + frac * slope[c], c = w's top 12 bits: the quantile function interpolated linearly
// between p = c / 4096 and (c + 1) / 4096; the two end cells stop at the quantile of 1/16 of a cell.
struct NormalTable {
  std::array<float, kCells> base, slope;
  NormalTable() {
    std::array<double, kCells + 1> q;
    for (int c = 0; c <= kCells; ++c) {
      double p = static_cast<double>(c) / kCells;
      if (c == 0) p = 1.0 / (16.0 * kCells);
      if (c == kCells) p = 1.0 - 1.0 / (16.0 * kCells);
      q[c] = normal_quantile(p);
    }
    for (int c = 0; c < kCells; ++c) {
      base[c] = static_cast<float>(q[c]);
      slope[c] = static_cast<float>((q[c + 1] - q[c]) / 1048576.0);  // per unit of the low 20 bits
    }
  }
};

const NormalTable& normal_table() {
  static const NormalTable table;
  return table;
}

// Calls fn(i, word) for the n words of the stream `key`, counter (index, block).
template <typename Fn>
void for_each_word(uint64_t key, uint64_t index, int64_t n, Fn&& fn) {
  uint32_t w[4];
  int64_t i = 0;
  for (uint64_t block = 0; i < n; ++block) {
    philox::block(key, index, block, w);
    for (int k = 0; k < 4 && i < n; ++k, ++i) fn(i, w[k]);
  }
}

template <typename T>
void fill_normal(T* out, uint64_t key, uint64_t index, int64_t n) {
  const NormalTable& t = normal_table();
  for_each_word(key, index, n, [&](int64_t i, uint32_t w) {
    const uint32_t c = w >> (32 - kTableBits);
    out[i] = static_cast<T>(t.base[c] + static_cast<float>(w & 0xFFFFF) * t.slope[c]);
  });
}

template <typename T>
void fill_below(T* out, uint64_t key, uint64_t index, int64_t n, uint64_t bound) {
  if (bound <= (uint64_t{1} << 32)) {
    // Lemire's multiply-shift: a bias below bound / 2^32, invisible for class counts.
    for_each_word(key, index, n,
                  [&](int64_t i, uint32_t w) { out[i] = static_cast<T>((static_cast<uint64_t>(w) * bound) >> 32); });
  } else {
    // Two words per value for bounds past 2^32.
    std::vector<uint32_t> words(2 * n);
    for_each_word(key, index, 2 * n, [&](int64_t i, uint32_t w) { words[i] = w; });
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<T>((static_cast<uint64_t>(words[2 * i]) << 32 | words[2 * i + 1]) % bound);
  }
}

}  // namespace

SyntheticDataset::SyntheticDataset(SyntheticOptions options) : options_(std::move(options)) {
  KILN_CHECK(options_.size >= 0, "SyntheticDataset: size must be >= 0, got ", options_.size);
  KILN_CHECK(!options_.fields.empty(), "SyntheticDataset: give at least one field, e.g. {\"x\", {8}, DType::Float32}");
  for (auto& f : options_.fields) {
    for (int64_t d : f.shape)
      KILN_CHECK(d >= 0, "SyntheticDataset: field '", f.name, "' has a negative dim in its shape");
    KILN_CHECK(!is_float8(f.dtype), "SyntheticDataset: field '", f.name, "' has dtype ", f.dtype,
               ", a storage-only type; generate it as bfloat16 or float32 and cast the batch");
    if (f.dtype == DType::UInt8 && f.num_classes == 0) f.num_classes = 256;
    if (f.dtype == DType::Bool) f.num_classes = 2;
    if (is_integral(f.dtype)) {
      KILN_CHECK(f.num_classes > 0, "SyntheticDataset: integer field '", f.name,
                 "' needs num_classes > 0 (its values are drawn from [0, num_classes))");
      KILN_CHECK(f.dtype != DType::UInt8 || f.num_classes <= 256, "SyntheticDataset: uint8 field '", f.name,
                 "' cannot hold ", f.num_classes, " classes");
      KILN_CHECK(f.dtype != DType::Int32 || f.num_classes <= (int64_t{1} << 31), "SyntheticDataset: int32 field '",
                 f.name, "' cannot hold ", f.num_classes, " classes");
    }
  }
  // A probe so a bad name (a duplicate) fails here rather than in a worker thread.
  Example probe;
  for (const auto& f : options_.fields) probe.add(f.name, Tensor());
}

Example SyntheticDataset::get(int64_t index, SampleRng&) const {
  KILN_CHECK(index >= 0 && index < options_.size, describe(), ": index ", index, " is out of range [0, ", options_.size,
             ")");
  Example ex;
  for (size_t k = 0; k < options_.fields.size(); ++k) {
    const SyntheticField& f = options_.fields[k];
    const uint64_t key = mix(mix(options_.seed) ^ mix(k + 1));
    const uint64_t idx = static_cast<uint64_t>(index);
    Tensor t = internal::empty(f.shape, {.dtype = f.dtype});
    const int64_t n = t.numel();
    const uint64_t bound = static_cast<uint64_t>(f.num_classes);
    switch (f.dtype) {
      case DType::Float32: fill_normal(t.data_ptr<float>(), key, idx, n); break;
      case DType::Float64: fill_normal(t.data_ptr<double>(), key, idx, n); break;
      case DType::Float16: fill_normal(t.data_ptr<Half>(), key, idx, n); break;
      case DType::BFloat16: fill_normal(t.data_ptr<BFloat16>(), key, idx, n); break;
      case DType::UInt8: fill_below(t.data_ptr<uint8_t>(), key, idx, n, bound); break;
      case DType::Bool: fill_below(t.data_ptr<bool>(), key, idx, n, bound); break;
      case DType::Int32: fill_below(t.data_ptr<int32_t>(), key, idx, n, bound); break;
      case DType::Int64: fill_below(t.data_ptr<int64_t>(), key, idx, n, bound); break;
      case DType::Float8_e4m3fn:
      case DType::Float8_e5m2: break;  // refused by the constructor
    }
    ex.add(f.name, std::move(t));
  }
  return ex;
}

std::string SyntheticDataset::describe() const {
  std::string fields;
  for (const auto& f : options_.fields) fields += (fields.empty() ? "" : ", ") + f.name;
  return "SyntheticDataset(" + std::to_string(options_.size) + " samples: " + fields + ")";
}

}  // namespace kiln::data
