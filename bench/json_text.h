// bench/json_text.h — text for the benchmarks' JSON lines: a string made safe to put between quotes, and a number
// as Python's json module writes it (NaN and Infinity spelled so that json.loads reads them back).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace kiln::bench {

// `text` with its quotes and backslashes escaped and its newlines written as \n.
inline std::string json_escape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}

// `value` with `decimals` decimals; NaN, Infinity or -Infinity where it is not finite.
inline std::string json_number(double value, int decimals) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

}  // namespace kiln::bench
