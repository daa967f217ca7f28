// kiln/data/text/wordpiece.cpp — vocabulary files and the WordPiece greedy longest-match-first split.
#include "kiln/data/text/wordpiece.h"

#include <fstream>
#include <sstream>

#include "kiln/data/text/unicode_tables.h"
#include "kiln/tensor/error.h"  // KILN_CHECK

namespace kiln::data {

using text_detail::append_utf8;

WordPieceTokenizer WordPieceTokenizer::from_vocab_file(const std::filesystem::path& path, WordPieceOptions options) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "WordPieceTokenizer: cannot open the vocabulary file ", path.string(),
             " (a BERT vocab.txt: one token per line)");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  KILN_CHECK(!text.empty(), "WordPieceTokenizer: the vocabulary file ", path.string(), " is empty");
  std::vector<std::string> vocab;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    vocab.push_back(std::move(line));
    start = end + 1;
  }
  // "a\nb\n" holds two tokens; one more newline ("a\nb\n\n") leaves an empty last line, which is ignored.
  if (!vocab.empty() && vocab.back().empty()) vocab.pop_back();
  return WordPieceTokenizer(std::move(vocab), std::move(options), path.string());
}

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab, WordPieceOptions options, std::string source)
    : vocab_(std::move(vocab)),
      options_(std::move(options)),
      basic_({.lower_case = options_.lower_case,
              .strip_accents = options_.strip_accents,
              .tokenize_chinese_chars = options_.tokenize_chinese_chars}),
      source_(std::move(source)) {
  KILN_CHECK(!vocab_.empty(), "WordPieceTokenizer: the vocabulary ", source_, " has no tokens");
  KILN_CHECK(vocab_.size() < (size_t{1} << 31), "WordPieceTokenizer: the vocabulary ", source_,
             " has more tokens than int32 ids can hold");
  KILN_CHECK(options_.max_input_chars_per_word > 0, "WordPieceTokenizer: max_input_chars_per_word must be > 0, got ",
             options_.max_input_chars_per_word);
  ids_.reserve(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) {
    auto [it, fresh] = ids_.emplace(vocab_[i], static_cast<int32_t>(i));
    KILN_CHECK(fresh, "WordPieceTokenizer: the vocabulary ", source_, " has the token '", vocab_[i], "' twice: line ",
               it->second + 1, " and line ", i + 1, " (each token must appear once; its line number is its id)");
  }
  auto unk = find(options_.unk_token);
  KILN_CHECK(unk.has_value(), "WordPieceTokenizer: the vocabulary ", source_, " has no unknown token '",
             options_.unk_token, "' (add it, or set WordPieceOptions::unk_token)");
  unk_id_ = *unk;
}

std::optional<int32_t> WordPieceTokenizer::find(std::string_view token) const {
  auto it = ids_.find(std::string(token));
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

int32_t WordPieceTokenizer::token_to_id(std::string_view token) const {
  auto id = find(token);
  KILN_CHECK(id.has_value(), "WordPieceTokenizer: the vocabulary ", source_, " has no token '", token, "'");
  return *id;
}

const std::string& WordPieceTokenizer::id_to_token(int32_t id) const {
  KILN_CHECK(id >= 0 && id < vocab_size(), "WordPieceTokenizer: id ", id, " is out of range for the vocabulary ",
             source_, " of ", vocab_size(), " tokens");
  return vocab_[static_cast<size_t>(id)];
}

void WordPieceTokenizer::encode_word(const std::u32string& word, std::vector<int32_t>& ids) const {
  if (static_cast<int64_t>(word.size()) > options_.max_input_chars_per_word) {
    ids.push_back(unk_id_);
    return;
  }
  // offsets[k]: the byte where character k starts in the UTF-8 word.
  std::string utf8;
  std::vector<size_t> offsets;
  for (char32_t c : word) {
    offsets.push_back(utf8.size());
    append_utf8(c, utf8);
  }
  offsets.push_back(utf8.size());
  const size_t first_piece = ids.size();
  std::string candidate;
  size_t start = 0;
  while (start < word.size()) {
    std::optional<int32_t> match;
    size_t end = word.size();
    for (; end > start; --end) {  // longest match first
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(utf8, offsets[start], offsets[end] - offsets[start]);
      if (auto it = ids_.find(candidate); it != ids_.end()) {
        match = it->second;
        break;
      }
    }
    if (!match) {  // one unmatchable piece makes the whole word unknown
      ids.resize(first_piece);
      ids.push_back(unk_id_);
      return;
    }
    ids.push_back(*match);
    start = end;
  }
}

std::vector<int32_t> WordPieceTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  for (const auto& word : basic_.split(text)) encode_word(word, ids);
  return ids;
}

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  return convert_ids_to_tokens(encode(text));
}

std::vector<int32_t> WordPieceTokenizer::convert_tokens_to_ids(const std::vector<std::string>& tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(tokens.size());
  for (const auto& t : tokens) ids.push_back(find(t).value_or(unk_id_));
  return ids;
}

std::vector<std::string> WordPieceTokenizer::convert_ids_to_tokens(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) tokens.push_back(id_to_token(id));
  return tokens;
}

void WordPieceTokenizer::save_vocab(const std::filesystem::path& path) const { data::save_vocab(vocab_, path); }

void save_vocab(const std::vector<std::string>& vocab, const std::filesystem::path& path) {
  for (size_t i = 0; i < vocab.size(); ++i) {
    KILN_CHECK(vocab[i].find_first_of("\r\n") == std::string::npos && !vocab[i].empty(), "save_vocab: token ", i,
               " is empty or holds a line break; it cannot be written to ", path.string());
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  KILN_CHECK(out.good(), "save_vocab: cannot write ", path.string());
  for (const auto& t : vocab) out << t << '\n';
  out.flush();
  KILN_CHECK(out.good(), "save_vocab: writing ", path.string(), " failed (disk full?)");
}

}  // namespace kiln::data
