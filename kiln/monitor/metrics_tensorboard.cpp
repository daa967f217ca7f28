// kiln/monitor/metrics_tensorboard.cpp — TensorBoardWriter: an event file of scalars, buffered, with the
// SessionLog START that makes TensorBoard forget the points a resumed run logs again.
#include <unistd.h>  // gethostname, getpid

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <mutex>
#include <set>
#include <system_error>

#include "kiln/monitor/metrics.h"
#include "kiln/monitor/metrics_tfrecord.h"
#include "kiln/tensor/error.h"  // kiln::Error, KILN_CHECK

namespace kiln::monitor {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "events.out.tfevents.";

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The folders that a live writer of this process writes to (see the header: one writer per folder).
std::mutex& folders_mutex() {
  static std::mutex m;
  return m;
}
std::set<std::string>& open_folders() {
  static std::set<std::string> s;
  return s;
}

std::string folder_key(const fs::path& dir) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(dir), ec);
  return (ec ? fs::absolute(dir) : p).lexically_normal().string();
}

// TensorBoard reads a folder's event files in the order of their names, and a resumed run's START event must
// come after the interrupted run's points: a name that would sort before an existing file's (same second,
// another pid) gets the greatest existing time + 1 instead.
int64_t file_time(const fs::path& dir, const std::string& rest) {
  const auto now = static_cast<int64_t>(unix_seconds());
  std::string greatest;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) == 0 && name > greatest) greatest = name;
  }
  if (greatest.empty() || kPrefix + std::to_string(now) + rest > greatest) return now;
  const std::string digits =
      greatest.substr(std::strlen(kPrefix), greatest.find('.', std::strlen(kPrefix)) - std::strlen(kPrefix));
  try {
    return std::max<int64_t>(now, std::stoll(digits) + 1);
  } catch (const std::exception&) {
    return now;  // not a name of ours; the order is TensorBoard's to sort out
  }
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(fs::path dir, TensorBoardOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  KILN_CHECK(!ec, "TensorBoardWriter: cannot create the folder ", dir_.string(), ": ", ec.message(),
             "; choose a folder you can write to");
  const std::string key = folder_key_ = folder_key(dir_);
  {
    std::lock_guard<std::mutex> lock(folders_mutex());
    KILN_CHECK(open_folders().insert(key).second, "TensorBoardWriter: ", dir_.string(),
               " is already written by another TensorBoardWriter of this process; share that one (e.g. "
               "MetricsOptions::tensorboard): the second file's SessionLog START would make TensorBoard drop "
               "the first one's points");
  }
  try {
    static std::atomic<int> counter{0};
    std::string rest = ".";  // .<host>.<pid>.<n><suffix>, appended piece by piece (g++ 12 warns on a + chain)
    rest += host_name();
    rest += '.';
    rest += std::to_string(::getpid());
    rest += '.';
    rest += std::to_string(counter++);
    rest += options_.filename_suffix;
    path_ = dir_ / (kPrefix + std::to_string(file_time(dir_, rest)) + rest);
    file_ = std::fopen(path_.c_str(), "wbx");  // x: never an existing file
    KILN_CHECK(file_ != nullptr, "TensorBoardWriter: cannot create ", path_.string(), ": ", std::strerror(errno),
               "; is the folder writable?");
    const double now = unix_seconds();
    buffer_ = tfrecord::frame(tfrecord::file_version_event(now));
    buffer_ += tfrecord::frame(tfrecord::session_start_event(now, std::max<int64_t>(0, options_.resume_step)));
    flush();  // the file exists with its header at once
  } catch (...) {
    if (file_ != nullptr) std::fclose(file_);
    std::lock_guard<std::mutex> lock(folders_mutex());
    open_folders().erase(key);
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::cerr << "kiln: " << e.what() << "\n";
  }
  if (file_ != nullptr) std::fclose(file_);
  std::lock_guard<std::mutex> lock(folders_mutex());
  open_folders().erase(folder_key_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  add_scalars(step, {{tag, value}}, wall_time);
}

void TensorBoardWriter::add_scalars(int64_t step, const Scalars& values, double wall_time) {
  if (values.empty()) return;
  for (const auto& [tag, v] : values)
    KILN_CHECK(!tag.empty(), "TensorBoardWriter(", path_.string(), "): a scalar without a tag, at step ", step);
  add_event(tfrecord::scalars_event(wall_time < 0 ? unix_seconds() : wall_time, step, values));
}

void TensorBoardWriter::add_event(const std::string& event) {
  buffer_ += tfrecord::frame(event);
  ++buffered_;
  if (buffered_ >= options_.flush_records || steady_seconds() - last_flush_ >= options_.flush_seconds) flush();
}

void TensorBoardWriter::flush() {
  last_flush_ = steady_seconds();
  if (buffer_.empty()) return;
  // Cleared first: after a failed write the file may end in part of a record, and writing the same bytes again
  // would not mend it. TensorBoard reads the file up to the damage.
  const std::string bytes = std::move(buffer_);
  buffer_.clear();
  buffered_ = 0;
  errno = 0;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size() && std::fflush(file_) == 0;
  KILN_CHECK(ok, "TensorBoardWriter: cannot write ", path_.string(), ": ", std::strerror(errno),
             " (is the disk full?); ", bytes.size(), " bytes of events are lost");
}

}  // namespace kiln::monitor
