// kiln/data/dataset.h — the Dataset interface: a size and a get(index) that worker threads call concurrently.
//
//   class Squares : public data::Dataset {
//    public:
//     int64_t size() const override { return 100; }
//     data::Example get(int64_t i, data::SampleRng& rng) const override {
//       return {{"x", scalar_tensor(double(i))}, {"y", scalar_tensor(double(i * i))}};
//     }
//   };
//
// get() must be safe to call from several threads at once (read-only state, or its own locking), and draw
// every random number from `rng` so a sample is a pure function of (seed, epoch, index).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/data/example.h"
#include "kiln/data/sample_rng.h"

namespace kiln::data {

// Makes a batch of examples (in a loader's worker thread); `pinned`: write host fields into page-locked memory
// (as data::collate does). A batch may also hold fields already on a GPU, with Batch::ready.
using CollateFn = std::function<Batch(const std::vector<Example>& examples, bool pinned)>;

// A dataset: size() examples, each made by get(i) as named tensors (an Example); the DataLoader batches them.
class Dataset {
 public:
  virtual ~Dataset() = default;
  // The number of examples, as torch.utils.data.Dataset.__len__.
  virtual int64_t size() const = 0;
  // Example `index` (0 <= index < size(), checked by the caller); random augmentations draw from rng, so a sample
  // is the same for the same seed, epoch and index. May be called from several worker threads at once.
  virtual Example get(int64_t index, SampleRng& rng) const = 0;
  // A short description for messages ("MNIST(train, 60000 images, /data/mnist)").
  virtual std::string describe() const { return "dataset of " + std::to_string(size()) + " samples"; }
  // How a DataLoader makes batches of this dataset's examples when its options name no collate function:
  // null means data::collate. An ImageFolder that decodes on the GPU returns the function that does it.
  virtual CollateFn collate_fn() const { return {}; }

  // get() with a fresh SampleRng(seed, epoch, index), after checking the index (a clear error out of range).
  Example sample(int64_t index, uint64_t seed = 0, uint64_t epoch = 0) const;
};

// A dataset whose samples are another's, passed through a function (applied in the worker threads):
//   auto ds = data::map(mnist, [](data::Example ex, data::SampleRng& rng) { ...; return ex; });
using ExampleFn = std::function<Example(Example, SampleRng&)>;
// base's examples through fn, of base's size; kiln::Error if base is null or fn empty.
std::shared_ptr<Dataset> map(std::shared_ptr<const Dataset> base, ExampleFn fn);

// What image datasets (MNIST, CIFAR, ImageFolder) apply to each image in the worker threads: a uint8 (H, W, C)
// image in, any tensor out (e.g. float (C, H, W) after ToTensor + Normalize). kiln/data/transforms.h builds them.
using ImageTransform = std::function<Tensor(Tensor image, SampleRng& rng)>;

// The first `n` samples, or samples [begin, end), of another dataset (views: nothing is copied).
std::shared_ptr<Dataset> subset(std::shared_ptr<const Dataset> base, int64_t begin, int64_t end);

}  // namespace kiln::data
