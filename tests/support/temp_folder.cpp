// tests/support/temp_folder.cpp — see temp_folder.h.
#include "support/temp_folder.h"

#include <gtest/gtest.h>
#include <unistd.h>  // getpid

#include <atomic>
#include <cctype>
#include <fstream>
#include <stdexcept>

namespace kiln::testing {
namespace {

// "Suite_Test" of the running test ("Prefix/Suite.Case/0" of a parameterized one), kept to [A-Za-z0-9_-] so
// it is a plain folder name; "no_test" outside a test.
std::string test_name_part() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "_" + info->name() : "no_test";
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
  }
  return name;
}

void write_file(const std::filesystem::path& path, const char* bytes, size_t size) {
  std::error_code ec;  // a parent that cannot be made shows as the write's failure below
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes, static_cast<std::streamsize>(size));
  out.close();
  if (!out) throw std::runtime_error("cannot write the test file " + path.string());
}

}  // namespace

TempFolder::TempFolder() {
  static std::atomic<int> counter{0};
  path_ = std::filesystem::path(::testing::TempDir()) /
          ("kiln_" + std::to_string(::getpid()) + "_" + test_name_part() + "_" + std::to_string(counter++));
  std::filesystem::remove_all(path_);  // a leftover of an earlier process that had the same pid
  std::filesystem::create_directories(path_);
}

TempFolder::~TempFolder() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::filesystem::path TempFolder::write(const std::string& name, std::string_view bytes) const {
  write_file(path_ / name, bytes.data(), bytes.size());
  return path_ / name;
}

std::filesystem::path TempFolder::write(const std::string& name, const std::vector<uint8_t>& bytes) const {
  write_bytes(path_ / name, bytes);
  return path_ / name;
}

std::filesystem::path TempFolder::write_lines(const std::string& name, const std::vector<std::string>& lines) const {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return write(name, text);
}

void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  write_file(path, reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace kiln::testing
