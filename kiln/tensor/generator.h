// kiln/tensor/generator.h — counter-based random numbers (Philox4x32-10), identical on every backend.
//
//   kiln::manual_seed(42);                    // seeds the default generator of every device
//   Generator g(7);  auto x = internal::rand({3}, {}, &g);
//   auto saved = g.state();  ...;  g.set_state(saved);   // exact replay (checkpoints, recomputation)
//
// Each draw of n numbers takes one fresh 64-bit "offset" from the generator. Number i of that draw
// comes from philox(key = seed, counter = {i / 4 (64 bits), offset (64 bits)}), word i % 4; so a
// result does not depend on the device, the thread count or the launch configuration.
#pragma once

#include <array>
#include <cmath>  // sqrt, log, cos, sin for Box-Muller; ceil for the Bernoulli thresholds
#include <cstdint>
#include <mutex>

#include "kiln/tensor/device.h"

namespace kiln {

// A generator's seed and offset (its position in the stream), as Generator::state() returns it and set_state() takes
// it (checkpoints keep it).
struct GeneratorState {
  uint64_t seed = 0;    // the Philox key
  uint64_t offset = 0;  // the offset the next draw takes
  // CUDA graphs (backend use only): when set, a kernel reads the draw's offset here, in device memory, and not
  // `offset`; each replay of the graph writes a fresh one (see internal::random's draws during a capture).
  const uint64_t* device_offset = nullptr;
  // Equal seed, offset and device_offset.
  friend bool operator==(const GeneratorState&, const GeneratorState&) = default;
};

// A seeded random stream (Philox) for one device: the random ops take one, or use the device's default generator.
class Generator {
 public:
  // A stream at offset 0 of `seed`.
  explicit Generator(uint64_t seed = kDefaultSeed) : state_{seed, 0} {}
  static constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // the seed of an unseeded generator

  void manual_seed(uint64_t seed);              // restarts the stream: this seed, offset 0
  uint64_t seed() const;                        // the current seed
  GeneratorState state() const;                 // the seed and offset, for set_state()
  void set_state(const GeneratorState& state);  // rewinds or advances to `state` (device_offset dropped)
  // Reserves the offset of one draw and returns {seed, offset}. Thread-safe.
  GeneratorState next_draw();
  // Whether set_state() was called while a CUDA graph was being captured on the calling thread (a rewind that
  // replays could not follow) and no draw outside a capture came since; internal::draw_for refuses to draw in a
  // capture then.
  bool rewound_in_capture() const;

