// kiln/data/text/unicode.cpp — lookups in the generated tables, and UTF-8 decoding that never fails.
#include <algorithm>  // std::upper_bound, std::lower_bound, std::sort
#include <array>
#include <string_view>
#include <unordered_map>
#include <utility>  // std::pair
#include <vector>

#include "kiln/data/text/unicode_tables.h"

namespace kiln::data::text_detail {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

// The runs interleave (upper/lower case alternate), so they are expanded once into a sorted list.
using Flat = std::vector<std::pair<char32_t, char32_t>>;
Flat expand(const MappingRun* runs, size_t n) {
  Flat flat;
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t k = 0; k < runs[i].count; ++k) {
      flat.emplace_back(static_cast<char32_t>(runs[i].first + static_cast<int64_t>(k) * runs[i].stride),
                        static_cast<char32_t>(runs[i].target + static_cast<int64_t>(k) * runs[i].target_step));
    }
  }
  std::sort(flat.begin(), flat.end());
  return flat;
}

// True when `c` has a mapping, which is then appended to `out`.
bool append_mapped(char32_t c, const Flat& flat, const SpecialMapping* special, size_t n_special, const char32_t* pool,
                   std::u32string& out) {
  auto it = std::lower_bound(flat.begin(), flat.end(), std::pair<char32_t, char32_t>(c, 0));
  if (it != flat.end() && it->first == c) {
    out.push_back(it->second);
    return true;
  }
  for (size_t i = 0; i < n_special; ++i) {
    if (special[i].code_point == c) {
      out.append(pool + special[i].offset, special[i].length);
      return true;
    }
  }
  return false;
}

}  // namespace

namespace {
uint8_t lookup_flags(char32_t c) {
  auto it = std::upper_bound(kFlagRanges, kFlagRanges + kFlagRangeCount, c,
                             [](char32_t v, const FlagRange& r) { return v < r.first; });
  return it == kFlagRanges ? 0 : (it - 1)->flags;
}
}  // namespace

uint8_t char_flags(char32_t c) {
  // Latin-1 (most text) from a table; the rest by binary search over the ranges.
  static const std::array<uint8_t, 256> latin1 = [] {
    std::array<uint8_t, 256> t{};
    for (char32_t i = 0; i < 256; ++i) t[i] = lookup_flags(i);
    return t;
  }();
  if (c < 256) return latin1[c];
  return c >= 0x110000 ? uint8_t{0} : lookup_flags(c);
}

void append_lower(char32_t c, std::u32string& out) {
  if (c < 0x80) {
    out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  static const Flat flat = expand(kLowerRuns, kLowerRunCount);
  if (!append_mapped(c, flat, kLowerSpecial, kLowerSpecialCount, kLowerSpecialPool, out)) out.push_back(c);
}

uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;
  auto it = std::upper_bound(kCombiningClasses, kCombiningClasses + kCombiningClassCount, c,
                             [](char32_t v, const CombiningClassRange& r) { return v < r.first; });
  return it == kCombiningClasses ? 0 : (it - 1)->ccc;
}

namespace {

constexpr char32_t kHangulFirst = 0xAC00, kHangulLast = 0xD7A3, kL = 0x1100, kV = 0x1161, kT = 0x11A7;
constexpr char32_t kVCount = 21, kTCount = 28;

const Decomposition* find_decomposition(char32_t c) {
  auto it = std::lower_bound(kDecompositions, kDecompositions + kDecompositionCount, c,
                             [](const Decomposition& d, char32_t v) { return d.code_point < v; });
  return it != kDecompositions + kDecompositionCount && it->code_point == c ? it : nullptr;
}

void append_decomposed(char32_t c, std::u32string& out) {
  if (c < 0xC0) {
    out.push_back(c);
  } else if (c >= kHangulFirst && c <= kHangulLast) {  // L V (T) jamo
    const char32_t s = c - kHangulFirst;
    out.push_back(kL + s / (kVCount * kTCount));
    out.push_back(kV + (s % (kVCount * kTCount)) / kTCount);
    if (s % kTCount != 0) out.push_back(kT + s % kTCount);
  } else if (const Decomposition* d = find_decomposition(c)) {
    append_decomposed(d->first, out);
    if (d->second != 0) append_decomposed(d->second, out);
  } else {
    out.push_back(c);
  }
}

// The primary composite of a + b, or 0.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kL && a < kL + 19 && b >= kV && b < kV + kVCount) {
    return kHangulFirst + ((a - kL) * kVCount + (b - kV)) * kTCount;
  }
  if (a >= kHangulFirst && a <= kHangulLast && (a - kHangulFirst) % kTCount == 0 && b > kT && b < kT + kTCount) {
    return a + (b - kT);
  }
  static const std::unordered_map<uint64_t, char32_t> table = [] {
    std::unordered_map<uint64_t, char32_t> t;
    for (size_t i = 0; i < kDecompositionCount; ++i) {
      const Decomposition& d = kDecompositions[i];
      if (d.composes) t.emplace((uint64_t{d.first} << 32) | d.second, d.code_point);
    }
    return t;
  }();
  auto it = table.find((uint64_t{a} << 32) | b);
  return it == table.end() ? 0 : it->second;
}

}  // namespace

std::u32string nfd(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) append_decomposed(c, out);
  // Canonical ordering: each run of non-starters sorted by combining class, stably.
  for (size_t i = 1; i < out.size(); ++i) {
    const char32_t c = out[i];
    const uint8_t cc = combining_class(c);
    if (cc == 0) continue;
    size_t j = i;
    while (j > 0 && combining_class(out[j - 1]) > cc) {
      out[j] = out[j - 1];
      --j;
    }
    out[j] = c;
  }
  return out;
}

std::u32string nfc(std::u32string_view text) {
  const std::u32string d = nfd(text);
  std::u32string out;
  out.reserve(d.size());
  size_t starter = std::u32string::npos;  // index in `out` of the last starter
  for (char32_t c : d) {
    const uint8_t cc = combining_class(c);
    if (starter != std::u32string::npos) {
      // c is blocked from the starter when something between them has class 0 or >= c's class.
      const bool adjacent = out.size() == starter + 1;
      const bool blocked = !adjacent && (combining_class(out.back()) == 0 || combining_class(out.back()) >= cc);
      if (!blocked) {
        if (char32_t composite = compose_pair(out[starter], c)) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (cc == 0) starter = out.size();
    out.push_back(c);
  }
  return out;
}

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

std::u32string decode_utf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    int need = 0;
    char32_t cp = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (no overlongs, no surrogates)
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1, cp = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2, cp = b & 0x0F;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3, cp = b & 0x07;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {  // a stray continuation byte, or a byte that never starts UTF-8
      out.push_back(kReplacement);
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool ok = true;
    for (int k = 0; k < need; ++k, ++j) {
      const unsigned char lo_k = k == 0 ? lo : 0x80, hi_k = k == 0 ? hi : 0xBF;
      if (j >= n || s[j] < lo_k || s[j] > hi_k) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (s[j] & 0x3F);
    }
    // Invalid: the maximal subpart read so far becomes one U+FFFD; decoding resumes at the offending byte.
    out.push_back(ok ? cp : kReplacement);
    i = j;
  }
  return out;
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(c, out);
  return out;
}

}  // namespace kiln::data::text_detail
