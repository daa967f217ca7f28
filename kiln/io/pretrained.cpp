// kiln/io/pretrained.cpp — format detection, the name mapping (user prefixes, TF-era LayerNorm names, an
// automatic prefix), and matching by name, shape and dtype before Module::load_state_dict copies the values.
#include "kiln/io/pretrained.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "kiln/io/torch_file.h"
#include "kiln/tensor/error.h"

namespace kiln::io {
namespace {

// The one place that reaches the safetensors reader.
NamedTensors read_safetensors_weights(const std::string& path) { return load_safetensors(path); }

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
std::string first_component(const std::string& name) {
  const size_t dot = name.find('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot + 1);  // "bert."
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << (s.size() == 1 ? ",)" : ")");
  return os.str();
}

size_t count_matches(const std::vector<std::string>& names, const std::map<std::string, size_t>& model) {
  size_t n = 0;
  for (const auto& s : names) n += model.count(s);
  return n;
}

// Up to kShown of the names, then how many there are in all.
template <typename Named>
std::string some_names(const Named& named) {
  constexpr size_t kShown = 5;
  std::string out;
  for (size_t i = 0; i < named.size() && i < kShown; ++i) out += (i ? ", " : "") + named[i].first;
  if (named.size() > kShown) out += ", ... (" + std::to_string(named.size()) + " in all)";
  return out.empty() ? "none" : out;
}

std::string nothing_loaded_message(const LoadReport& report, const NamedTensors& tensors,
                                   const nn::StateDict& model_sd) {
  std::ostringstream os;
  os << "io::load_weights: nothing of " << report.path << " was loaded: ";
  if (tensors.empty()) {
    os << "it holds no tensors, and the model has " << model_sd.size() << " (" << some_names(model_sd) << ")";
  } else if (model_sd.empty()) {
    os << "the model has no parameters or buffers to load its " << tensors.size() << " tensors into ("
       << some_names(tensors) << ")";
  } else if (report.mismatched.empty()) {
    os << "none of its " << tensors.size() << " names is one of the model's " << model_sd.size()
       << ".\n  the file's names: " << some_names(tensors) << "\n  the model's names: " << some_names(model_sd);
    for (const auto& r : report.renames) os << "\n  renamed: " << r;
  } else {
    os << "every tensor whose name matches has another shape or dtype than the model's.\n" << report.summary();
  }
  os << "\nIs it the weights file of this model? Map the file's names with LoadOptions::prefix_map "
        "({{\"from.\", \"to.\"}}), or give a model of the architecture the file was saved from.";
  return os.str();
}

}  // namespace

std::string LoadReport::summary() const {
  std::ostringstream os;
  os << path << ": loaded " << loaded.size() << ", missing " << missing.size() << ", unexpected " << unexpected.size()
     << ", mismatched " << mismatched.size() << "\n";
  for (const auto& r : renames) os << "  renamed: " << r << "\n";
  auto list = [&](const char* title, const std::vector<std::string>& names) {
    if (names.empty()) return;
    os << "  " << title << ":";
    for (size_t i = 0; i < names.size() && i < 20; ++i) os << " " << names[i];
    if (names.size() > 20) os << " ... (" << names.size() - 20 << " more)";
    os << "\n";
  };
  list("missing (not in the file)", missing);
  list("unexpected (not in the model)", unexpected);
  for (size_t i = 0; i < mismatched.size() && i < 20; ++i) {
    const auto& m = mismatched[i];
    os << "  mismatched: " << m.name << " file " << shape_str(m.file_shape) << " " << dtype_name(m.file_dtype)
       << ", model " << shape_str(m.model_shape) << " " << dtype_name(m.model_dtype) << "\n";
  }
  if (mismatched.size() > 20) os << "  ... (" << mismatched.size() - 20 << " more mismatched)\n";
  return os.str();
}

NamedTensors read_weights(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.is_open(), path, ": cannot open the weights file (missing, or not readable)");
  unsigned char head[9] = {};
  in.read(reinterpret_cast<char*>(head), 9);
  const auto got = static_cast<size_t>(in.gcount());
  if (got >= 2 && head[0] == 'P' && head[1] == 'K') return load_torch_file(path);
  if (got >= 2 && head[0] == 0x80 && head[1] == 0x02) return load_torch_file(path);  // legacy: a clear error
  if (got == 9 && head[8] == '{') return read_safetensors_weights(path);
  KILN_CHECK(!(got >= 4 && head[0] == 0x89 && head[1] == 'H' && head[2] == 'D' && head[3] == 'F'), path,
             ": an HDF5 file, not published weights; kiln's own checkpoints are read with io::load_checkpoint");
  KILN_FAIL(path, ": not a weights file kiln reads (neither a torch.save zip archive nor a safetensors file)");
}

LoadReport load_weights(nn::Module& model, const std::string& path, const LoadOptions& options) {
  return load_weights(model, read_weights(path), options, path);
}

LoadReport load_weights(nn::Module& model, const NamedTensors& tensors, const LoadOptions& options,
                        const std::string& source) {
  LoadReport report;
  report.path = source;
  const nn::StateDict model_sd = model.state_dict();
  std::map<std::string, size_t> model_index;
  for (size_t i = 0; i < model_sd.size(); ++i) model_index.emplace(model_sd[i].first, i);

  // 1 and 2: the user's prefixes, then TF-converted LayerNorm names.
  std::vector<std::string> names;
  size_t prefixed = 0, layer_norm = 0;
  for (const auto& [name, t] : tensors) {
    std::string n = name;
    for (const auto& [from, to] : options.prefix_map) {
      if (starts_with(n, from)) {
        n = to + n.substr(from.size());
        ++prefixed;
        break;
      }
    }
    for (const auto& [old_leaf, new_leaf] :
         {std::pair{"LayerNorm.gamma", "LayerNorm.weight"}, std::pair{"LayerNorm.beta", "LayerNorm.bias"}}) {
      if (ends_with(n, old_leaf)) {
        n = n.substr(0, n.size() - std::string(old_leaf).size()) + new_leaf;
        ++layer_norm;
      }
    }
    names.push_back(std::move(n));
  }
  if (prefixed) report.renames.push_back("prefix_map applied to " + std::to_string(prefixed) + " names");
  if (layer_norm)
    report.renames.push_back("LayerNorm.gamma/beta -> LayerNorm.weight/bias (" + std::to_string(layer_norm) +
                             " names, TF-converted checkpoint)");

  // 3: strip the file's first component, or add the model's, when that makes more names match.
  if (options.auto_prefix) {
    const size_t base = count_matches(names, model_index);
    size_t best = base;
    std::vector<std::string> best_names;
    std::string best_note;
    std::set<std::string> file_prefixes, model_prefixes;
    for (const auto& n : names) file_prefixes.insert(first_component(n));
    for (const auto& [n, t] : model_sd) model_prefixes.insert(first_component(n));
    for (const auto& p : file_prefixes) {
      if (p.empty()) continue;
      std::vector<std::string> cand = names;
      for (auto& n : cand)
        if (starts_with(n, p) && !model_index.count(n)) n = n.substr(p.size());
      if (const size_t c = count_matches(cand, model_index); c > best) {
        best = c, best_names = std::move(cand), best_note = "stripped the prefix '" + p + "' from the file's names";
      }
    }
    for (const auto& p : model_prefixes) {
      if (p.empty()) continue;
      std::vector<std::string> cand = names;
      for (auto& n : cand)
        if (!model_index.count(n)) n = p + n;
      if (const size_t c = count_matches(cand, model_index); c > best) {
        best = c, best_names = std::move(cand), best_note = "added the prefix '" + p + "' to the file's names";
      }
    }
    if (best > base) {
      names = std::move(best_names);
      report.renames.push_back(best_note + " (" + std::to_string(base) + " -> " + std::to_string(best) +
                               " names match)");
    }
  }

  // Match by name, then shape and dtype.
  nn::StateDict to_load;
  std::set<std::string> given;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& n = names[i];
    const Tensor& v = tensors[i].second;
    auto it = model_index.find(n);
    if (it == model_index.end() || given.count(n)) {
      report.unexpected.push_back(n);
      continue;
    }
    given.insert(n);
    const Tensor& target = model_sd[it->second].second;
    const bool dtype_ok =
        v.dtype() == target.dtype() || (options.convert_dtype && v.is_floating_point() && target.is_floating_point());
    if (v.shape() != target.shape() || !dtype_ok) {
      report.mismatched.push_back({n, v.shape(), target.shape(), v.dtype(), target.dtype()});
      continue;
    }
    to_load.emplace_back(n, v);
    report.loaded.push_back(n);
  }
  // Missing: model names without a value, unless a tied name (the same tensor) got one.
  using TensorKey = std::tuple<const void*, int64_t, Shape, Strides>;
  auto key_of = [](const Tensor& t) { return TensorKey{t.impl().storage().get(), t.offset(), t.shape(), t.strides()}; };
  std::set<TensorKey> loaded_tensors;
  for (const auto& n : report.loaded) loaded_tensors.insert(key_of(model_sd[model_index.at(n)].second));
  for (const auto& [n, t] : model_sd)
    if (!given.count(n) && !loaded_tensors.count(key_of(t))) report.missing.push_back(n);

  // Nothing to load from a file that is not empty, or into a model that has tensors: the wrong file or the wrong
  // model (or names that need a prefix_map), never a partial load to carry on with, strict or not.
  if (report.loaded.empty() && (!tensors.empty() || !model_sd.empty()))
    KILN_FAIL(nothing_loaded_message(report, tensors, model_sd));
  KILN_CHECK(!options.strict || report.ok(), "io::load_weights (strict): the weights do not match the model; ",
             report.summary(),
             "Load with {.strict = false} to take what matches (as torch's strict=False), or map the names with "
             "LoadOptions::prefix_map");
  model.load_state_dict(to_load, /*strict=*/false);
  return report;
}

}  // namespace kiln::io
