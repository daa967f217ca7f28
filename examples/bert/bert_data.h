// examples/bert/bert_data.h — the inputs of the BERT example besides the masked-LM text: the list of text
// files, sentence-classification TSV files, an evaluation sampler without padding, and the Hugging Face
// style model folder (config.json, tokenizer_config.json, vocab.txt) read and written by the example.
// Written against kiln's public API only; every bad input is a std::runtime_error that names the file, the
// line and what to do.
#pragma once

#include <kiln/kiln.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace bert_example {

namespace fs = std::filesystem;
using kiln::Tensor;
namespace models = kiln::models;
namespace data = kiln::data;

// ---------------------------------------------------------------- text files

// "--text a.txt,b.txt,corpus/": files as given, folders as their regular files in name order.
inline std::vector<fs::path> text_files(const std::string& list) {
  std::vector<fs::path> files;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const fs::path p(item);
    if (fs::is_directory(p)) {
      std::vector<fs::path> inside;
      for (const auto& e : fs::directory_iterator(p)) {
        if (e.is_regular_file()) inside.push_back(e.path());
      }
      if (inside.empty()) throw std::runtime_error("--text: the folder " + item + " holds no files");
      std::sort(inside.begin(), inside.end());
      files.insert(files.end(), inside.begin(), inside.end());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      throw std::runtime_error("--text: " + item + " does not exist (give text files or folders, comma-separated)");
    }
  }
  if (files.empty()) throw std::runtime_error("pretraining needs text: give --text FILE[,FILE|FOLDER...]");
  return files;
}

// ---------------------------------------------------------------- sentence classification

// One line of a TSV file: label<TAB>text or label<TAB>text_a<TAB>text_b.
struct LabeledText {
  std::string label, text_a, text_b;
  int64_t line = 0;  // 1-based, for messages
};

inline std::vector<LabeledText> read_tsv(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string() + " (does it exist?)");
  std::vector<LabeledText> rows;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();  // files written on Windows
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::vector<std::string> fields;
    std::stringstream s(line);
    std::string f;
    while (std::getline(s, f, '\t')) fields.push_back(f);
    if (fields.size() < 2 || fields.size() > 3) {
      throw std::runtime_error(path.string() + ":" + std::to_string(n) + ": expected label<TAB>text or " +
                               "label<TAB>text_a<TAB>text_b, got " + std::to_string(fields.size()) +
                               " tab-separated field(s) in '" + line.substr(0, 60) + "'");
    }
    if (fields[0].empty()) throw std::runtime_error(path.string() + ":" + std::to_string(n) + ": the label is empty");
    rows.push_back({fields[0], fields[1], fields.size() == 3 ? fields[2] : std::string(), n});
  }
  if (rows.empty()) throw std::runtime_error(path.string() + " holds no labeled lines (label<TAB>text)");
  return rows;
}

// The label names in class-index order. When every label is a non-negative integer the integer is the class
// ("0", "1", "2" as in GLUE's files); otherwise the names are sorted ("negative" = 0, "positive" = 1).
inline std::vector<std::string> label_names(const std::vector<LabeledText>& rows) {
  std::set<std::string> names;
  for (const auto& r : rows) names.insert(r.label);
  const bool numeric = std::all_of(names.begin(), names.end(), [](const std::string& s) {
    return s.size() < 10 && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
  });
  if (!numeric) return {names.begin(), names.end()};
  int64_t top = 0;
  for (const auto& s : names) top = std::max<int64_t>(top, std::stoll(s));
  std::vector<std::string> out;
  for (int64_t i = 0; i <= top; ++i) out.push_back(std::to_string(i));
  return out;
}

// [CLS] a [SEP] (b [SEP]) with token types 0 for a, 1 for b, padded to seq_len; longer texts are cut as
// Hugging Face's "longest_first": a token at a time from the longer of the two.
class ClassificationDataset : public data::Dataset {
 public:
  ClassificationDataset(const fs::path& path, std::shared_ptr<const data::WordPieceTokenizer> tokenizer,
                        int64_t seq_len, const std::vector<std::string>& labels)
      : path_(path), tokenizer_(std::move(tokenizer)), seq_len_(seq_len), rows_(read_tsv(path)) {
    if (seq_len_ < 4) throw std::runtime_error("--seq-len must be at least 4 for classification");
    std::map<std::string, int64_t> index;
    for (size_t i = 0; i < labels.size(); ++i) index[labels[i]] = static_cast<int64_t>(i);
    for (const auto& r : rows_) {
      auto it = index.find(r.label);
      if (it == index.end()) {
        throw std::runtime_error(path.string() + ":" + std::to_string(r.line) + ": the label '" + r.label +
                                 "' is not one of the training set's labels (" + join(labels) + ")");
      }
      label_ids_.push_back(it->second);
    }
    cls_ = tokenizer_->cls_id();
    sep_ = tokenizer_->sep_id();
    pad_ = tokenizer_->pad_id();
  }

  int64_t size() const override { return static_cast<int64_t>(rows_.size()); }

