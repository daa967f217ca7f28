// kiln/io/checkpoint.cpp — save_checkpoint / load_checkpoint: the root attributes, the format check, and the
// atomic write (temporary file, flush, kiln header, fsync, rename, fsync of the folder).
#include "kiln/io/checkpoint.h"

#include <fcntl.h>   // open
#include <signal.h>  // kill(pid, 0): whether a process runs
#include <unistd.h>  // fsync, close, getpid, gethostname

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>  // std::rename
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>

#include "kiln/io/checkpoint_internal.h"
#include "kiln/tensor/error.h"
#include "kiln/version.h"

namespace kiln::io {

namespace {

constexpr const char* kFormat = "kiln-checkpoint";

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

const char* kPartGroups[] = {"model", "optimizer", "scheduler", "scaler", "rng", "loader", "metadata"};

}  // namespace

namespace detail {

void fsync_path(const std::string& path, bool folder, const std::string& what) {
  const int fd = ::open(path.c_str(), folder ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  KILN_CHECK(fd >= 0, what, ": cannot open ", path, " to sync it to disk (", std::strerror(errno), ")");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  KILN_CHECK(rc == 0, what, ": cannot sync ", path, " to disk (", std::strerror(err), ")");
}

void check_format(const H5File& f, bool require_complete) {
  const bool has_format = f.has_attr("/", "format") && f.attr_is_string("/", "format");
  KILN_CHECK(has_format && f.attr_string("/", "format") == kFormat, f.path(),
             ": not a kiln checkpoint (the root attribute format is not \"", kFormat, "\")");
  KILN_CHECK(f.has_attr("/", "format_version"), f.path(), ": a kiln checkpoint without a format_version; damaged");
  const int64_t version = f.attr_int("/", "format_version");
  KILN_CHECK(version >= 1 && version <= kCheckpointFormatVersion, f.path(), ": checkpoint format version ", version,
             "; this kiln reads versions 1 to ", kCheckpointFormatVersion,
             version > kCheckpointFormatVersion ? " (written by a newer kiln: update kiln)" : "");
  if (require_complete) {
    const bool complete = f.has_attr("/", "complete") && f.attr_int("/", "complete") == 1;
    KILN_CHECK(complete, f.path(), ": an incomplete checkpoint (its save did not finish); use an earlier one");
  }
}

namespace {

// This host's name, reduced to characters safe in a file name (the rest become '_').
std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string host(buf);
  for (char& c : host) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  }
  return host;
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::string temporary_path(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::string tmp_name(".");  // (appended piecewise: GCC 12 warns falsely on "." + std::string)
  tmp_name.append(target.filename().string()).append(".tmp-").append(host_name()).append("-");
  tmp_name.append(std::to_string(::getpid()));
  return (target.parent_path() / tmp_name).string();
}

std::vector<std::string> remove_stale_temporaries(const std::string& folder, const std::string& name_prefix) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  const std::string host = host_name();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t at = name.rfind(".tmp-");
    if (name.rfind(name_prefix, 0) != 0 || at == std::string::npos) continue;
    const std::string writer = name.substr(at + 5);  // "<host>-<pid>", or "<pid>" (earlier versions)
    const size_t dash = writer.rfind('-');
    const std::string pid_text = dash == std::string::npos ? writer : writer.substr(dash + 1);
    const std::string writer_host = dash == std::string::npos ? host : writer.substr(0, dash);
    if (!all_digits(pid_text) || writer_host != host) continue;  // not ours to judge: another host may write it
    const long pid = std::stol(pid_text);
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (EPERM: alive, not ours)
    std::error_code rm;
    if (fs::remove(entry.path(), rm)) {
      std::cerr << "kiln: removed " << entry.path().string() << ", the temporary file of a save by process " << pid
                << " on " << host << ", which no longer runs (killed mid-save)\n";
      removed.push_back(entry.path().string());
    }
  }
  return removed;
}

void write_atomically(const std::string& path, const std::function<void(H5File&)>& fill) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  KILN_CHECK(!target.filename().empty(), "save_checkpoint: '", path, "' names a folder; give a file name");
  const fs::path folder = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::error_code ec;
  KILN_CHECK(fs::is_directory(folder, ec), path, ": the folder ", folder.string(), " does not exist; create it first");
  std::string stale_prefix(".");
  stale_prefix.append(target.filename().string()).append(".tmp-");
  remove_stale_temporaries(folder.string(), stale_prefix);
  const std::string tmp = (folder / fs::path(temporary_path(path)).filename()).string();
  try {
    {
      H5File f(tmp, H5File::Mode::Create, kCheckpointUserBlock);
      f.set_attr("/", "format", std::string(kFormat));
      f.set_attr("/", "format_version", static_cast<int64_t>(kCheckpointFormatVersion));
      f.set_attr("/", "kiln_version", std::string(KILN_VERSION_STRING));
      f.set_attr("/", "created", utc_now());
      f.set_attr("/", "complete", int64_t{0});
      fill(f);
      f.set_attr("/", "complete", int64_t{1});  // last: a file without it never finished
      f.close();
    }
    seal_checkpoint(tmp);  // after HDF5 closed the file: the crc covers its final bytes
    fsync_path(tmp, false, path);
    KILN_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, path, ": cannot rename the temporary file ", tmp,
               " over it (", std::strerror(errno), ")");
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  fsync_path(folder.string(), true, path);
}

}  // namespace detail

void save_checkpoint(const std::string& path, const CheckpointParts& parts) {
  detail::write_atomically(path, [&](H5File& f) { detail::write_parts(f, parts); });
}

void load_checkpoint(const std::string& path, const CheckpointParts& parts) {
  detail::StagedParts staged;
  detail::verify_checkpoint_file(path);  // before HDF5 parses any byte
  {
    H5File f(path, H5File::Mode::Read);
    detail::check_format(f);
    staged = detail::stage_parts(f, parts);
  }
  detail::apply_parts(staged, parts);
}

CheckpointInfo inspect_checkpoint(const std::string& path) {
  detail::verify_checkpoint_file(path);
  H5File f(path, H5File::Mode::Read);
  detail::check_format(f, /*require_complete=*/false);
  CheckpointInfo info;
  info.format_version = f.attr_int("/", "format_version");
  info.kiln_version = f.has_attr("/", "kiln_version") ? f.attr_string("/", "kiln_version") : "";
  info.created = f.has_attr("/", "created") ? f.attr_string("/", "created") : "";
  info.complete = f.has_attr("/", "complete") && f.attr_int("/", "complete") == 1;
  for (const char* part : kPartGroups) {
    if (f.has_group(std::string("/") + part)) info.parts.push_back(part);
  }
  return info;
}

}  // namespace kiln::io
