// bench/json_text.h — text for the benchmarks' JSON lines: a string made safe to put between quotes.
#pragma once

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

}  // namespace kiln::bench
