// kiln/data/text/text_check.h — refuses files that are not UTF-8 text before they are tokenized: a binary file
// or one in another encoding would otherwise become a corpus of [UNK] and replacement characters, silently.
//
//   data::TextCheck check("corpus.txt");
//   for (std::string line; std::getline(in, line);) check.line(line);   // throws at the first bad byte
//   check.finish();                                                     // throws when it looks binary
//
// A file is refused, with its name, the byte offset and the line of the first problem, when it holds a NUL byte,
// a byte sequence that is not UTF-8 (as Python's bytes.decode("utf-8") refuses it: overlongs, surrogates, code
// points above U+10FFFF, truncated sequences), or when control characters (other than tab, line feed, carriage
// return, form feed and vertical tab) are more than 1% of its characters (at least 16 of them). A UTF-8 byte
// order mark at the start is accepted.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::data {

// Checks a text file's bytes as they are read, and throws at the first sign that it is not UTF-8 text.
class TextCheck {
 public:
  // `file` names the text in messages; `who` is the caller, for the messages' start (e.g. "MaskedLMDataset").
  explicit TextCheck(std::string file, std::string who = "text");
  // The next bytes of the file (any split, as long as a UTF-8 sequence is not cut in two).
  void bytes(std::string_view text);
  // The next line without its '\n' (as std::getline gives it): bytes(text) then the newline.
  void line(std::string_view text);
  // After the last bytes: the share of control characters.
  void finish() const;

 private:
  [[noreturn]] void refuse(const std::string& what, uint64_t at) const;
  std::string file_, who_;
  uint64_t offset_ = 0;  // bytes seen
  int64_t line_ = 1;     // the line of the next byte
  uint64_t chars_ = 0, controls_ = 0;
  uint64_t first_control_ = 0;
  int64_t first_control_line_ = 0;
};

}  // namespace kiln::data
