// kiln/data/sample_rng.h — the random numbers of one sample's loading (augmentation, masking), a pure
// function of (seed, epoch, index): the same sample gets the same crop whichever worker thread loads it
// and however many workers there are.
//
//   data::SampleRng rng(seed, epoch, index);
//   double u = rng.uniform();          // [0, 1)
//   int64_t k = rng.randint(10);       // 0..9
//   bool flip = rng.bernoulli(0.5);
#pragma once

#include <cstdint>

namespace kiln::data {

// A counter-based (Philox) random stream for one sample, a pure function of (seed, epoch, index).
class SampleRng {
 public:
  // The stream of sample `index` in `epoch` of a run seeded with `seed`.
  SampleRng(uint64_t seed, uint64_t epoch, int64_t index);

  double uniform();                      // [0, 1), 53 random bits
  double uniform(double lo, double hi);  // [lo, hi)
  int64_t randint(int64_t n);            // [0, n), n > 0, without modulo bias
  bool bernoulli(double p);              // true with probability p
  double normal();                       // standard normal
  uint64_t bits();                       // 64 random bits
  // An independent stream for a sub-task (e.g. one transform of a Compose): same inputs, same stream.
  SampleRng fork(uint64_t stream) const;

 private:
  SampleRng(uint64_t key, uint64_t index, uint64_t stream, int);
  uint64_t key_;
  uint64_t index_;
  uint64_t counter_ = 0;  // philox blocks used so far (4 words each)
  uint32_t words_[4] = {};
  int used_ = 4;  // words of words_ already consumed
  uint32_t next_word();
};

}  // namespace kiln::data
