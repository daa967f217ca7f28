// kiln/data/text/mlm_dataset.cpp — reading, tokenizing (in threads) and cutting the corpus; masking per sample.
#include "kiln/data/text/mlm_dataset.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string_view>
#include <thread>

#include "kiln/data/text/text_check.h"
#include "kiln/tensor/error.h"         // KILN_CHECK
#include "kiln/tensor/internal_ops.h"  // internal::from_vector

namespace kiln::data {
namespace {

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos; }

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "MaskedLMDataset: cannot open the text file ", path.string(), " (does it exist?)");
  std::stringstream ss;
  ss << in.rdbuf();
  KILN_CHECK(!in.bad(), "MaskedLMDataset: reading ", path.string(), " failed");
  std::string text = ss.str();
  KILN_CHECK(!text.empty(), "MaskedLMDataset: the text file ", path.string(),
             " is empty (give files of UTF-8 text: documents of lines, separated by blank lines)");
  TextCheck check(path.string(), "MaskedLMDataset");  // binary or non-UTF-8 input is refused, not tokenized
  check.bytes(text);
  check.finish();
  return text;
}

void check_probability(double p, const char* name) {
  KILN_CHECK(p >= 0 && p <= 1, "MaskedLMDataset: ", name, " must be in [0, 1], got ", p);
}

}  // namespace

MaskedLMDataset::MaskedLMDataset(const std::vector<std::filesystem::path>& files, const WordPieceTokenizer& tokenizer,
                                 MaskedLMOptions options)
    : options_(options) {
  KILN_CHECK(!files.empty(), "MaskedLMDataset: no text files given");
  KILN_CHECK(options_.seq_len >= 3, "MaskedLMDataset: seq_len must be >= 3 ([CLS], a token, [SEP]), got ",
             options_.seq_len);
  KILN_CHECK(options_.mask_prob > 0 && options_.mask_prob <= 1, "MaskedLMDataset: mask_prob must be in (0, 1], got ",
             options_.mask_prob);
  check_probability(options_.mask_token_prob, "mask_token_prob");
  check_probability(options_.random_token_prob, "random_token_prob");
  check_probability(options_.short_seq_prob, "short_seq_prob");
  KILN_CHECK(options_.mask_token_prob + options_.random_token_prob <= 1 + 1e-12,
             "MaskedLMDataset: mask_token_prob + random_token_prob must be <= 1, got ", options_.mask_token_prob, " + ",
             options_.random_token_prob);
  KILN_CHECK(options_.threads >= 0, "MaskedLMDataset: threads must be >= 0, got ", options_.threads);
  KILN_CHECK(options_.max_predictions >= 0 && options_.max_predictions <= options_.seq_len - 2,
             "MaskedLMDataset: max_predictions must be in [0, seq_len - 2 = ", options_.seq_len - 2, "], got ",
             options_.max_predictions, " (0: every token is chosen with probability mask_prob, no cap)");
  for (size_t i = 0; i < files.size(); ++i) files_ += (i ? ", " : "") + files[i].string();

  const char* specials[] = {"[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]"};
  for (const char* s : specials) {
    KILN_CHECK(tokenizer.find(s).has_value(), "MaskedLMDataset: the vocabulary ", tokenizer.source(), " has no token '",
               s, "' (masked-LM needs [CLS], [SEP], [MASK], [PAD] and [UNK])");
  }
  cls_ = tokenizer.cls_id();
  sep_ = tokenizer.sep_id();
  pad_ = tokenizer.pad_id();
  mask_ = tokenizer.mask_id();
  const int32_t unk = tokenizer.token_to_id("[UNK]");
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (id != cls_ && id != sep_ && id != pad_ && id != mask_ && id != unk) random_ids_.push_back(id);
  }
  KILN_CHECK(!random_ids_.empty() || options_.random_token_prob == 0, "MaskedLMDataset: the vocabulary ",
             tokenizer.source(), " holds only special tokens; random replacement has nothing to draw from");

  // Lines of every file; an empty line index marks a document boundary (blank line or end of file).
  std::vector<std::string> texts;
  std::vector<std::string_view> lines;
  texts.reserve(files.size());
  for (const auto& f : files) texts.push_back(read_file(f));
  for (const auto& text : texts) {
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string_view line(text.data() + start, end - start);
      lines.push_back(is_blank(line) ? std::string_view() : line);
      start = end + 1;
    }
    lines.emplace_back();  // a document never spans two files
  }

  // Tokenize contiguous blocks of lines in threads; block b writes only its own outputs.
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t n_threads = std::min<size_t>(options_.threads > 0 ? static_cast<size_t>(options_.threads) : hw,
                                            std::max<size_t>(1, lines.size() / 256));
  std::vector<std::vector<int32_t>> block_ids(n_threads);
  std::vector<std::vector<int64_t>> block_line_ends(n_threads);  // per line, the end in block_ids
  std::vector<std::exception_ptr> errors(n_threads);
  auto work = [&](size_t b) {
    try {
      const size_t lo = lines.size() * b / n_threads, hi = lines.size() * (b + 1) / n_threads;
      for (size_t i = lo; i < hi; ++i) {
        if (!lines[i].empty()) {
          auto ids = tokenizer.encode(lines[i]);
          block_ids[b].insert(block_ids[b].end(), ids.begin(), ids.end());
        }
        block_line_ends[b].push_back(static_cast<int64_t>(block_ids[b].size()));
      }
    } catch (...) {
      errors[b] = std::current_exception();
    }
  };
  {
    std::vector<std::thread> pool;
    for (size_t b = 1; b < n_threads; ++b) pool.emplace_back(work, b);
    work(0);
    for (auto& t : pool) t.join();
  }
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }

  // Documents: concatenate their lines' tokens and cut.
  const int64_t max_tokens = options_.seq_len - 2;
  offsets_.push_back(0);
  std::vector<int32_t> doc;
  auto end_document = [&] {
    if (doc.empty()) return;
    SampleRng rng(options_.short_seq_seed, 0, num_documents_);
    size_t pos = 0;
    while (pos < doc.size()) {
      int64_t take = max_tokens;
      if (options_.short_seq_prob > 0 && max_tokens > 2 && rng.bernoulli(options_.short_seq_prob)) {
        take = 2 + rng.randint(max_tokens - 1);  // [2, max_tokens]
      }
      take = std::min<int64_t>(take, static_cast<int64_t>(doc.size() - pos));
      ids_.insert(ids_.end(), doc.begin() + static_cast<std::ptrdiff_t>(pos),
                  doc.begin() + static_cast<std::ptrdiff_t>(pos + static_cast<size_t>(take)));
      offsets_.push_back(static_cast<int64_t>(ids_.size()));
      pos += static_cast<size_t>(take);
    }
    ++num_documents_;
    doc.clear();
  };
  size_t line = 0;
  for (size_t b = 0; b < n_threads; ++b) {
    int64_t begin = 0;
    for (int64_t end : block_line_ends[b]) {
      if (lines[line].empty()) {
        end_document();
      } else {
        doc.insert(doc.end(), block_ids[b].begin() + begin, block_ids[b].begin() + end);
      }
      begin = end;
      ++line;
    }
    std::vector<int32_t>().swap(block_ids[b]);  // free as we go
  }
  end_document();
  ids_.shrink_to_fit();
  KILN_CHECK(size() > 0, "MaskedLMDataset: the files ", files_,
             " hold no text that tokenizes to anything (only blank lines, control characters or whitespace)");
}

