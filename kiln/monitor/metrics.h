// kiln/monitor/metrics.h — a training run's scalars, logged to a CSV file and to TensorBoard event files,
// continued correctly when the run is resumed from a checkpoint.
//
//   monitor::MetricsLogger log({.csv = "run/metrics.csv",
//                               .tensorboard_dir = "run/tb",              // empty: no TensorBoard
//                               .resume_step = resumed ? step + 1 : -1,   // the first step this run logs again
//                               .enabled = env.is_main()});               // rank 0 writes; the others do nothing
//   log.log(step, {{"loss", loss}, {"lr", lr}});                          // a CSV row "step,loss,lr" + 2 points
//
// Resuming. A run killed after step 1250 and resumed from its checkpoint of step 1200 does steps 1201..1250
// again, so what the first run logged for them is stale. `resume_step` is the first step the resumed run logs
// (1201 here, when steps are counted from 1 and the checkpoint holds 1200 done; in a loop whose step index starts
// at 0, the checkpoint's step count itself). Then:
//   - CsvLogger keeps the existing file's rows whose step is < resume_step and appends after them. When there
//     are rows to drop, the kept part is written to <file>.tmp, flushed and renamed over the file, so a crash
//     at any moment leaves either the old file or the new one, never a half. A file whose header is not the
//     columns asked for is refused (kiln::Error naming both): move it away or log the same columns.
//   - TensorBoardWriter starts a new event file whose first event after the version is a SessionLog START at
//     resume_step. TensorBoard's reader (EventAccumulator, files read in name order) drops every point of
//     the folder at a step >= that one when it meets it: its documented way of discarding an interrupted
//     run's orphaned points. A new run (resume_step -1) writes START at step 0, so a folder reused by a new
//     run shows the new run only (as the CSV file, which a new run starts afresh).
//
// Values are written as the shortest decimal that reads back to the same double (std::to_chars), so a CSV
// round-trips exactly; TensorBoard stores float32 (simple_value), as every TensorBoard writer does.
//
// Multi-process runs: the classes here know nothing of ranks. Give `enabled = env.is_main()` (or only
// construct them on rank 0): several ranks writing one file would interleave their rows.
//
// Errors (an unwritable folder, a full disk, a mismatched header) are kiln::Error with the path, the
// system's reason and what to do. Destructors flush and never throw (a failure there is printed to stderr).
#pragma once

#include <cstdint>
#include <cstdio>  // std::FILE
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kiln::monitor {

// Named scalars in the order given: {{"loss", 0.5}, {"lr", 1e-3}}.
using Scalars = std::vector<std::pair<std::string, double>>;

// ---------------------------------------------------------------- CSV

struct CsvOptions {
  int64_t resume_step = -1;          // >= 0: keep the file's rows with step < this, append; < 0: a new file
  std::string step_column = "step";  // the column compared with resume_step (must be one of the columns)
};

// A CSV file with a fixed header; one row per call, flushed at once (rows are rare: a crash loses none).
//
//   monitor::CsvLogger csv("run/train_log.csv", {"epoch", "step", "loss"});
//   csv.row({1, 100, 0.25});                              // in column order
//   csv.named_row({{"step", 200}, {"loss", 0.125}});      // by name; a column not given is an empty cell
class CsvLogger {
 public:
  // Creates the folder if missing. Throws kiln::Error when the folder or file cannot be written, when resuming
  // onto a file whose header differs from `columns`, or when a kept row's step cell is not a number.
  CsvLogger(std::filesystem::path path, std::vector<std::string> columns, CsvOptions options = {});
  ~CsvLogger();
  CsvLogger(const CsvLogger&) = delete;
  CsvLogger& operator=(const CsvLogger&) = delete;

  void row(const std::vector<double>& values);  // exactly one value per column
  void named_row(const Scalars& values);        // names from the columns, each at most once

  // The file written.
  const std::filesystem::path& path() const { return path_; }
  // The header's column names, in order.
  const std::vector<std::string>& columns() const { return columns_; }
  // Rows of the earlier run kept when resuming.
  int64_t rows_kept() const { return rows_kept_; }
  // Rows at steps >= resume_step, removed when resuming.
  int64_t rows_dropped() const { return rows_dropped_; }

 private:
  void write_line(const std::string& line);
  std::filesystem::path path_;
  std::vector<std::string> columns_;
  std::FILE* file_ = nullptr;
  int64_t rows_kept_ = 0, rows_dropped_ = 0;
};

// The text a CsvLogger writes for `v`: the shortest decimal that parses back to v ("0.1", "1e-05", "3"),
// "nan", "inf", "-inf".
std::string format_csv_number(double v);

// ---------------------------------------------------------------- TensorBoard

struct TensorBoardOptions {
  int64_t resume_step = -1;       // >= 0: a SessionLog START at this step (see the top); < 0: START at step 0
  double flush_seconds = 5;       // a write flushes when the last flush is older than this
  int64_t flush_records = 100;    // ... or when this many events wait in the buffer
  std::string filename_suffix{};  // appended to the file name (e.g. ".train")
};

// Scalars to TensorBoard: one event file events.out.tfevents.<unix seconds>.<host>.<pid>.<n><suffix> in `dir`
// (created if missing), in TensorFlow's TFRecord framing with hand-encoded Event protobufs; nothing else is
// needed to read it with TensorBoard. Events are buffered and written by flush(), when the buffer is
// older than flush_seconds or holds flush_records events (checked on each add, no thread), and by the
// destructor. One writer per folder in a process (a second one would make TensorBoard purge the first's
// points, see the top): opening a folder that another live writer of this process uses throws.
//
//   monitor::TensorBoardWriter tb("run/tb", {.resume_step = 1201});
//   tb.add_scalar("train/loss", 0.25, 1201);
//   tb.add_scalars(1202, {{"train/loss", 0.24}, {"train/lr", 1e-3}});   // one event with both values
class TensorBoardWriter {
 public:
  // Creates `dir` if missing and a new event file in it; throws kiln::Error when it cannot, or when another live
  // writer of this process uses `dir`.
  explicit TensorBoardWriter(std::filesystem::path dir, TensorBoardOptions options = {});
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // wall_time: seconds since the Unix epoch; < 0 means now.
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time = -1);
  void add_scalars(int64_t step, const Scalars& values, double wall_time = -1);  // one event; nothing if empty
  void flush();  // throws kiln::Error (path and reason) when the write fails

  // The event file written.
  const std::filesystem::path& path() const { return path_; }

 private:
  void add_event(const std::string& event);
  std::filesystem::path dir_, path_;
  std::string folder_key_;  // the folder's entry in the process's set of folders with a live writer
  TensorBoardOptions options_;
  std::FILE* file_ = nullptr;
  std::string buffer_;
  int64_t buffered_ = 0;
  double last_flush_ = 0;  // steady-clock seconds
};

