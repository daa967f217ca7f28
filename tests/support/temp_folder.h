// tests/support/temp_folder.h — a temporary folder that removes itself, and writing test files.
//
//   TempFolder dir;                                  // <TempDir()>/kiln_<pid>_<Suite_Test>_<n>, empty
//   auto vocab = dir.write("vocab.txt", "[UNK]\na\n");  // creates parent folders, returns the path
//   write_bytes(dir / "raw/train.bin", bytes);       // the same, for a path built elsewhere
//   read_image(dir.file("a.png"));                   // the path as a string
//                                                    // ... and the folder is gone at the end of the scope
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::testing {

// A fresh, empty folder under ::testing::TempDir(), removed with everything in it by the destructor (errors
// ignored). Its name holds the process id, the running test's name and a per-process counter, so parallel
// ctest runs (one process per test) and several folders in one test never share a folder.
class TempFolder {
 public:
  TempFolder();
  ~TempFolder();
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  std::string file(const std::string& relative) const { return (path_ / relative).string(); }

  // Writes `bytes` to <folder>/<name> (parent folders created) and returns that path; throws when the write
  // fails, which fails the running test.
  std::filesystem::path write(const std::string& name, std::string_view bytes) const;
  std::filesystem::path write(const std::string& name, const std::vector<uint8_t>& bytes) const;
  // Each line followed by "\n".
  std::filesystem::path write_lines(const std::string& name, const std::vector<std::string>& lines) const;

 private:
  std::filesystem::path path_;
};

// Writes `bytes` to `path`, creating its parent folders; throws std::runtime_error naming the path when the
// write fails (gtest reports it as the test's failure).
void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes);

}  // namespace kiln::testing
