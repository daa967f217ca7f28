// kiln/data/sample_rng.cpp — Philox keyed by a mix of (seed, epoch), counted by (index, stream, block).
#include "kiln/data/sample_rng.h"

#include <cmath>
#include <limits>

#include "kiln/tensor/error.h"
#include "kiln/tensor/generator.h"

namespace kiln::data {

namespace {

// SplitMix64's finaliser: spreads (seed, epoch) over the key so nearby seeds give unrelated streams.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

SampleRng::SampleRng(uint64_t seed, uint64_t epoch, int64_t index)
    : key_(mix(mix(seed) ^ epoch)), index_(static_cast<uint64_t>(index)) {}

SampleRng::SampleRng(uint64_t key, uint64_t index, uint64_t stream, int) : key_(mix(key ^ mix(stream + 1))),
                                                                             index_(index) {}

SampleRng SampleRng::fork(uint64_t stream) const { return SampleRng(key_, index_, stream, 0); }

uint32_t SampleRng::next_word() {
  if (used_ == 4) {
    // Philox counter: the high half is the sample index, the low half counts blocks.
    philox::block(key_, index_, counter_++, words_);
    used_ = 0;
  }
  return words_[used_++];
}

uint64_t SampleRng::bits() {
  const uint64_t hi = next_word();
  return hi << 32 | next_word();
}

double SampleRng::uniform() {
  const uint32_t hi = next_word();
  return philox::to_unit_double(hi, next_word());
}

double SampleRng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

int64_t SampleRng::randint(int64_t n) {
  KILN_CHECK(n > 0, "SampleRng.randint: n must be positive, got ", n);
  const uint64_t un = static_cast<uint64_t>(n);
  // Rejection sampling: drop the top values that would make some results more likely.
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % un;
  uint64_t x;
  do x = bits();
  while (x >= limit);
  return static_cast<int64_t>(x % un);
}

bool SampleRng::bernoulli(double p) { return uniform() < p; }

double SampleRng::normal() {
  const double u1 = uniform(), u2 = uniform();
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace kiln::data
