// kiln/data/datasets/synthetic.h — random samples of given shapes and dtypes, for benchmarks and smoke tests.
//
//   data::SyntheticDataset ds({.size = 50000,
//                              .fields = {{"image", {3, 224, 224}, DType::Float32},
//                                         {"label", {}, DType::Int64, /*num_classes=*/1000}},
//                              .seed = 0});
//
// Sample i is a pure function of (seed, i): the same every epoch, like a dataset on disk, whatever the epoch
// or thread. Floating fields are (approximately) standard normal: each element is the inverse normal CDF of
// one 32-bit Philox word, from a 4096-cell table with linear interpolation (exact to ~1e-4 within |x| < 3.3,
// tails cut at |x| ~ 4.5), so a float32 field fills at memory speed. Integer fields are uniform in
// [0, num_classes); Bool fields are fair coin flips.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/data/dataset.h"

namespace kiln::data {

// One field of SyntheticDataset's examples.
struct SyntheticField {
  std::string name{};            // the field's name in the Example; unique
  Shape shape{};                 // of one sample; {} for a scalar
  DType dtype = DType::Float32;  // floating: standard normal values; integer or Bool: see num_classes
  int64_t num_classes = 0;       // integer fields: values in [0, num_classes) (needed; UInt8 defaults to 256)
};

// Options of SyntheticDataset.
struct SyntheticOptions {
  int64_t size = 0;                      // the number of examples
  std::vector<SyntheticField> fields{};  // at least one
  uint64_t seed = 0;                     // with the index, decides each example's values
};

// Generated examples of given shapes, seeded (for benchmarks and tests).
class SyntheticDataset : public Dataset {
 public:
  // kiln::Error for a negative size, no fields, a duplicate name, a negative dim, a float8 dtype, or an integer
  // field without a num_classes its dtype can hold.
  explicit SyntheticDataset(SyntheticOptions options);

  int64_t size() const override { return options_.size; }
  Example get(int64_t index, SampleRng& rng) const override;  // rng is not used: samples ignore the epoch
  std::string describe() const override;

 private:
  SyntheticOptions options_;
};

}  // namespace kiln::data