  // Tokenizes in the loader's worker threads (the tokenizer is read-only, so this is thread-safe).
  data::Example get(int64_t index, data::SampleRng&) const override {
    const LabeledText& r = rows_[static_cast<size_t>(index)];
    std::vector<int32_t> a = tokenizer_->encode(r.text_a), b;
    const bool pair = !r.text_b.empty();
    if (pair) b = tokenizer_->encode(r.text_b);
    const size_t room = static_cast<size_t>(seq_len_ - (pair ? 3 : 2));
    while (a.size() + b.size() > room) (a.size() >= b.size() ? a : b).pop_back();

    const auto L = static_cast<size_t>(seq_len_);
    std::vector<int64_t> ids(L, pad_), types(L, 0), mask(L, 0);
    size_t n = 0;
    auto put = [&](int64_t id, int64_t type) {
      ids[n] = id;
      types[n] = type;
      mask[n] = 1;
      ++n;
    };
    put(cls_, 0);
    for (int32_t t : a) put(t, 0);
    put(sep_, 0);
    if (pair) {
      for (int32_t t : b) put(t, 1);
      put(sep_, 1);
    }
    return data::Example{{"input_ids", kiln::from_vector(ids, {seq_len_})},
                         {"token_type_ids", kiln::from_vector(types, {seq_len_})},
                         {"attention_mask", kiln::from_vector(mask, {seq_len_})},
                         {"labels", kiln::scalar_tensor(label_ids_[static_cast<size_t>(index)],
                                                        {.dtype = kiln::DType::Int64})}};  // 0-d: (N) batched
  }

  std::string describe() const override {
    return "ClassificationDataset(" + std::to_string(size()) + " lines of " + path_.string() + ")";
  }

  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  }

 private:
  fs::path path_;
  std::shared_ptr<const data::WordPieceTokenizer> tokenizer_;
  int64_t seq_len_;
  std::vector<LabeledText> rows_;
  std::vector<int64_t> label_ids_;
  int64_t cls_ = 0, sep_ = 0, pad_ = 0;
};

// Evaluation: rank r takes samples r, r + W, r + 2W, ... with no padding (DistributedSampler repeats samples to
// give every rank as many), so the all-reduced counts cover every sample exactly once. Ranks may then have
// one batch more or less; that is fine because evaluation runs no collective per batch.
class RankShard : public data::Sampler {
 public:
  RankShard(int64_t n, int rank, int world) : n_(n), rank_(rank), world_(world) {}
  int64_t size() const override { return n_ > rank_ ? (n_ - rank_ + world_ - 1) / world_ : 0; }
  std::vector<int64_t> indices(uint64_t) const override {
    std::vector<int64_t> out;
    for (int64_t i = rank_; i < n_; i += world_) out.push_back(i);
    return out;
  }

 private:
  int64_t n_;
  int rank_, world_;
};

// ---------------------------------------------------------------- the model folder

