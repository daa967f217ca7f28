// Sequential, ModuleList and ModuleDict (containers.h).
#include "kiln/layers/containers.h"

#include <algorithm>  // std::max
#include <sstream>    // std::ostringstream, to list keys in error messages

#include "kiln/autograd/checkpoint.h"

namespace kiln::nn {

namespace {

// Wraps a possibly negative index into [0, size), or throws naming the container and its size.
int64_t wrap_index(int64_t index, int64_t size, const std::string& type) {
  KILN_CHECK(index >= -size && index < size, type, "[", index, "]: index out of range for a ", type, " of ", size,
             " modules; valid indices are ", -size, " to ", size - 1);
  return index < 0 ? index + size : index;
}

}  // namespace

// ---- Sequential ----

// ---------------------------------------------------------------- IndexedModules
void IndexedModules::add_indexed(const std::string& name, ModulePtr module) {
  add_child(name, module);  // checks the name and the pointer
  modules_.push_back(std::move(module));
}

const ModulePtr& IndexedModules::operator[](int64_t index) const {
  return modules_[static_cast<size_t>(wrap_index(index, size(), type_name()))];
}

void IndexedModules::throw_bad_cast(int64_t index) const {
  KILN_FAIL(type_name(), "::at(", index, "): the module there is a ", (*this)[index]->type_name(),
            ", not the type asked for; use operator[] to get it as a ModulePtr");
}

// ---------------------------------------------------------------- Sequential
Sequential& Sequential::append(ModulePtr module) { return append(next_index(), std::move(module)); }

Sequential& Sequential::append(const std::string& name, ModulePtr module) {
  add_indexed(name, std::move(module));
  return *this;
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& m : *this) x = m(x);
  return x;
}

// ---- ModuleList ----

ModuleList& ModuleList::push_back(ModulePtr module) {
  add_indexed(next_index(), std::move(module));
  return *this;
}

Tensor ModuleList::forward(const Tensor&) {
  KILN_FAIL("ModuleList has no forward: it does not know how to chain its ", size(),
            " modules; iterate over it and call them yourself, or use a Sequential");
}

// ---- ModuleDict ----

ModuleDict::ModuleDict() : Module("ModuleDict") {}

ModuleDict& ModuleDict::insert(const std::string& key, ModulePtr module) {
  add_child(key, module);  // rejects empty, dotted and repeated keys, and null modules
  entries_.emplace_back(key, std::move(module));
  return *this;
}

Tensor ModuleDict::forward(const Tensor&) {
  KILN_FAIL("ModuleDict has no forward: call the module you want, e.g. dict[\"",
            entries_.empty() ? "key" : entries_[0].first, "\"](x)");
}

const ModulePtr& ModuleDict::operator[](const std::string& key) const {
  for (const auto& [k, m] : entries_)
    if (k == key) return m;
  std::ostringstream known;
  for (size_t i = 0; i < entries_.size(); ++i) known << (i ? ", " : "") << '"' << entries_[i].first << '"';
  KILN_FAIL("ModuleDict[\"", key, "\"]: no such key; the keys are [", known.str(),
            "]; check the spelling, or test with contains() first");
}

bool ModuleDict::contains(const std::string& key) const {
  for (const auto& [k, m] : entries_)
    if (k == key) return true;
  return false;
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, m] : entries_) out.push_back(k);
  return out;
}

Tensor checkpoint_sequential(const Sequential& modules, int64_t segments, const Tensor& input) {
  const int64_t n = modules.size();
  KILN_CHECK(segments >= 1 && segments <= std::max<int64_t>(n, 1), "checkpoint_sequential: segments must be in [1, ",
             std::max<int64_t>(n, 1), "] for a Sequential of ", n, " modules, got ", segments);
  // Segment s holds modules [s * n / segments, (s + 1) * n / segments). Each checkpointed run keeps its own
  // handles to its modules: backward recomputes it after this function has returned.
  Tensor h = input;
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t begin = s * n / segments, end = (s + 1) * n / segments;
    std::vector<ModulePtr> run(modules.begin() + begin, modules.begin() + end);
    auto forward = [run](const Tensor& x) {
      Tensor y = x;
      for (const ModulePtr& m : run) y = m(y);
      return y;
    };
    h = s + 1 == segments ? forward(h) : autograd::checkpoint(forward, h);
  }
  return h;
}

}  // namespace kiln::nn
