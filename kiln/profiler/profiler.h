// kiln/profiler/profiler.h — where a training step spends its time: each op, module, backward node and step,
// on the host and on the GPU, with shapes; a Chrome/Perfetto trace and a table of the top ops.
//
//   profiler::Profile prof({.schedule = {.wait = 5, .warmup = 2, .active = 3},
//                           .trace_path = "run/trace.json"});     // open it in ui.perfetto.dev
//   for (int64_t step = 0; step < steps; ++step) {
//     train_step();
//     prof.step();   // advances the schedule; writes the trace when the active steps are done
//   }
//   std::cout << prof.result().table(20);   // the top 20 ops by GPU time
//
// Without a schedule (active = 0) it records from construction until stop() or its destruction. Under
// recording, each op on a GPU gets a pair of CUDA timing events on its stream; the GPU times are read when
// the active steps end (that one point synchronises the host with the GPUs). Ops on worker threads (the data
// loader's) are recorded too, on their own rows. One Profile at a time per process.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/tensor/trace.h"

namespace kiln::profiler {

// Steps are counted by Profile::step(). Each cycle skips `wait` steps, records `warmup` steps and throws
// them away (first calls are slow: plans, allocations), then keeps `active` steps; `repeat` cycles (0: no
// limit). active = 0: no schedule, everything from construction to stop() is kept.
struct Schedule {
  int64_t wait = 0;    // steps skipped at the start of each cycle
  int64_t warmup = 0;  // steps recorded and thrown away
  int64_t active = 0;  // steps kept; 0: no schedule
  int64_t repeat = 1;  // cycles; 0: no limit
};

// One recorded range. Times are in nanoseconds since the Profile was made (host clock); GPU times come
// from CUDA events placed on the range's stream, aligned to the host clock at the start of recording.
struct Event {
  trace::Kind kind{};         // op, module, backward node, step or user range
  std::string name{};         // the op's, module's (type) or range's name
  std::string shapes{};       // "[256, 64, 56, 56] bf16, [64, 64, 1, 1] bf16" when record_shapes; else ""
  int thread = 0;             // 0 = the thread that made the Profile, then in order of first appearance
  int64_t step = -1;          // the profiler step it ran in
  int parent = -1;            // index of the enclosing event on the same thread, -1 at top level
  int64_t host_begin_ns = 0;  // when the range began on the host
  int64_t host_end_ns = 0;    // when it ended on the host
  int gpu_device = -1;        // the CUDA device its GPU times are on; -1: host only
  int gpu_stream = 0;         // streams numbered per device in order of first appearance
  int64_t gpu_begin_ns = 0;   // when its GPU work began (when gpu_device >= 0)
  int64_t gpu_end_ns = 0;     // when its GPU work ended

  // Host duration, in nanoseconds.
  int64_t host_ns() const { return host_end_ns - host_begin_ns; }
  // GPU duration, in nanoseconds; 0 for a host-only event.
  int64_t gpu_ns() const { return gpu_device >= 0 ? gpu_end_ns - gpu_begin_ns : 0; }
};

// Per-name totals of one kind, as the table shows them. "self" excludes the time of nested events.
struct OpStats {
  trace::Kind kind{};  // the kind of the events totalled
  std::string name{};  // their name
  int64_t calls = 0;   // events of this name
  // Host time, in nanoseconds: total, and self (nested events excluded).
  int64_t host_total_ns = 0, host_self_ns = 0;  // host_self_ns: without nested events
  // GPU time, in nanoseconds: total, and self (nested events excluded).
  int64_t gpu_total_ns = 0, gpu_self_ns = 0;  // gpu_self_ns: without nested events
};

// What a Profile recorded over one cycle (or the whole run, without a schedule): the events, per-name totals, a
// table and a Chrome trace.
class Result {
 public:
  // Per thread, in the order the ranges began (threads one after the other).
  const std::vector<Event>& events() const { return events_; }
  // The name of each Event::thread: "main", then "thread 1", ...
  const std::vector<std::string>& thread_names() const { return thread_names_; }
  // Totals per (kind, name), sorted by GPU self time, then host self time, descending.
  std::vector<OpStats> stats(trace::Kind kind = trace::Kind::Op) const;
  // The top `rows` ops: calls, GPU and host time (total and self), each's share of all ops' GPU self time.
  // Without GPU times, host times only, by host self time.
  std::string table(int rows = 20) const;
  // Chrome trace event format (JSON), readable by ui.perfetto.dev and chrome://tracing. Throws kiln::Error
  // naming the path when it cannot be written.
  void write_chrome_trace(const std::string& path) const;
  std::string chrome_trace_json() const;  // the same trace as a string
  // The number of profiler steps kept.
  int64_t steps() const { return steps_; }

 private:
  friend class Profile;
  std::vector<Event> events_;
  std::vector<std::string> thread_names_;
  int64_t steps_ = 0;
};

// What a Profile records, when, and where its results go.
struct Options {
  Schedule schedule{};        // when to record; the default records from construction to stop()
  bool record_shapes = true;  // fill Event::shapes with each op's tensor shapes and dtypes
  bool gpu = true;            // time ops on GPUs with CUDA events
  std::string trace_path{};   // written when each cycle ends; with repeat != 1, ".<cycle>" goes before ".json"
  std::function<void(const Result&)> on_trace_ready{};  // called when each cycle ends
};

// Records the ops, their host and GPU times and user ranges over a scope or schedule; result() gives tables and a
// Perfetto trace.
class Profile {
 public:
  explicit Profile(Options options = {});  // throws if another Profile is alive
  ~Profile();                              // stop()
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;

  // Ends the current step (and opens the next step's trace range). When that ends the active steps of a
  // cycle, the cycle's result is made, written to trace_path and given to on_trace_ready.
  void step();
  // Stops recording; a cycle under way (or the whole run, without a schedule) becomes the result.
  void stop();

  bool recording() const;       // in warmup or active steps
  int64_t step_number() const;  // steps ended so far
  int cycles_done() const;      // cycles whose result was made
  // The last finished cycle's result (empty before the first).
  const Result& result() const;

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace kiln::profiler
