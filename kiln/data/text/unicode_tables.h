// kiln/data/text/unicode_tables.h — internal: the generated Unicode tables (unicode_tables.cpp, written by
// scripts/gen_unicode_tables.py from Python's unicodedata) and the queries the tokenizer makes of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::data::text_detail {

enum CharFlag : uint8_t {
  kControl = 1,         // category C* (Cc, Cf, Cn unassigned, Co private use): dropped
  kSpaceSeparator = 2,  // category Zs
  kNonspacingMark = 4,  // category Mn
  kPunctuation = 8,     // category P*
  kCased = 16,          // makes a following capital sigma final (CPython's str.lower)
  kCaseIgnorable = 32,  // skipped when str.lower looks around a capital sigma
  kPythonSpace = 64,    // str.isspace(): where str.split() splits
};

// A run of code points sharing the same CharFlag bits (kFlagRanges, sorted by first).
struct FlagRange {
  char32_t first;  // the flags hold from here up to the next range's first
  uint8_t flags;   // CharFlag bits
};
// Lower-case mappings of evenly spaced code points to evenly spaced targets (kLowerRuns).
struct MappingRun {  // first + k * stride -> target + k * target_step, for k < count
  char32_t first;
  uint32_t count;       // the code points in the run
  int32_t stride;       // the step between the run's code points
  char32_t target;      // what `first` maps to
  int32_t target_step;  // the step between the targets
};
// A code point whose lower case is several code points (kLowerSpecial).
struct SpecialMapping {  // code point -> pool[offset, offset + length)
  char32_t code_point;
  uint32_t offset;  // where its mapping starts in kLowerSpecialPool
  uint32_t length;  // how many code points it maps to
};

extern const char* const kUnicodeVersion;
extern const FlagRange kFlagRanges[];
extern const size_t kFlagRangeCount;
extern const MappingRun kLowerRuns[];
extern const size_t kLowerRunCount;
extern const SpecialMapping kLowerSpecial[];
extern const char32_t kLowerSpecialPool[];
extern const size_t kLowerSpecialCount;
// One level of a canonical decomposition (kDecompositions).
struct Decomposition {  // one level of a canonical decomposition: code_point -> first (second); second 0: one
  char32_t code_point;
  char32_t first;    // the first code point it decomposes to
  char32_t second;   // the second, or 0 for a decomposition into one code point
  uint8_t composes;  // NFC composes first + second back into code_point
};
// A run of code points sharing one canonical combining class (kCombiningClasses, sorted by first).
struct CombiningClassRange {
  char32_t first;  // the canonical combining class holds from here up to the next range's first
  uint8_t ccc;     // the canonical combining class
};
extern const Decomposition kDecompositions[];
extern const size_t kDecompositionCount;
extern const CombiningClassRange kCombiningClasses[];
extern const size_t kCombiningClassCount;

uint8_t char_flags(char32_t c);
// Python's str.lower() of one character (without the final-sigma context rule), appended to `out`.
void append_lower(char32_t c, std::u32string& out);
uint8_t combining_class(char32_t c);
// unicodedata.normalize("NFD" / "NFC", text).
std::u32string nfd(std::u32string_view text);
std::u32string nfc(std::u32string_view text);
// BERT's "CJK character" ranges (BasicTokenizer._is_chinese_char).
bool is_cjk(char32_t c);

// UTF-8 -> code points as Python's bytes.decode("utf-8", errors="replace") gives them: each maximal invalid
// subsequence becomes U+FFFD.
std::u32string decode_utf8(std::string_view text);
void append_utf8(char32_t c, std::string& out);
std::string encode_utf8(std::u32string_view text);

}  // namespace kiln::data::text_detail
