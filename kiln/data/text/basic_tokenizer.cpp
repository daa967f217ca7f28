// kiln/data/text/basic_tokenizer.cpp — Hugging Face's BasicTokenizer, step by step, on code points.
#include "kiln/data/text/basic_tokenizer.h"

#include <algorithm>  // std::any_of

#include "kiln/data/text/unicode_tables.h"

namespace kiln::data {

using namespace text_detail;

namespace {

bool is_ascii_punctuation(char32_t c) {
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}

// CPython's final-sigma rule: a capital sigma preceded by a cased letter and not followed by one (case-ignorable
// characters skipped on both sides) lowers to ς.
bool is_final_sigma(std::u32string_view word, size_t i) {
  size_t j = i;
  bool before = false;
  while (j > 0) {
    const uint8_t f = char_flags(word[--j]);
    if (f & kCaseIgnorable) continue;
    before = (f & kCased) != 0;
    break;
  }
  if (!before) return false;
  for (size_t k = i + 1; k < word.size(); ++k) {
    const uint8_t f = char_flags(word[k]);
    if (f & kCaseIgnorable) continue;
    return (f & kCased) == 0;
  }
  return true;
}

}  // namespace

const char* unicode_version() { return kUnicodeVersion; }

BasicTokenizer::BasicTokenizer(BasicTokenizerOptions options)
    : options_(options), strip_accents_(options.strip_accents.value_or(options.lower_case)) {}

std::vector<std::u32string> BasicTokenizer::split(std::string_view text) const {
  const std::u32string decoded = decode_utf8(text);
  // Clean, space out CJK and split on whitespace in one pass.
  std::vector<std::u32string> out;
  std::u32string word;
  auto flush = [&] {
    if (!word.empty()) add_word(word, out);
    word.clear();
  };
  for (char32_t c : decoded) {
    if (c == 0 || c == 0xFFFD) continue;
    const uint8_t f = char_flags(c);
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || (f & kSpaceSeparator);
    if (!space && (f & kControl)) continue;
    if (space || (f & kPythonSpace)) {
      flush();
    } else if (options_.tokenize_chinese_chars && is_cjk(c)) {
      flush();
      word.push_back(c);
      flush();
    } else {
      word.push_back(c);
    }
  }
  flush();
  return out;
}

void BasicTokenizer::add_word(std::u32string_view word, std::vector<std::u32string>& out) const {
  // Hugging Face applies NFC to the whole text before splitting on whitespace; whitespace never composes with
  // its neighbours, so word by word is the same. NFC changes nothing where every character is below U+0300.
  std::u32string composed, lowered, stripped;
  if (std::any_of(word.begin(), word.end(), [](char32_t c) { return c >= 0x300; })) {
    composed = nfc(word);
    word = composed;
  }
  if (options_.lower_case) {
    for (size_t i = 0; i < word.size(); ++i) {
      if (word[i] == 0x3A3 && is_final_sigma(word, i)) {
        lowered.push_back(0x3C2);
      } else {
        append_lower(word[i], lowered);
      }
    }
    word = lowered;
  }
  if (strip_accents_) {
    for (char32_t c : nfd(word)) {
      if (!(char_flags(c) & kNonspacingMark)) stripped.push_back(c);
    }
    word = stripped;
  }
  // Every punctuation character is a word of its own. (Lower-casing and stripping never make whitespace, so
  // Hugging Face's second whitespace split only drops empty words.)
  std::u32string piece;
  for (char32_t c : word) {
    if (is_ascii_punctuation(c) || (char_flags(c) & kPunctuation)) {
      if (!piece.empty()) out.push_back(std::move(piece));
      piece.clear();
      out.emplace_back(1, c);
    } else {
      piece.push_back(c);
    }
  }
  if (!piece.empty()) out.push_back(std::move(piece));
}

std::vector<std::string> BasicTokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (const auto& w : split(text)) out.push_back(encode_utf8(w));
  return out;
}

}  // namespace kiln::data
