// kiln/data/example.h — what datasets return and loaders hand out: named tensors in order.
//
//   data::Example ex{{"image", img}, {"label", scalar_tensor(3)}};   // one sample
//   auto [image, label] = ex;                       // structured binding: exactly two fields
//   data::Batch batch = data::collate(examples);     // each field stacked along a new dim 0
//   Tensor ids = batch["input_ids"];                 // by name (an unknown name lists the known ones)
//   batch = batch.to(Device::cuda(0), /*non_blocking=*/true);
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::cuda {
class Event;  // kiln/tensor/cuda.h
}  // namespace kiln::cuda

namespace kiln::data {

// Named tensors, in the order they were added. Names are unique.
class Example {
 public:
  // No fields.
  Example() = default;
  // {{"image", x}, {"label", y}}: the fields in order, each added as add() does.
  Example(std::initializer_list<std::pair<std::string, Tensor>> fields);

  void add(std::string name, Tensor value);  // throws when the name is already there
  // The number of fields.
  size_t size() const { return values_.size(); }
  // Whether there is no field.
  bool empty() const { return values_.empty(); }
  bool contains(std::string_view name) const;  // whether a field has that name
  // The field names, in the order added.
  const std::vector<std::string>& names() const { return names_; }

  Tensor& operator[](size_t i);                           // the i-th field added; throws when out of range
  const Tensor& operator[](size_t i) const;               // the i-th field added; throws when out of range
  Tensor& operator[](std::string_view name);              // throws, naming the fields there are
  const Tensor& operator[](std::string_view name) const;  // throws, naming the fields there are

  // For structured bindings (auto [x, y] = example): needs exactly two fields, else throws saying to index
  // by name.
  template <size_t I>
  const Tensor& get() const {
    check_pair();
    return values_[I];
  }

 private:
  void check_pair() const;
  std::vector<std::string> names_;
  std::vector<Tensor> values_;
};

// A collated batch: the fields of its examples stacked along a new first dim, plus the dataset indices of
// its samples (in order).
class Batch : public Example {
 public:
  Batch() = default;
  using Example::Example;

  int64_t batch_size() const;    // dim 0 of the first field (0 when empty)
  std::vector<int64_t> indices;  // the samples' dataset indices, in batch order
  // For fields made on a GPU by the collate function (GPU image decoding): happens when they are written.
  // The DataLoader makes the consumer's stream wait for it; who takes such a batch otherwise must too
  // (ready->wait(stream)). Null when every field is ready when the batch is made.
  std::shared_ptr<cuda::Event> ready;

  // Every field copied to `device` (fields already there are kept). non_blocking copies from pinned memory
  // run asynchronously on the current stream of `device`.
  Batch to(Device device, bool non_blocking = false) const;
  Batch pin_memory() const;  // every field in page-locked host memory (a copy; no-op without CUDA)
};

// Stacks the examples field by field: every example must have the same names in the same order, and each
// field the same dtype and shape across examples (the error names the sample, the field and both shapes).
// With `pinned`, the batch is written straight into page-locked host memory (where CUDA is available).
Batch collate(const std::vector<Example>& examples, bool pinned = false);

// collate one example at a time: the batch's tensors are made when the first example arrives (`count` rows), and
// each example is copied into its row as it is added, so a loader can let each sample go (and reuse its memory,
// still in the CPU's cache) before it loads the next. Same checks and errors as collate.
//
//   Collator c(idx.size(), pinned);
//   for (int64_t i : idx) c.add(dataset.get(i, rng));
//   Batch b = c.finish();
class Collator {
 public:
  // A batch of `count` (> 0) examples; pinned: write it into page-locked host memory (where CUDA is available).
  explicit Collator(size_t count, bool pinned = false);
  void add(const Example& example);  // example number `added()`; throws when it does not match the first one
  // The number of examples added so far.
  size_t added() const { return added_; }
  Batch finish();  // after `count` examples; the collator is empty afterwards

 private:
  size_t count_;
  bool pinned_;
  size_t added_ = 0;
  // The first example's fields: every later one must match them.
  std::vector<std::string> names_;
  std::vector<DType> dtypes_;
  std::vector<Shape> shapes_;
  Batch out_;
};

}  // namespace kiln::data

template <>
struct std::tuple_size<kiln::data::Example> : std::integral_constant<size_t, 2> {};
// The type of a structured binding's element: a const Tensor.
template <size_t I>
struct std::tuple_element<I, kiln::data::Example> {
  using type = const kiln::Tensor;  // what Example::get returns
};
template <>
struct std::tuple_size<kiln::data::Batch> : std::integral_constant<size_t, 2> {};
// The type of a structured binding's element: a const Tensor.
template <size_t I>
struct std::tuple_element<I, kiln::data::Batch> {
  using type = const kiln::Tensor;  // what Example::get returns
};
