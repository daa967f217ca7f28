// kiln/data/text/wordpiece.h — BERT's WordPiece tokenizer, behaving as Hugging Face's BertTokenizer (the slow,
// Python one): BasicTokenizer words, then greedy longest-match-first pieces with "##" on non-initial pieces.
//
//   auto tok = data::WordPieceTokenizer::from_vocab_file("vocab.txt", {.lower_case = true});
//   std::vector<int32_t> ids = tok.encode("Héllo, world!");        // no [CLS]/[SEP]
//   std::vector<std::string> pieces = tok.tokenize("unaffable");   // {"una", "##ffa", "##ble"}
//   int32_t mask = tok.token_to_id("[MASK]");                      // throws when absent
//
// Special tokens written in the text ("[MASK]") are not recognized: they are split like any text.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/data/text/basic_tokenizer.h"

namespace kiln::data {

// Options of WordPieceTokenizer, as Hugging Face's BertTokenizer arguments.
struct WordPieceOptions {
  bool lower_case = true;                  // lower-case the text first (an uncased vocabulary)
  std::optional<bool> strip_accents{};     // unset: = lower_case (as Hugging Face)
  bool tokenize_chinese_chars = true;      // spaces around CJK ideographs, so each is a word
  int64_t max_input_chars_per_word = 100;  // longer words (in code points) become unk_token
  std::string unk_token = "[UNK]";         // the token of words that cannot be split; must be in the vocabulary
};

// BERT's WordPiece tokenizer over a fixed vocabulary (see the top of this file).
class WordPieceTokenizer {
 public:
  // A standard BERT vocab.txt: one token per line, id = line number (0-based); "\r\n" is accepted, a final
  // empty line ignored. Duplicate tokens, a missing unk_token or an unreadable file throw, naming the file.
  static WordPieceTokenizer from_vocab_file(const std::filesystem::path& path, WordPieceOptions options = {});
  // The same from tokens in id order; `source` names them in messages.
  explicit WordPieceTokenizer(std::vector<std::string> vocab, WordPieceOptions options = {},
                              std::string source = "in-memory vocabulary");

  std::vector<int32_t> encode(std::string_view text) const;        // ids, no special tokens added
  std::vector<std::string> tokenize(std::string_view text) const;  // the pieces of encode()
  std::vector<int32_t> convert_tokens_to_ids(const std::vector<std::string>& tokens) const;  // unknown: unk
  std::vector<std::string> convert_ids_to_tokens(const std::vector<int32_t>& ids) const;     // throws out of range
  const std::string& id_to_token(int32_t id) const;                                          // throws out of range
  int32_t token_to_id(std::string_view token) const;          // throws when absent, naming the vocabulary file
  std::optional<int32_t> find(std::string_view token) const;  // the token's id, or nullopt when absent
  // The number of tokens in the vocabulary.
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  // The tokens, in id order.
  const std::vector<std::string>& vocab() const { return vocab_; }

  // The id of "[CLS]"; throws when absent.
  int32_t cls_id() const { return token_to_id("[CLS]"); }
  // The id of "[SEP]"; throws when absent.
  int32_t sep_id() const { return token_to_id("[SEP]"); }
  // The id of "[PAD]"; throws when absent.
  int32_t pad_id() const { return token_to_id("[PAD]"); }
  // The id of "[MASK]"; throws when absent.
  int32_t mask_id() const { return token_to_id("[MASK]"); }
  // The id of options().unk_token.
  int32_t unk_id() const { return unk_id_; }

  // The vocabulary file (or the `source` given with an in-memory vocabulary).
  const std::string& source() const { return source_; }  // the vocabulary file (or "in-memory vocabulary")
  // The options as given.
  const WordPieceOptions& options() const { return options_; }
  // The word splitter run before WordPiece, configured from the options.
  const BasicTokenizer& basic() const { return basic_; }
  void save_vocab(const std::filesystem::path& path) const;  // data::save_vocab(vocab(), path)

 private:
  // Appends the ids of one word's pieces (or unk).
  void encode_word(const std::u32string& word, std::vector<int32_t>& ids) const;
  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int32_t> ids_;
  WordPieceOptions options_;
  BasicTokenizer basic_;
  std::string source_;
  int32_t unk_id_ = -1;
};

// Writes tokens one per line (id = line number), as from_vocab_file reads them.
void save_vocab(const std::vector<std::string>& vocab, const std::filesystem::path& path);

}  // namespace kiln::data
