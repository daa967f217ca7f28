// The profiler: a trace listener that records ranges per thread, times GPU ranges with CUDA events, and
// turns a cycle's records into a Result (profiler.h).
#include "kiln/profiler/profiler.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "kiln/tensor/cuda.h"    // timing events, streams
#include "kiln/tensor/error.h"   // KILN_CHECK
#include "kiln/tensor/tensor.h"  // shapes of the ranges' tensors

namespace kiln::profiler {

namespace {

std::atomic<bool> g_profile_exists{false};
std::atomic<uint64_t> g_generation{0};

int64_t now_ns(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

std::string_view dtype_short(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::UInt8: return "u8";
    case DType::Int32: return "i32";
    case DType::Int64: return "i64";
    case DType::Float16: return "f16";
    case DType::BFloat16: return "bf16";
    case DType::Float32: return "f32";
    case DType::Float64: return "f64";
    case DType::Float8_e4m3fn: return "f8e4m3";
    case DType::Float8_e5m2: return "f8e5m2";
  }
  return "?";
}

std::string shapes_of(std::span<const Tensor* const> tensors) {
  std::string s;
  for (const Tensor* t : tensors) {
    if (!s.empty()) s += ", ";
    if (!t->defined()) {
      s += "undefined";
      continue;
    }
    s += '[';
    for (int64_t d = 0; d < t->dim(); ++d) {
      if (d > 0) s += ", ";
      s += std::to_string(t->size(d));
    }
    s += "] ";
    s += dtype_short(t->dtype());
  }
  return s;
}

struct RawEvent {
  trace::Kind kind;
  std::string name;
  std::string shapes;
  int parent = -1;
  int64_t step = 0;
  int64_t host_begin_ns = 0, host_end_ns = -1;
  int gpu_device = -1;
  int gpu_stream = 0;
  int gpu_begin = -1, gpu_end = -1;  // indices into the device's event pool
};

struct ThreadBuffer {
  std::mutex mutex;
  int thread = 0;
  std::vector<RawEvent> events;
  std::vector<int> stack;  // indices into events of the open ranges, innermost last
};

// The CUDA timing events of one device, reused from cycle to cycle.
struct DevicePool {
  std::vector<std::unique_ptr<cuda::Event>> events;
  size_t used = 0;
  int anchor = -1;             // the event recorded when this device's first range of the cycle began
  int64_t anchor_host_ns = 0;  // the host time at that moment (the device was idle: synchronised first)
  std::map<void*, int> streams;

  int next() {
    if (used == events.size()) events.push_back(std::make_unique<cuda::Event>(/*enable_timing=*/true));
    return static_cast<int>(used++);
  }
};

}  // namespace

class Profile::Impl final : public trace::Listener {
 public:
  explicit Impl(Options options) : options_(std::move(options)), t0_(std::chrono::steady_clock::now()) {
    const Schedule& s = options_.schedule;
    KILN_CHECK(s.wait >= 0 && s.warmup >= 0 && s.active >= 0 && s.repeat >= 0,
               "profiler::Profile: the schedule's wait, warmup, active and repeat must be >= 0 (got ", s.wait, ", ",
               s.warmup, ", ", s.active, ", ", s.repeat, ")");
    thread_index(std::this_thread::get_id());  // the constructing thread is thread 0
  }

  // ---- trace::Listener ----
  void begin(const trace::Range& range) override {
    if (!recording_.load(std::memory_order_acquire)) return;
    ThreadBuffer& buf = buffer();
    std::lock_guard lock(buf.mutex);
    RawEvent e;
    e.kind = range.kind;
    e.name = std::string(range.name);
    if (options_.record_shapes && !range.tensors.empty()) e.shapes = shapes_of(range.tensors);
    e.parent = buf.stack.empty() ? -1 : buf.stack.back();
    e.step = step_.load(std::memory_order_relaxed);
    if (options_.gpu && range.device.is_cuda()) record_gpu(range.device.index(), e, /*begin=*/true);
    e.host_begin_ns = now_ns(t0_);
    buf.stack.push_back(static_cast<int>(buf.events.size()));
    buf.events.push_back(std::move(e));
  }

  void end(const trace::Range& range) override {
    if (!recording_.load(std::memory_order_acquire)) return;
    ThreadBuffer& buf = buffer();
    std::lock_guard lock(buf.mutex);
    if (buf.stack.empty()) return;  // began before recording did
    RawEvent& e = buf.events[static_cast<size_t>(buf.stack.back())];
    buf.stack.pop_back();
    e.host_end_ns = now_ns(t0_);
    if (e.gpu_device >= 0) record_gpu(e.gpu_device, e, /*begin=*/false);
  }

  // ---- the schedule ----
  enum class Phase { Wait, Warmup, Active, Done };

  Phase phase_of(int64_t step) const {
    const Schedule& s = options_.schedule;
    if (s.active == 0) return stopped_ ? Phase::Done : Phase::Active;
    const int64_t cycle_len = s.wait + s.warmup + s.active;
    const int64_t cycle = step / cycle_len;
    if (s.repeat > 0 && cycle >= s.repeat) return Phase::Done;
    const int64_t pos = step % cycle_len;
    if (pos < s.wait) return Phase::Wait;
    if (pos < s.wait + s.warmup) return Phase::Warmup;
    return Phase::Active;
  }