// A value of a flat JSON object such as Hugging Face's config.json: the text after "key": (a number, true/false
// or a quoted string), or nothing when the key is absent. Enough for the top-level fields this example reads;
// it is not a general JSON parser.
inline std::optional<std::string> json_value(const std::string& json, const std::string& key) {
  const std::string quoted = "\"" + key + "\"";
  size_t at = 0;
  while ((at = json.find(quoted, at)) != std::string::npos) {
    size_t p = json.find_first_not_of(" \t\r\n", at + quoted.size());
    at += quoted.size();
    if (p == std::string::npos || json[p] != ':') continue;  // a value equal to the key, not the key
    p = json.find_first_not_of(" \t\r\n", p + 1);
    if (p == std::string::npos) return std::nullopt;
    if (json[p] == '"') {
      const size_t end = json.find('"', p + 1);
      if (end == std::string::npos) return std::nullopt;
      return json.substr(p + 1, end - p - 1);
    }
    const size_t end = json.find_first_of(",}\r\n", p);
    std::string v = json.substr(p, end == std::string::npos ? std::string::npos : end - p);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
    return v;
  }
  return std::nullopt;
}

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// config.json as Hugging Face's BertConfig writes it (the fields BertConfig has; others are ignored).
inline models::BertConfig read_bert_config(const fs::path& path) {
  const std::string json = read_file(path);
  if (auto t = json_value(json, "model_type"); t && *t != "bert") {
    throw std::runtime_error(path.string() + " describes a '" + *t +
                             "' model; this example trains BERT (model_type \"bert\")");
  }
  models::BertConfig c;
  auto integer = [&](const char* key, int64_t& field, bool required) {
    auto v = json_value(json, key);
    if (!v) {
      if (required) throw std::runtime_error(path.string() + " has no \"" + key + "\"; is it a BERT config.json?");
      return;
    }
    try {
      field = std::stoll(*v);
    } catch (const std::exception&) {
      throw std::runtime_error(path.string() + ": \"" + key + "\" should be an integer, got " + *v);
    }
  };
  auto number = [&](const char* key, double& field) {
    if (auto v = json_value(json, key)) {
      try {
        field = std::stod(*v);
      } catch (const std::exception&) {
        throw std::runtime_error(path.string() + ": \"" + key + "\" should be a number, got " + *v);
      }
    }
  };
  integer("vocab_size", c.vocab_size, true);
  integer("hidden_size", c.hidden_size, true);
  integer("num_hidden_layers", c.num_hidden_layers, true);
  integer("num_attention_heads", c.num_attention_heads, true);
  integer("intermediate_size", c.intermediate_size, true);
  integer("max_position_embeddings", c.max_position_embeddings, false);
  integer("type_vocab_size", c.type_vocab_size, false);
  integer("pad_token_id", c.pad_token_id, false);
  number("hidden_dropout_prob", c.hidden_dropout_prob);
  number("attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  number("layer_norm_eps", c.layer_norm_eps);
  number("initializer_range", c.initializer_range);
  if (auto act = json_value(json, "hidden_act")) {
    if (*act == "gelu") {
      c.hidden_act = models::BertActivation::Gelu;
    } else if (*act == "gelu_new" || *act == "gelu_pytorch_tanh") {
      c.hidden_act = models::BertActivation::GeluTanh;
    } else if (*act == "relu") {
      c.hidden_act = models::BertActivation::Relu;
    } else {
      throw std::runtime_error(path.string() + ": hidden_act \"" + *act +
                               "\" is not one kiln's BERT has (gelu, gelu_new, relu)");
    }
  }
  if (auto p = json_value(json, "position_embedding_type"); p && *p != "absolute") {
    throw std::runtime_error(path.string() + ": position_embedding_type \"" + *p +
                             "\" is not supported; kiln's BERT has absolute position embeddings");
  }
  try {
    c.validate();
  } catch (const kiln::Error& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  }
  return c;
}

inline const char* activation_name(models::BertActivation a) {
  switch (a) {
    case models::BertActivation::Gelu: return "gelu";
    case models::BertActivation::GeluTanh: return "gelu_new";
    case models::BertActivation::Relu: return "relu";
  }
  return "gelu";
}

inline std::string json_string(const std::string& s) {
  std::string q = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') q += '\\';
    q += ch;
  }
  return q + "\"";
}

// Writes config.json in Hugging Face's format (the fields of transformers' BertConfig), so that the folder, with
// the model.safetensors written at the end of a run, is laid out as from_pretrained expects. `labels`: the
// classes of a classifier, in index order.
inline void write_bert_config(const fs::path& path, const models::BertConfig& c, const std::string& architecture,
                              const std::vector<std::string>& labels = {}) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path.string());
  out << "{\n"
      << "  \"architectures\": [" << json_string(architecture) << "],\n";
  if (!labels.empty()) {
    out << "  \"id2label\": {";
    for (size_t i = 0; i < labels.size(); ++i) out << (i ? ", " : "") << "\"" << i << "\": " << json_string(labels[i]);
    out << "},\n  \"label2id\": {";
    for (size_t i = 0; i < labels.size(); ++i) out << (i ? ", " : "") << json_string(labels[i]) << ": " << i;
    out << "},\n";
  }
  out << "  \"model_type\": \"bert\",\n"
      << "  \"vocab_size\": " << c.vocab_size << ",\n"
      << "  \"hidden_size\": " << c.hidden_size << ",\n"
      << "  \"num_hidden_layers\": " << c.num_hidden_layers << ",\n"
      << "  \"num_attention_heads\": " << c.num_attention_heads << ",\n"
      << "  \"intermediate_size\": " << c.intermediate_size << ",\n"
      << "  \"max_position_embeddings\": " << c.max_position_embeddings << ",\n"
      << "  \"type_vocab_size\": " << c.type_vocab_size << ",\n"
      << "  \"hidden_act\": \"" << activation_name(c.hidden_act) << "\",\n"
      << "  \"hidden_dropout_prob\": " << c.hidden_dropout_prob << ",\n"
      << "  \"attention_probs_dropout_prob\": " << c.attention_probs_dropout_prob << ",\n"
      << "  \"layer_norm_eps\": " << c.layer_norm_eps << ",\n"
      << "  \"initializer_range\": " << c.initializer_range << ",\n"
      << "  \"pad_token_id\": " << c.pad_token_id << ",\n"
      << "  \"position_embedding_type\": \"absolute\"\n"
      << "}\n";
}

inline void write_tokenizer_config(const fs::path& path, bool lower_case) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path.string());
  out << "{\n  \"tokenizer_class\": \"BertTokenizer\",\n  \"do_lower_case\": " << (lower_case ? "true" : "false")
      << "\n}\n";
}

// do_lower_case from tokenizer_config.json beside the vocabulary, if there is one.
inline std::optional<bool> read_lower_case(const fs::path& folder) {
  const fs::path p = folder / "tokenizer_config.json";
  if (!fs::exists(p)) return std::nullopt;
  auto v = json_value(read_file(p), "do_lower_case");
  if (!v) return std::nullopt;
  return *v == "true";
}

}  // namespace bert_example
