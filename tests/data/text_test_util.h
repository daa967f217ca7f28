// tests/data/text_test_util.h — a temporary folder and file writing for the text tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace kiln::testing {

// A fresh folder under the test temp dir, removed (with its files) when the object goes.
class TempFolder {
 public:
  TempFolder() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(::testing::TempDir()) /
            ("kiln_text_" + std::string(info->test_suite_name()) + "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  // Writes `bytes` to <folder>/<name> and returns the path.
  std::filesystem::path write(const std::string& name, const std::string& bytes) const {
    const auto p = path_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  std::filesystem::path write_lines(const std::string& name, const std::vector<std::string>& lines) const {
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return write(name, s);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace kiln::testing
