// kiln/io/pretrained.h — published weights (torchvision's .pth, Hugging Face's .bin / .safetensors) loaded
// into kiln's models by name, with a report of what matched.
//
//   auto model = nn::models::resnet18({.num_classes = 1000});
//   io::load_weights(*model, "resnet18.pth");  // strict (the default): a kiln::Error listing any difference
//
//   auto clf = nn::models::resnet18({.num_classes = 10});                   // fine-tuning: another classifier
//   io::LoadReport r = io::load_weights(*clf, "resnet18.pth", {.strict = false});  // loads what matches
//   std::cout << r.summary();                                                // loaded / missing / mismatched / ...
//
// As Module::load_state_dict (and torch's load_state_dict(strict=True)), loading is strict by default.
// Not strict, whatever does not match is reported and left as it is; but a file of which nothing loads (no
// name matches the model's, or every one that does has another shape or dtype) is always a kiln::Error naming
// the file and some of its names and the model's: it is the wrong file, or needs LoadOptions::prefix_map.
//
// The format is found from the content: a zip archive ("PK") is a torch.save file (io::read_torch_file), an
// 8-byte length followed by '{' a safetensors file (io::load_safetensors). Before matching, the file's names
// go through, in order:
//   1. options.prefix_map: {from, to} pairs; a name starting with `from` has it replaced by `to` (first match);
//   2. TF-converted BERT names: "LayerNorm.gamma" / "LayerNorm.beta" -> "LayerNorm.weight" / "LayerNorm.bias";
//   3. options.auto_prefix: when stripping the file's common first component ("bert.", "module.") or adding
//      the model's ("bert.") makes more names match, it is done (a BertModel's weights into BertForMaskedLM
//      and back; a DistributedDataParallel "module." prefix) and LoadReport::renames says so.
// Values are converted to each parameter's dtype (float16 files into float32 models) and copied to its
// device. A tied tensor (BERT's decoder weight is the word-embedding table) needs only one of its names.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kiln/io/safetensors.h"  // io::NamedTensors
#include "kiln/layers/module.h"   // nn::Module
#include "kiln/tensor/tensor.h"

namespace kiln::io {

// How load_weights matches a file's names to a model's (see the top of this file).
struct LoadOptions {
  // true: any missing, unexpected or mismatched name is a kiln::Error listing them, and nothing is loaded.
  // false (torch's strict=False): what matches is loaded, the rest reported in the LoadReport.
  bool strict = true;
  std::vector<std::pair<std::string, std::string>> prefix_map{};  // {from, to}, applied to the file's names
  bool auto_prefix = true;  // strip the file's or add the model's first name component when more names match
  // true: floating-point values are converted to the model's dtype. false: a dtype difference is a mismatch.
  // Integer and bool tensors must always match the model's dtype (e.g. BatchNorm's num_batches_tracked).
  bool convert_dtype = true;
};

// A name in both the file and the model whose values differ in shape (or in dtype, see convert_dtype).
struct LoadMismatch {
  std::string name{};  // the model's name
  // The file's shape.
  Shape file_shape{}, model_shape{};  // the model's shape
  // The file's dtype.
  DType file_dtype{}, model_dtype{};  // the model's dtype
};

// What load_weights did: which names were loaded, missing, unexpected, mismatched or renamed.
struct LoadReport {
  std::string path{};                      // the file loaded (or the `source` given for tensors in memory)
  std::vector<std::string> loaded{};       // model names given values
  std::vector<std::string> missing{};      // model names the file has no value for
  std::vector<std::string> unexpected{};   // file names (after mapping) the model has no tensor for
  std::vector<LoadMismatch> mismatched{};  // in both, but of another shape (or dtype, see convert_dtype)
  std::vector<std::string> renames{};      // what was done to the file's names, in words
  // Whether every name matched: nothing missing, unexpected or mismatched.
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  std::string summary() const;  // counts, then the names (up to 20 of each list)
};

// The tensors of a weights file, whichever its format (see above): CPU tensors of the file's dtypes.
NamedTensors read_weights(const std::string& path);

// Reads the weights file `path` (read_weights) and loads it into model's parameters and buffers by name.
LoadReport load_weights(nn::Module& model, const std::string& path, const LoadOptions& options = {});
// The same from tensors already in memory; source names them in messages.
LoadReport load_weights(nn::Module& model, const NamedTensors& tensors, const LoadOptions& options = {},
                        const std::string& source = "weights");

}  // namespace kiln::io
