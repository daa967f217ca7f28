// kiln/data/example.cpp — named tensors, batches and collation.
#include "kiln/data/example.h"

#include <cstring>

#include "kiln/tensor/cuda.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::data {

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "(none)" : s;
}

}  // namespace

Example::Example(std::initializer_list<std::pair<std::string, Tensor>> fields) {
  for (const auto& [name, value] : fields) add(name, value);
}

void Example::add(std::string name, Tensor value) {
  KILN_CHECK(!contains(name), "Example.add: a field named '", name, "' is already there (fields: ", joined(names_),
             ")");
  names_.push_back(std::move(name));
  values_.push_back(std::move(value));
}

bool Example::contains(std::string_view name) const {
  for (const auto& n : names_) {
    if (n == name) return true;
  }
  return false;
}

Tensor& Example::operator[](size_t i) {
  KILN_CHECK(i < values_.size(), "Example: field index ", i, " is out of range (", values_.size(),
             " fields: ", joined(names_), ")");
  return values_[i];
}
const Tensor& Example::operator[](size_t i) const { return const_cast<Example&>(*this)[i]; }

Tensor& Example::operator[](std::string_view name) {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return values_[i];
  }
  KILN_CHECK(false, "Example: no field named '", name, "' (fields: ", joined(names_), ")");
  return values_[0];  // not reached
}
const Tensor& Example::operator[](std::string_view name) const { return const_cast<Example&>(*this)[name]; }

void Example::check_pair() const {
  KILN_CHECK(values_.size() == 2, "structured binding of an Example or Batch needs exactly two fields; this one has ",
             values_.size(), " (", joined(names_), "): index it by name instead, e.g. batch[\"",
             names_.empty() ? std::string("input") : names_[0], "\"]");
}

int64_t Batch::batch_size() const {
  return empty() ? 0 : (*this)[size_t{0}].dim() > 0 ? (*this)[size_t{0}].size(0) : 0;
}

Batch Batch::to(Device device, bool non_blocking) const {
  Batch out;
  out.indices = indices;
  out.ready = ready;
  for (size_t i = 0; i < size(); ++i) out.add(names()[i], internal::to((*this)[i], device, {}, non_blocking));
  return out;
}

Batch Batch::pin_memory() const {
  Batch out;
  out.indices = indices;
  out.ready = ready;
  for (size_t i = 0; i < size(); ++i) {
    const Tensor& t = (*this)[i];
    out.add(names()[i], cuda::is_available() && t.is_cpu() ? internal::pin_memory(t) : t);
  }
  return out;
}

Collator::Collator(size_t count, bool pinned) : count_(count), pinned_(pinned && cuda::is_available()) {
  KILN_CHECK(count > 0, "collate: no examples to stack");
}

void Collator::add(const Example& ex) {
  KILN_CHECK(added_ < count_, "collate: example ", added_, " added to a batch of ", count_);
  const size_t e = added_;
  if (e == 0) {
    for (size_t f = 0; f < ex.size(); ++f) {
      const std::string& name = ex.names()[f];
      const Tensor& t0 = ex[f];
      KILN_CHECK(t0.defined(), "collate: field '", name, "' of sample 0 is an undefined tensor");
      KILN_CHECK(t0.is_cpu(), "collate: field '", name, "' of sample 0 is on ", t0.device(),
                 "; datasets return CPU tensors and the loader moves batches to the device");
      Shape shape{static_cast<int64_t>(count_)};
      shape.insert(shape.end(), t0.shape().begin(), t0.shape().end());
      out_.add(name, internal::empty(shape, {.dtype = t0.dtype(), .pinned_memory = pinned_}));
      names_.push_back(name);
      dtypes_.push_back(t0.dtype());
      shapes_.push_back(t0.shape());
    }
  }
  KILN_CHECK(ex.names() == names_, "collate: sample ", e, " has fields (", joined(ex.names()), ") but sample 0 has (",
             joined(names_), ")");
  for (size_t f = 0; f < ex.size(); ++f) {
    const std::string& name = ex.names()[f];
    const Tensor& t = ex[f];
    KILN_CHECK(t.defined() && t.dtype() == dtypes_[f] && t.shape() == shapes_[f] && t.is_cpu(), "collate: field '",
               name, "' of sample ", e, " is ", t.defined() ? t.dtype() : dtypes_[f], " of shape ",
               t.defined() ? t.shape() : Shape{}, " on ", t.defined() ? t.device() : Device::cpu(),
               " but sample 0 has ", dtypes_[f], " of shape ", shapes_[f],
               " on cpu; every sample of a batch needs the same shape (pad or crop in the dataset)");
    const Tensor c = t.is_contiguous() ? t : internal::contiguous(t);
    const size_t bytes = c.nbytes();
    std::memcpy(static_cast<char*>(out_[f].data_ptr()) + e * bytes, c.data_ptr(), bytes);
  }
  ++added_;
}

Batch Collator::finish() {
  KILN_CHECK(added_ == count_, "collate: a batch of ", count_, " finished after ", added_, " examples");
  Batch b = std::move(out_);
  out_ = Batch();
  names_.clear();
  dtypes_.clear();
  shapes_.clear();
  added_ = 0;
  return b;
}

Batch collate(const std::vector<Example>& examples, bool pinned) {
  KILN_CHECK(!examples.empty(), "collate: no examples to stack");
  Collator c(examples.size(), pinned);
  for (const Example& ex : examples) c.add(ex);
  return c.finish();
}

}  // namespace kiln::data