  // Installs the listener when the current step is a warmup or active one and it is not recording yet.
  void start_if_due(const std::shared_ptr<Impl>& self) {
    const Phase p = phase_of(step_.load());
    if ((p != Phase::Warmup && p != Phase::Active) || recording_.load()) return;
    first_active_step_ = first_active_of(step_.load());
    start_cycle();
    trace::add_listener(self);
    listening_ = true;
  }

  // The first active step of the cycle `step` is in.
  int64_t first_active_of(int64_t step) const {
    const Schedule& s = options_.schedule;
    if (s.active == 0) return 0;
    const int64_t cycle_len = s.wait + s.warmup + s.active;
    return step / cycle_len * cycle_len + s.wait + s.warmup;
  }

  void step(const std::shared_ptr<Impl>& self) {
    if (phase_of(step_.load()) == Phase::Done) return;
    trace::end_step();
    const Phase before = phase_of(step_.load());
    step_.fetch_add(1);
    const Phase after = phase_of(step_.load());
    const bool cycle_over =
        before == Phase::Active && (after != Phase::Active || first_active_of(step_.load()) != first_active_step_);
    if (cycle_over) {
      remove_from_trace(self);
      finish_cycle();
    }
    start_if_due(self);
    if (recording_.load()) trace::mark_step(step_.load(), step_device_);
  }

  void stop(const std::shared_ptr<Impl>& self) {
    if (stopped_) return;
    trace::end_step();
    const bool was_recording = recording_.load();
    // A scheduled cycle that had not reached its active steps keeps nothing.
    const bool keep = options_.schedule.active == 0 || phase_of(step_.load()) == Phase::Active;
    stopped_ = true;
    remove_from_trace(self);
    if (was_recording) finish_cycle(keep);
  }

  void remove_from_trace(const std::shared_ptr<Impl>& self) {
    if (listening_) trace::remove_listener(self);
    listening_ = false;
  }

  void open_first_step() {
    if (recording_.load()) trace::mark_step(0, step_device_);
  }

  bool recording() const { return recording_.load(); }
  int64_t step_number() const { return step_.load(); }
  int cycles_done() const { return cycles_; }
  const Result& result() const { return result_; }

 private:
  ThreadBuffer& buffer() {
    thread_local struct {
      uint64_t generation = 0;
      ThreadBuffer* buf = nullptr;
    } slot;
    if (slot.generation != generation_ || slot.buf == nullptr) {
      std::lock_guard lock(mutex_);
      auto buf = std::make_unique<ThreadBuffer>();
      buf->thread = thread_index(std::this_thread::get_id());
      slot.buf = buf.get();
      slot.generation = generation_;
      buffers_.push_back(std::move(buf));
    }
    return *slot.buf;
  }

  // Callers hold mutex_ (or are the constructor).
  int thread_index(std::thread::id id) {
    auto [it, inserted] = threads_.try_emplace(id, static_cast<int>(threads_.size()));
    if (inserted) thread_names_.push_back(it->second == 0 ? "main" : "thread " + std::to_string(it->second));
    return it->second;
  }

  void record_gpu(int device, RawEvent& e, bool begin) {
    std::lock_guard lock(gpu_mutex_);
    DevicePool& pool = pools_[device];
    const cuda::Stream stream = cuda::current_stream(device);
    if (pool.anchor < 0) {
      // Align this device's clock with the host's: with the device idle, an event recorded now happens now.
      cuda::synchronize(device);
      pool.anchor = pool.next();
      pool.events[static_cast<size_t>(pool.anchor)]->record(stream);
      pool.anchor_host_ns = now_ns(t0_);
    }
    const int index = pool.next();
    pool.events[static_cast<size_t>(index)]->record(stream);
    if (begin) {
      e.gpu_device = device;
      auto [it, inserted] = pool.streams.try_emplace(stream.handle(), static_cast<int>(pool.streams.size()));
      e.gpu_stream = it->second;
      e.gpu_begin = index;
    } else {
      e.gpu_end = index;
    }
  }

  void start_cycle() {
    std::lock_guard lock(mutex_);
    generation_ = ++g_generation;
    buffers_in_cycle_ = buffers_.size();
    {
      std::lock_guard gl(gpu_mutex_);
      for (auto& [device, pool] : pools_) {
        pool.used = 0;
        pool.anchor = -1;
      }
    }
    step_device_ = cuda::is_available() && options_.gpu ? Device::cuda(cuda::current_device()) : Device::cpu();
    recording_.store(true, std::memory_order_release);
  }