std::vector<int32_t> MaskedLMDataset::tokens(int64_t index) const {
  KILN_CHECK(index >= 0 && index < size(), "MaskedLMDataset: index ", index, " is out of range [0, ", size(), ")");
  return std::vector<int32_t>(ids_.begin() + offsets_[static_cast<size_t>(index)],
                              ids_.begin() + offsets_[static_cast<size_t>(index) + 1]);
}

Example MaskedLMDataset::get(int64_t index, SampleRng& rng) const {
  const std::vector<int32_t> content = tokens(index);
  const int64_t L = options_.seq_len, n = static_cast<int64_t>(content.size());
  std::vector<int64_t> input(static_cast<size_t>(L), pad_), attention(static_cast<size_t>(L), 0),
      labels(static_cast<size_t>(L), kIgnoreLabel);
  input[0] = cls_;
  for (int64_t i = 0; i < n; ++i) input[static_cast<size_t>(i + 1)] = content[static_cast<size_t>(i)];
  input[static_cast<size_t>(n + 1)] = sep_;
  std::fill(attention.begin(), attention.begin() + n + 2, 1);

  // Choose positions 1..n (the tokens), at least one.
  std::vector<int64_t> chosen;
  const int64_t P = options_.max_predictions;
  if (P > 0) {
    // Google's count, then that many of the n positions without replacement (the first steps of a Fisher-Yates
    // shuffle), in ascending order.
    const int64_t count = std::min(P, std::max<int64_t>(1, std::llround(static_cast<double>(n) * options_.mask_prob)));
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 1);
    for (int64_t i = 0; i < count; ++i) {
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(i + rng.randint(n - i))]);
    }
    chosen.assign(order.begin(), order.begin() + count);
    std::sort(chosen.begin(), chosen.end());
  } else {
    for (int64_t i = 1; i <= n; ++i) {
      if (rng.uniform() < options_.mask_prob) chosen.push_back(i);
    }
    if (chosen.empty()) chosen.push_back(1 + rng.randint(n));
  }
  for (int64_t pos : chosen) {
    const auto p = static_cast<size_t>(pos);
    labels[p] = input[p];
    const double u = rng.uniform();
    if (u < options_.mask_token_prob) {
      input[p] = mask_;
    } else if (u < options_.mask_token_prob + options_.random_token_prob) {
      input[p] = random_ids_[static_cast<size_t>(rng.randint(static_cast<int64_t>(random_ids_.size())))];
    }
  }
  Example ex{{"input_ids", internal::from_vector(input, {L})},
             {"token_type_ids", internal::from_vector(std::vector<int64_t>(static_cast<size_t>(L), 0), {L})},
             {"attention_mask", internal::from_vector(attention, {L})},
             {"labels", internal::from_vector(labels, {L})}};
  if (P > 0) {
    std::vector<int64_t> positions(static_cast<size_t>(P), 0);  // 0: [CLS], whose label is -100
    std::copy(chosen.begin(), chosen.end(), positions.begin());
    ex.add("masked_positions", internal::from_vector(positions, {P}));
  }
  return ex;
}

std::string MaskedLMDataset::describe() const {
  return "MaskedLMDataset(" + std::to_string(size()) + " sequences of " + std::to_string(options_.seq_len) + " from " +
         std::to_string(num_documents_) + " documents, " + files_ + ")";
}

}  // namespace kiln::data