// ---------------------------------------------------------------- both

struct MetricsOptions {
  std::filesystem::path csv{};  // empty: no CSV file
  // The CSV header. Empty: "step" followed by the names of the first log() call, and the file is opened then
  // (so a mismatched header on resume is only reported at the first log); give them to have it checked now.
  std::vector<std::string> columns{};
  std::filesystem::path tensorboard_dir{};           // empty: no TensorBoard (unless `tensorboard` is given)
  std::shared_ptr<TensorBoardWriter> tensorboard{};  // a writer to share with another logger (one per folder)
  std::string tag_prefix{};                          // prepended to each name for TensorBoard: "train/" -> "train/loss"
  int64_t resume_step = -1;                          // for both, see the top
  bool enabled = true;                               // false: every call does nothing (ranks other than 0)
  double flush_seconds = 5;                          // TensorBoard's, see TensorBoardOptions
};

// One call logs a step's scalars to the CSV file (the step in its "step" column) and, when a folder is given,
// to TensorBoard (every value but "step", tagged tag_prefix + name, at `step`).
//
//   monitor::MetricsLogger train_log({.csv = out / "train_log.csv", .columns = {"epoch", "step", "loss"},
//                                     .tensorboard_dir = tb_dir, .tag_prefix = "train/"});
//   monitor::MetricsLogger epoch_log({.csv = out / "metrics.csv", .columns = {"epoch", "step", "top1"},
//                                     .tensorboard = train_log.tensorboard(), .tag_prefix = "eval/"});
class MetricsLogger {
 public:
  // Opens the TensorBoard writer and, when columns are given, the CSV file; disabled, it opens nothing.
  explicit MetricsLogger(MetricsOptions options);
  ~MetricsLogger();
  MetricsLogger(MetricsLogger&&) noexcept;             // takes over the files
  MetricsLogger& operator=(MetricsLogger&&) noexcept;  // takes over the other's files, releasing its own

  void log(int64_t step, const Scalars& values);  // no value may be named "step"
  void flush();                                   // the TensorBoard buffer (CSV rows are flushed as written)

  // options.enabled: false makes every call do nothing.
  bool enabled() const { return options_.enabled; }
  // The TensorBoard writer, to share with another logger; null without one.
  const std::shared_ptr<TensorBoardWriter>& tensorboard() const { return tensorboard_; }
  // The CSV logger; null without a CSV file, or before the first log().
  CsvLogger* csv() const { return csv_.get(); }

 private:
  void open_csv(std::vector<std::string> columns);
  MetricsOptions options_;
  std::unique_ptr<CsvLogger> csv_;
  std::shared_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace kiln::monitor
