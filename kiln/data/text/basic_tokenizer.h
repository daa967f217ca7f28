// kiln/data/text/basic_tokenizer.h — BERT's pre-tokenization (Hugging Face's BasicTokenizer): text to words,
// before WordPiece splits them. WordPieceTokenizer and build_wordpiece_vocab use it; it is public for tests and
// for users who want the words themselves.
//
//   data::BasicTokenizer basic({.lower_case = true});
//   auto words = basic.tokenize("Héllo, 世界!");   // {"hello", ",", "世", "界", "!"}
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

// Options of BasicTokenizer, as Hugging Face's BasicTokenizer arguments.
struct BasicTokenizerOptions {
  bool lower_case = true;               // Python's str.lower() on every word
  std::optional<bool> strip_accents{};  // unset: strip when lower-casing (as Hugging Face)
  bool tokenize_chinese_chars = true;   // spaces around CJK ideographs, so each is a word
};

// Splits text into words and punctuation, as BERT does before WordPiece (see the top of this file).
class BasicTokenizer {
 public:
  explicit BasicTokenizer(BasicTokenizerOptions options = {});  // strip_accents unset: = lower_case

  // UTF-8 in (invalid bytes are dropped, as U+FFFD would be), words as code points out. Steps: drop NUL, U+FFFD
  // and "control" characters (category C*: Cc, Cf, unassigned, private use; not tab, newline, return); whitespace
  // (tab, newline, return, Zs) becomes a space; spaces around CJK ideographs; NFC; split on str.isspace(); per
  // word: Python's str.lower() (with its final-sigma rule), NFD with the Mn marks removed; every punctuation
  // character (ASCII symbols and P*) alone.
  std::vector<std::u32string> split(std::string_view text) const;
  std::vector<std::string> tokenize(std::string_view text) const;  // the same words, in UTF-8

  // The options as given.
  const BasicTokenizerOptions& options() const { return options_; }
  // Whether accents are stripped: strip_accents, or lower_case when it is unset.
  bool strips_accents() const { return strip_accents_; }

 private:
  void add_word(std::u32string_view word, std::vector<std::u32string>& out) const;
  BasicTokenizerOptions options_;
  bool strip_accents_;
};

// The Unicode version of the tables the tokenizer uses (generated from Python's unicodedata).
const char* unicode_version();

}  // namespace kiln::data
