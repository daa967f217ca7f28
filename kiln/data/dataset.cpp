// kiln/data/dataset.cpp — Dataset::sample, map and subset.
#include "kiln/data/dataset.h"

#include <utility>

#include "kiln/tensor/error.h"

namespace kiln::data {

Example Dataset::sample(int64_t index, uint64_t seed, uint64_t epoch) const {
  KILN_CHECK(index >= 0 && index < size(), describe(), ": sample index ", index, " is out of range [0, ", size(), ")");
  SampleRng rng(seed, epoch, index);
  return get(index, rng);
}

namespace {

class MappedDataset : public Dataset {
 public:
  MappedDataset(std::shared_ptr<const Dataset> base, ExampleFn fn) : base_(std::move(base)), fn_(std::move(fn)) {}
  int64_t size() const override { return base_->size(); }
  Example get(int64_t index, SampleRng& rng) const override { return fn_(base_->get(index, rng), rng); }
  std::string describe() const override { return "map(" + base_->describe() + ")"; }

 private:
  std::shared_ptr<const Dataset> base_;
  ExampleFn fn_;
};

class SubsetDataset : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<const Dataset> base, int64_t begin, int64_t end)
      : base_(std::move(base)), begin_(begin), end_(end) {}
  int64_t size() const override { return end_ - begin_; }
  Example get(int64_t index, SampleRng& rng) const override { return base_->get(begin_ + index, rng); }
  std::string describe() const override {
    return "subset [" + std::to_string(begin_) + ", " + std::to_string(end_) + ") of " + base_->describe();
  }
  CollateFn collate_fn() const override { return base_->collate_fn(); }  // same examples, same batching

 private:
  std::shared_ptr<const Dataset> base_;
  int64_t begin_, end_;
};

}  // namespace

std::shared_ptr<Dataset> map(std::shared_ptr<const Dataset> base, ExampleFn fn) {
  KILN_CHECK(base != nullptr, "data::map: the dataset is null");
  KILN_CHECK(static_cast<bool>(fn), "data::map: the function is empty");
  return std::make_shared<MappedDataset>(std::move(base), std::move(fn));
}

std::shared_ptr<Dataset> subset(std::shared_ptr<const Dataset> base, int64_t begin, int64_t end) {
  KILN_CHECK(base != nullptr, "data::subset: the dataset is null");
  KILN_CHECK(begin >= 0 && begin <= end && end <= base->size(), "data::subset: [", begin, ", ", end,
             ") is not a range within the ", base->size(), " samples of ", base->describe());
  return std::make_shared<SubsetDataset>(std::move(base), begin, end);
}

}  // namespace kiln::data