 private:
  mutable std::mutex mutex_;
  GeneratorState state_;
  bool rewound_in_capture_ = false;
};

// The default generator of a device (one per CPU, one per GPU).
Generator& default_generator(Device device = Device::cpu());
// Seeds the default generators of the CPU and of every GPU.
void manual_seed(uint64_t seed);

// ---- the Philox4x32-10 block function (Salmon et al., SC'11), shared by the backends' kernels ----
namespace philox {
// Philox's round multipliers (kM0: the first, kM1: the second).
inline constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // kM1: the second multiplier
// Philox's key increments per round (Weyl constants; kW0: for the key's low word).
inline constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // kW1: for the key's high word

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KILN_HOST_DEVICE inline
#endif

KILN_HOST_DEVICE void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {  // the 64-bit a * b in two halves
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Returns 4 random 32-bit words for (seed, counter index, offset).
KILN_HOST_DEVICE void block(uint64_t seed, uint64_t index, uint64_t offset, uint32_t out[4]) {
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32);
  uint32_t c2 = static_cast<uint32_t>(offset), c3 = static_cast<uint32_t>(offset >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c0, hi0, lo0);
    mulhilo(kM1, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// A 32-bit word to a float in [0, 1) with 24 random bits; to a double in [0, 1) with 53 bits from two words.
KILN_HOST_DEVICE float to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
KILN_HOST_DEVICE double to_unit_double(uint32_t hi, uint32_t lo) {  // [0, 1), 53 bits
  uint64_t v = (static_cast<uint64_t>(hi) << 32 | lo) >> 11;
  return static_cast<double>(v) * (1.0 / 9007199254740992.0);
}

// ---- the value of element i of one draw, for each distribution (every backend uses these) ----
// Uniform [0, 1) for float32/float16/bfloat16 outputs: word i % 4 of block i / 4.
KILN_HOST_DEVICE float uniform_float(uint64_t seed, uint64_t offset, uint64_t i) {
  uint32_t w[4];
  block(seed, i / 4, offset, w);
  return to_unit_float(w[i % 4]);
}
// Uniform [0, 1) for float64 outputs: words 2(i % 2), 2(i % 2) + 1 of block i / 2.
KILN_HOST_DEVICE double uniform_double(uint64_t seed, uint64_t offset, uint64_t i) {
  uint32_t w[4];
  block(seed, i / 2, offset, w);
  return to_unit_double(w[2 * (i % 2)], w[2 * (i % 2) + 1]);
}
// 64 random bits (randint): words 2(i % 2), 2(i % 2) + 1 of block i / 2.
KILN_HOST_DEVICE uint64_t bits64(uint64_t seed, uint64_t offset, uint64_t i) {
  uint32_t w[4];
  block(seed, i / 2, offset, w);
  return static_cast<uint64_t>(w[2 * (i % 2)]) << 32 | w[2 * (i % 2) + 1];
}
// Standard normal by Box-Muller, computed in double. Reduced-precision and float32 outputs: the pair of
// words 2((i % 4) / 2), +1 of block i / 4 gives u1, u2 (24 bits each). Float64 outputs: block i / 2
// gives u1 from words 0, 1 and u2 from words 2, 3 (53 bits each). Even i takes r cos θ, odd i r sin θ.
KILN_HOST_DEVICE double normal_value(uint64_t seed, uint64_t offset, uint64_t i, bool float64) {
  uint32_t w[4];
  double u1, u2;
  if (float64) {
    block(seed, i / 2, offset, w);
    u1 = to_unit_double(w[0], w[1]);
    u2 = to_unit_double(w[2], w[3]);
  } else {
    block(seed, i / 4, offset, w);
    int p = static_cast<int>((i % 4) / 2);
    u1 = to_unit_float(w[2 * p]);
    u2 = to_unit_float(w[2 * p + 1]);
  }
  double r = ::sqrt(-2.0 * ::log(1.0 - u1));  // 1 - u1 is in (0, 1]: no log(0)
  double theta = 6.283185307179586 * u2;
  return (i % 2 == 0) ? r * ::cos(theta) : r * ::sin(theta);
}

// ---- Bernoulli(q) decisions as integer compares (the fused dropout kernels use these) ----
// The uniforms above are integers scaled by a power of two: k / 2^24 with k = word >> 8, and k / 2^53 with k
// the top 53 of 64 bits. For an integer k, k / 2^24 < q holds exactly when k < ceil(q 2^24) (q 2^24 is exact
// in double), and likewise for 2^53; so these give bit for bit the decision `uniform < q` of a Bernoulli draw
// of probability q, without converting to floating point.
struct KeepThreshold {
  uint32_t below24 = 0;  // float32/float16/bfloat16 numbering: keep when (word >> 8) < below24
  uint64_t below53 = 0;  // float64 numbering: keep when the top 53 bits of (hi, lo) are < below53
};
// q in [0, 1].
inline KeepThreshold keep_threshold(double q) {
  return {static_cast<uint32_t>(std::ceil(q * 16777216.0)), static_cast<uint64_t>(std::ceil(q * 9007199254740992.0))};
}
// to_unit_float(word) < q, for below24 = keep_threshold(q).below24.
KILN_HOST_DEVICE bool keep_float(uint32_t word, uint32_t below24) { return (word >> 8) < below24; }
// to_unit_double(hi, lo) < q, for below53 = keep_threshold(q).below53.
KILN_HOST_DEVICE bool keep_double(uint32_t hi, uint32_t lo, uint64_t below53) {
  return ((static_cast<uint64_t>(hi) << 32 | lo) >> 11) < below53;
}
}  // namespace philox

}  // namespace kiln
