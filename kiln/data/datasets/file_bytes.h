// kiln/data/datasets/file_bytes.h — whole files into memory, gzip-compressed or not (the dataset readers'
// shared first step).
//
//   std::vector<uint8_t> bytes = data::detail::read_maybe_gzip("train-images-idx3-ubyte.gz");
//
// A gzip file is recognised by its magic bytes (1f 8b), not by its name, and inflated whole; a truncated
// or corrupt gzip stream is an error naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace kiln::data::detail {

// The file's bytes, inflated when they are a gzip stream (several concatenated members are read as one).
std::vector<uint8_t> read_maybe_gzip(const std::filesystem::path& path);

// The first of `names` that exists (as a regular file) in one of `dirs`, searched dir by dir.
std::optional<std::filesystem::path> find_file(const std::vector<std::filesystem::path>& dirs,
                                               const std::vector<std::string>& names);

// "a, b, c" for error messages.
std::string join_paths(const std::vector<std::filesystem::path>& paths);

}  // namespace kiln::data::detail
