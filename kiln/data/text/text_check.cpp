// kiln/data/text/text_check.cpp — the UTF-8 and binary checks of text files (see text_check.h).
#include "kiln/data/text/text_check.h"

#include <cstdio>

#include "kiln/tensor/error.h"  // KILN_FAIL

namespace kiln::data {

namespace {

// The length of the valid UTF-8 sequence at s[0] (n bytes available), or 0 when it is not one. The ranges are
// Unicode's table 3-7 (well-formed byte sequences), the same decode_utf8 follows.
size_t utf8_length(const unsigned char* s, size_t n) {
  const unsigned char b = s[0];
  if (b < 0x80) return 1;
  int need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k <= need; ++k) {
    if (static_cast<size_t>(k) >= n) return 0;
    const unsigned char lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
    if (s[k] < lo_k || s[k] > hi_k) return 0;
  }
  return static_cast<size_t>(need) + 1;
}

std::string hex_byte(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02X", b);
  return buf;
}

}  // namespace

TextCheck::TextCheck(std::string file, std::string who) : file_(std::move(file)), who_(std::move(who)) {}

void TextCheck::refuse(const std::string& what, uint64_t at) const {
  KILN_FAIL(who_, ": ", file_, " is not UTF-8 text: ", what, " at byte offset ", at, " (line ", line_,
            "); give plain UTF-8 text files (convert others first, e.g. iconv -f latin1 -t utf-8)");
}

void TextCheck::bytes(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  if (offset_ == 0 && n >= 3 && s[0] == 0xEF && s[1] == 0xBB && s[2] == 0xBF) i = 3;  // a byte order mark
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      if (b == 0) refuse("a NUL byte (a binary file?)", offset_ + i);
      if (b == '\n') {
        ++line_;
      } else if ((b < 0x20 && b != '\t' && b != '\r' && b != '\f' && b != '\v') || b == 0x7F) {
        if (controls_++ == 0) first_control_ = offset_ + i, first_control_line_ = line_;
      }
      ++chars_;
      ++i;
      continue;
    }
    const size_t len = utf8_length(s + i, n - i);
    if (len == 0) refuse("the byte " + hex_byte(b) + " is not valid UTF-8", offset_ + i);
    ++chars_;
    i += len;
  }
  offset_ += n;
}

void TextCheck::line(std::string_view text) {
  bytes(text);
  ++offset_;
  ++line_;
  ++chars_;
}

void TextCheck::finish() const {
  if (controls_ >= 16 && controls_ * 100 > chars_) {
    KILN_FAIL(who_, ": ", file_, " does not look like text: ", controls_, " of its ", chars_,
              " characters are control characters (the first at byte offset ", first_control_, ", line ",
              first_control_line_, "); give plain UTF-8 text files");
  }
}

}  // namespace kiln::data
