// kiln/data/text/vocab_builder.cpp — the WordPiece trainer: BPE over word counts, with a lazily updated max-heap
// of pair counts and, per pair, the words where it occurs (so each merge touches only those words).
#include "kiln/data/text/vocab_builder.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <queue>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "kiln/data/text/basic_tokenizer.h"
#include "kiln/data/text/text_check.h"
#include "kiln/data/text/unicode_tables.h"
#include "kiln/tensor/error.h"  // KILN_CHECK

namespace kiln::data {
namespace {

using Pair = std::pair<int32_t, int32_t>;

struct PairHash {
  size_t operator()(const Pair& p) const {
    return std::hash<uint64_t>()((static_cast<uint64_t>(p.first) << 32) | static_cast<uint32_t>(p.second));
  }
};

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

class Trainer {
 public:
  explicit Trainer(const WordPieceTrainerOptions& options)
      : options_(options),
        basic_({.lower_case = options.lower_case,
                .strip_accents = options.strip_accents,
                .tokenize_chinese_chars = options.tokenize_chinese_chars}) {
    KILN_CHECK(options.vocab_size > 0, "build_wordpiece_vocab: vocab_size must be > 0, got ", options.vocab_size);
    KILN_CHECK(options.min_frequency >= 1, "build_wordpiece_vocab: min_frequency must be >= 1, got ",
               options.min_frequency);
  }

  void add_line(std::string_view line) {
    for (auto& w : basic_.split(line)) {
      if (static_cast<int64_t>(w.size()) <= options_.max_input_chars_per_word) ++counts_[w];
    }
  }

  std::vector<std::string> run() {
    // Specials, then the alphabet (sorted by code point), then its "##" variants.
    for (const auto& s : options_.special_tokens) add_token(s);
    std::set<char32_t> alphabet;
    for (const auto& [w, n] : counts_) alphabet.insert(w.begin(), w.end());
    for (char32_t c : alphabet) add_token(text_detail::encode_utf8(std::u32string(1, c)));
    for (char32_t c : alphabet) add_token("##" + text_detail::encode_utf8(std::u32string(1, c)));
    // Words as symbols; counts_ is ordered, so word indices are deterministic.
    for (const auto& [w, n] : counts_) {
      Word word{{}, n};
      for (size_t i = 0; i < w.size(); ++i) {
        const std::string ch = text_detail::encode_utf8(std::u32string(1, w[i]));
        word.symbols.push_back(ids_.at(i == 0 ? ch : "##" + ch));
      }
      words_.push_back(std::move(word));
    }
    for (size_t wi = 0; wi < words_.size(); ++wi) count_pairs(wi, +1);
    for (const auto& [p, n] : pair_counts_) heap_.emplace(n, Pair{-p.first, -p.second});
    while (static_cast<int64_t>(vocab_.size()) < options_.vocab_size && !heap_.empty()) {
      auto [n, neg] = heap_.top();
      heap_.pop();
      const Pair p{-neg.first, -neg.second};
      auto it = pair_counts_.find(p);
      const int64_t current = it == pair_counts_.end() ? 0 : it->second;
      if (current != n) {  // stale entry: the pair's count changed since it was pushed
        if (current > 0) heap_.emplace(current, neg);
        continue;
      }
      if (n < options_.min_frequency) break;
      merge(p);
    }
    return vocab_;
  }

 private:
  int32_t add_token(const std::string& token) {
    auto [it, fresh] = ids_.emplace(token, static_cast<int32_t>(vocab_.size()));
    if (fresh) vocab_.push_back(token);
    return it->second;
  }

  void count_pairs(size_t wi, int sign) {
    const Word& w = words_[wi];
    for (size_t i = 0; i + 1 < w.symbols.size(); ++i) {
      const Pair p{w.symbols[i], w.symbols[i + 1]};
      pair_counts_[p] += sign * w.count;
      if (sign > 0) where_[p].insert(wi);
    }
  }

  void merge(const Pair& p) {
    const std::string& right = vocab_[static_cast<size_t>(p.second)];
    const std::string joined =
        vocab_[static_cast<size_t>(p.first)] + (right.rfind("##", 0) == 0 ? right.substr(2) : right);
    const int32_t id = add_token(joined);
    const std::set<size_t> words = where_[p];
    for (size_t wi : words) {
      count_pairs(wi, -1);
      auto& s = words_[wi].symbols;
      std::vector<int32_t> merged;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == p.first && s[i + 1] == p.second) {
          merged.push_back(id);
          ++i;
        } else {
          merged.push_back(s[i]);
        }
      }
      s = std::move(merged);
      count_pairs(wi, +1);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const Pair q{s[i], s[i + 1]};
        heap_.emplace(pair_counts_[q], Pair{-q.first, -q.second});
      }
    }
    pair_counts_.erase(p);
    where_.erase(p);
  }

  const WordPieceTrainerOptions& options_;
  BasicTokenizer basic_;
  std::map<std::u32string, int64_t> counts_;
  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<Word> words_;
  std::unordered_map<Pair, int64_t, PairHash> pair_counts_;
  std::unordered_map<Pair, std::set<size_t>, PairHash> where_;
  // Max-heap on (count, -left, -right): the highest count, then the smallest ids.
  std::priority_queue<std::pair<int64_t, Pair>> heap_;
};

}  // namespace

std::vector<std::string> build_wordpiece_vocab(const std::vector<std::string>& lines,
                                               const WordPieceTrainerOptions& options) {
  Trainer trainer(options);
  for (const auto& line : lines) trainer.add_line(line);
  return trainer.run();
}

std::vector<std::string> build_wordpiece_vocab_from_files(const std::vector<std::filesystem::path>& files,
                                                          const WordPieceTrainerOptions& options) {
  KILN_CHECK(!files.empty(), "build_wordpiece_vocab_from_files: no files given");
  Trainer trainer(options);
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    KILN_CHECK(in.good(), "build_wordpiece_vocab_from_files: cannot open ", f.string());
    TextCheck check(f.string(), "build_wordpiece_vocab_from_files");  // binary or non-UTF-8 input is refused
    std::string line;
    while (std::getline(in, line)) {
      check.line(line);
      trainer.add_line(line);
    }
    KILN_CHECK(!in.bad(), "build_wordpiece_vocab_from_files: reading ", f.string(), " failed");
    check.finish();
  }
  return trainer.run();
}

}  // namespace kiln::data
