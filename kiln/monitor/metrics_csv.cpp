// kiln/monitor/metrics_csv.cpp — CsvLogger: the header once, a row per call, resume by dropping the rows from
// the resume step on (through a temporary file and a rename).
#include <unistd.h>  // fsync, fileno

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include "kiln/monitor/metrics.h"
#include "kiln/tensor/error.h"  // kiln::Error, KILN_CHECK

namespace kiln::monitor {
namespace fs = std::filesystem;

namespace {

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) s += ',';
    s += items[i];
  }
  return s;
}

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) cells.push_back(cell);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

std::string why() { return std::strerror(errno); }

void create_parent(const fs::path& path, const char* what) {
  if (path.parent_path().empty()) return;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  KILN_CHECK(!ec, what, ": cannot create the folder ", path.parent_path().string(), " for ", path.string(), ": ",
             ec.message(), "; choose a folder you can write to");
}

// Writes `text` to `path` through <path>.tmp: flushed to the disk, then renamed over it (atomic on POSIX).
void replace_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  KILN_CHECK(f != nullptr, "CsvLogger: cannot write ", tmp.string(),
             " (to drop the rows after the resume step): ", why(), "; is the folder writable?");
  const bool ok =
      std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const std::string reason = why();
  std::fclose(f);
  if (!ok) {
    std::remove(tmp.c_str());
    KILN_FAIL("CsvLogger: cannot write ", tmp.string(), ": ", reason, " (", path.string(), " is left as it was)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  KILN_CHECK(!ec, "CsvLogger: cannot rename ", tmp.string(), " to ", path.string(), ": ", ec.message());
}

}  // namespace

std::string format_csv_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // the shortest text that reads back as v
  return std::string(buf, r.ptr);
}

CsvLogger::CsvLogger(fs::path path, std::vector<std::string> columns, CsvOptions options)
    : path_(std::move(path)), columns_(std::move(columns)) {
  KILN_CHECK(!columns_.empty(), "CsvLogger(", path_.string(), "): give at least one column");
  for (size_t i = 0; i < columns_.size(); ++i) {
    const std::string& c = columns_[i];
    KILN_CHECK(!c.empty() && c.find_first_of(",\"\r\n") == std::string::npos, "CsvLogger(", path_.string(),
               "): column name '", c, "' is empty or holds a comma, quote or line break");
    for (size_t j = 0; j < i; ++j)
      KILN_CHECK(columns_[j] != c, "CsvLogger(", path_.string(), "): column '", c, "' is given twice");
  }
  create_parent(path_, "CsvLogger");
  const std::string header = join(columns_);

  bool write_header = true;
  if (options.resume_step >= 0) {
    size_t step_index = columns_.size();
    for (size_t i = 0; i < columns_.size(); ++i)
      if (columns_[i] == options.step_column) step_index = i;
    KILN_CHECK(step_index < columns_.size(), "CsvLogger(", path_.string(), "): resuming drops rows by their '",
               options.step_column, "' column, which is not among the columns (", header,
               "); add it, or set CsvOptions::step_column");
    std::error_code ec;
    if (fs::exists(path_, ec) && fs::file_size(path_, ec) > 0 && !ec) {
      std::ifstream in(path_, std::ios::binary);
      KILN_CHECK(in.good(), "CsvLogger: cannot read ", path_.string(), " to resume it: ", why());
      std::stringstream content;
      content << in.rdbuf();
      const std::string text = content.str();
      std::string kept = header + "\n";
      bool changed = false;
      size_t start = 0;
      for (int64_t line_no = 1; start < text.size(); ++line_no) {
        const size_t end = text.find('\n', start);
        const bool complete = end != std::string::npos;
        std::string line = text.substr(start, complete ? end - start : std::string::npos);
        start = complete ? end + 1 : text.size();
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line_no == 1) {
          KILN_CHECK(line == header, path_.string(), " has the columns '", line, "', but this run logs '", header,
                     "': resume with the same metrics, or move the file away (a run that does not resume starts "
                     "it afresh)");
          if (!complete) changed = true;  // the header alone, cut before its line break
          continue;
        }
        if (!complete || line.empty()) {  // a row cut short by a crash, or a stray blank line
          changed = true;
          continue;
        }
        const std::vector<std::string> cells = split(line);
        const std::string cell = step_index < cells.size() ? cells[step_index] : "";
        double step = 0;
        const auto r = std::from_chars(cell.data(), cell.data() + cell.size(), step);
        KILN_CHECK(r.ec == std::errc() && r.ptr == cell.data() + cell.size(), path_.string(), " line ", line_no,
                   ": its ", options.step_column, " cell '", cell,
                   "' is not a number, so the rows to keep after a resume are unknown; fix or move the file");
        if (step < static_cast<double>(options.resume_step)) {
          kept += line + "\n";
          ++rows_kept_;
        } else {
          ++rows_dropped_;
          changed = true;
        }
      }
      if (changed) replace_file(path_, kept);
      write_header = false;
    }
  }
  file_ = std::fopen(path_.c_str(), write_header ? "w" : "a");
  KILN_CHECK(file_ != nullptr, "CsvLogger: cannot open ", path_.string(), " for writing: ", why(),
             "; is the folder writable?");
  if (write_header) write_line(header);
}

CsvLogger::~CsvLogger() {
  if (file_ != nullptr) std::fclose(file_);  // every row was flushed when written
}

void CsvLogger::write_line(const std::string& line) {
  errno = 0;
  const bool ok = std::fputs((line + "\n").c_str(), file_) >= 0 && std::fflush(file_) == 0;
  KILN_CHECK(ok, "CsvLogger: cannot write to ", path_.string(), ": ", why(), " (is the disk full?)");
}

void CsvLogger::row(const std::vector<double>& values) {
  KILN_CHECK(values.size() == columns_.size(), "CsvLogger(", path_.string(), "): a row of ", values.size(),
             " values for the ", columns_.size(), " columns ", join(columns_));
  std::string line;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) line += ',';
    line += format_csv_number(values[i]);
  }
  write_line(line);
}

void CsvLogger::named_row(const Scalars& values) {
  std::vector<std::string> cells(columns_.size());
  std::vector<bool> given(columns_.size(), false);
  for (const auto& [name, v] : values) {
    size_t i = 0;
    while (i < columns_.size() && columns_[i] != name) ++i;
    KILN_CHECK(i < columns_.size(), "CsvLogger(", path_.string(), "): '", name, "' is not one of the columns ",
               join(columns_));
    KILN_CHECK(!given[i], "CsvLogger(", path_.string(), "): '", name, "' is given twice in one row");
    given[i] = true;
    cells[i] = format_csv_number(v);
  }
  write_line(join(cells));
}

}  // namespace kiln::monitor