  // Turns the cycle's records into the result. recording_ goes false first, so no new range starts; the
  // buffers are emptied one at a time under their own lock, then the GPU times are read (lock order:
  // buffer, then GPU pools, as in begin()).
  void finish_cycle(bool keep = true) {
    recording_.store(false, std::memory_order_release);
    std::vector<std::pair<int, std::vector<RawEvent>>> taken;  // (thread, events)
    {
      std::lock_guard lock(mutex_);
      for (size_t b = buffers_in_cycle_; b < buffers_.size(); ++b) {
        ThreadBuffer& buf = *buffers_[b];
        std::lock_guard bl(buf.mutex);
        taken.emplace_back(buf.thread, std::move(buf.events));
        buf.events.clear();
        buf.stack.clear();
      }
      buffers_in_cycle_ = buffers_.size();
      generation_ = ++g_generation;  // threads start new buffers when recording resumes
    }
    if (!keep) return;

    Result r;
    {
      std::lock_guard lock(mutex_);
      r.thread_names_ = thread_names_;
    }
    const int64_t first = first_active_step_;
    const int64_t last = options_.schedule.active == 0 ? step_.load() : first + options_.schedule.active - 1;
    r.steps_ = std::min(last, step_.load()) - first + 1;
    std::lock_guard gl(gpu_mutex_);
    for (auto& [device, pool] : pools_)
      if (pool.used > 0) cuda::synchronize(device);
    for (auto& [thread, events] : taken) {
      std::vector<int> new_index(events.size(), -1);
      for (size_t i = 0; i < events.size(); ++i) {
        const RawEvent& raw = events[i];
        if (raw.host_end_ns < 0 || raw.step < first || raw.step > last) continue;  // still open, or warmup
        Event e;
        e.kind = raw.kind;
        e.name = raw.name;
        e.shapes = raw.shapes;
        e.thread = thread;
        e.step = raw.step;
        e.parent = raw.parent >= 0 ? new_index[static_cast<size_t>(raw.parent)] : -1;
        e.host_begin_ns = raw.host_begin_ns;
        e.host_end_ns = raw.host_end_ns;
        if (raw.gpu_device >= 0 && raw.gpu_begin >= 0 && raw.gpu_end >= 0) {
          const DevicePool& pool = pools_.at(raw.gpu_device);
          const cuda::Event& anchor = *pool.events[static_cast<size_t>(pool.anchor)];
          auto at = [&](int index) {
            return pool.anchor_host_ns +
                   static_cast<int64_t>(anchor.elapsed_ms(*pool.events[static_cast<size_t>(index)]) * 1e6);
          };
          e.gpu_device = raw.gpu_device;
          e.gpu_stream = raw.gpu_stream;
          e.gpu_begin_ns = at(raw.gpu_begin);
          e.gpu_end_ns = std::max(e.gpu_begin_ns, at(raw.gpu_end));
        }
        new_index[i] = static_cast<int>(r.events_.size());
        r.events_.push_back(std::move(e));
      }
    }
    ++cycles_;
    result_ = std::move(r);
    if (!options_.trace_path.empty()) result_.write_chrome_trace(trace_path_for(cycles_));
    if (options_.on_trace_ready) options_.on_trace_ready(result_);
  }

  std::string trace_path_for(int cycle) const {
    if (options_.schedule.repeat == 1) return options_.trace_path;
    std::string p = options_.trace_path;
    std::string suffix = ".";  // (not "." + to_string: GCC 12 warns falsely about that, -Wrestrict)
    suffix += std::to_string(cycle);
    const auto dot = p.rfind(".json");
    if (dot != std::string::npos && dot + 5 == p.size()) return p.insert(dot, suffix);
    return p + suffix;
  }

  Options options_;
  std::chrono::steady_clock::time_point t0_;
  std::atomic<bool> recording_{false};
  std::atomic<int64_t> step_{0};
  int64_t first_active_step_ = -1;
  bool stopped_ = false;
  bool listening_ = false;
  int cycles_ = 0;
  Device step_device_ = Device::cpu();

  std::mutex mutex_;                                    // buffers_, threads_, generation_
  std::vector<std::unique_ptr<ThreadBuffer>> buffers_;  // kept until the Impl goes: threads may hold pointers
  size_t buffers_in_cycle_ = 0;
  std::unordered_map<std::thread::id, int> threads_;
  std::vector<std::string> thread_names_;
  uint64_t generation_ = 0;

  std::mutex gpu_mutex_;
  std::map<int, DevicePool> pools_;

  Result result_;
};

Profile::Profile(Options options) {
  KILN_CHECK(!g_profile_exists.exchange(true),
             "profiler::Profile: another Profile is alive in this process; stop and destroy it before making a new "
             "one");
  try {
    impl_ = std::make_shared<Impl>(std::move(options));
    impl_->start_if_due(impl_);
    impl_->open_first_step();
  } catch (...) {
    g_profile_exists = false;
    throw;
  }
}

Profile::~Profile() {
  try {
    stop();
  } catch (...) {
    // A destructor must not throw; stop() explicitly to see the error (an unwritable trace path, say).
  }
  g_profile_exists = false;
}

void Profile::step() { impl_->step(impl_); }

void Profile::stop() { impl_->stop(impl_); }

bool Profile::recording() const { return impl_->recording(); }
int64_t Profile::step_number() const { return impl_->step_number(); }
int Profile::cycles_done() const { return impl_->cycles_done(); }
const Result& Profile::result() const { return impl_->result(); }

}  // namespace kiln::profiler
