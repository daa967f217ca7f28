// kiln/data/dataloader.cpp — worker threads, the bounded prefetch window, in-order delivery, the copy stream,
// and the look-ahead into the next epoch.
//
// A pipeline (worker threads and what they loaded) serves a sequence of epochs, each a segment of one global
// batch numbering: epoch e's batches are numbers first..first+count-1, and epoch e+1's segment follows on.
// Workers take numbers in order, at most prefetch_batches past the number the consumer has reached, and leave
// the collated batch (or the error) in `ready`, keyed by number; the consumer takes them in order. So while
// epoch e's last batches are in use, the window already reaches into the epochs after it: the consumer appends
// epochs e+1, e+2, ... as far as the window reaches (when epoch e starts, and as each batch is handed out), so an
// epoch of fewer batches than the window does not leave workers idle at its end. An epoch range that reaches its
// end parks the pipeline in the loader's Core, and loader.epoch(e + 1) from batch 0 takes it over; any other call
// drops it (its threads are joined).
// For device delivery every CUDA call happens on the consumer's thread: when batch k is handed out, batch
// k+1 (if loaded, also the next epoch's first) is copied on the copy stream, so its copy overlaps the
// consumer's work on batch k.
#include "kiln/data/dataloader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "kiln/data/distributed_env.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/error.h"

namespace kiln::data {

using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

namespace loader_detail {

// One epoch's batches (as dataset indices) in the pipeline's global numbering: batch b is number first + b.
struct Segment {
  uint64_t epoch = 0;
  int64_t first = 0;
  std::vector<std::vector<int64_t>> batches;
  int64_t count() const { return static_cast<int64_t>(batches.size()); }
  int64_t end() const { return first + count(); }
};

struct Pipeline;

}  // namespace loader_detail

using loader_detail::Pipeline;
using loader_detail::Segment;

struct DataLoader::Core {
  std::shared_ptr<const Dataset> dataset;
  DataLoaderOptions options;
  bool pinned = false;                      // collate into page-locked memory
  std::optional<cuda::Stream> copy_stream;  // device delivery
  mutable std::mutex stats_mutex;
  Clock::time_point epoch_start = Clock::now();
  mutable LoaderStats stats;  // the workers add their times from load(), a const member

  // The pipeline of an epoch range that ran to its end, loading the next epoch's first batches. It holds
  // the Core (a cycle): ~DataLoader breaks it, and a range that outlives its loader parks nothing.
  std::mutex park_mutex;
  bool loader_alive = true;
  std::shared_ptr<Pipeline> parked;

  LoaderStats read_stats() const {
    std::lock_guard<std::mutex> lock(stats_mutex);
    LoaderStats s = stats;
    s.elapsed_s = seconds_since(epoch_start);
    s.wait_fraction = s.elapsed_s > 0 ? std::min(1.0, s.total_wait_s / s.elapsed_s) : 0;
    return s;
  }

  void restart_stats() {
    std::lock_guard<std::mutex> lock(stats_mutex);
    stats = {};
    epoch_start = Clock::now();
  }

  void record_load(double samples_s, double collate_s) const {
    std::lock_guard<std::mutex> lock(stats_mutex);
    stats.batches_loaded += 1;
    stats.samples_s += samples_s;
    stats.collate_s += collate_s;
  }

  void record_wait(double wait) {
    std::lock_guard<std::mutex> lock(stats_mutex);
    stats.last_wait_s = wait;
    stats.total_wait_s += wait;
    stats.batches += 1;
  }

  // The batches of `epoch` as dataset indices; throws where the sampler gives an index out of range.
  std::vector<std::vector<int64_t>> batches_of(uint64_t epoch) const {
    std::vector<int64_t> indices = options.sampler->indices(epoch);
    const int64_t n = dataset->size();
    for (size_t i = 0; i < indices.size(); ++i) {
      KILN_CHECK(indices[i] >= 0 && indices[i] < n, "DataLoader: the sampler gave index ", indices[i], " (position ", i,
                 " of epoch ", epoch, ") but ", dataset->describe(), " has ", n, " samples (indices 0..", n - 1, ")");
    }
    return batch_indices(indices, options.batch_size, options.drop_last);
  }

  // Batch `b` of a segment, loaded on the calling thread. Errors name the batch and epoch. With the default
  // collate each sample is copied into the batch as soon as it is loaded and then let go: the next sample reuses
  // its memory while that is still in the CPU's cache, and no batch of separate samples is ever held.
  Batch load(const Segment& seg, int64_t b) const {
    const Dataset& ds = *dataset;
    const std::vector<int64_t>& idx = seg.batches[static_cast<size_t>(b)];
    std::optional<cuda::DeviceGuard> device_guard;  // a collate that works on the GPU works on the loader's
    if (options.device && options.device->is_cuda()) device_guard.emplace(options.device->index());
    const Clock::time_point start = Clock::now();
    double samples_s = 0;  // the time in ds.get; the rest of the batch's time is collating
    auto sample = [&](int64_t i) {
      try {
        SampleRng rng(options.seed, seg.epoch, i);
        const Clock::time_point t = Clock::now();
        Example ex = ds.get(i, rng);
        samples_s += seconds_since(t);
        return ex;
      } catch (...) {
        KILN_FAIL("DataLoader: loading sample ", i, " (batch ", b, " of epoch ", seg.epoch, ") from ", ds.describe(),
                  " failed: ", what_of(std::current_exception()));
      }
    };
    auto collate_failed = [&](const std::exception_ptr& e) {
      KILN_FAIL("DataLoader: collating batch ", b, " of epoch ", seg.epoch, " (samples ", idx, ") from ", ds.describe(),
                " failed: ", what_of(e));
    };
    Batch batch;
    if (!options.collate) {
      Collator collator(idx.size(), pinned);
      for (int64_t i : idx) {
        Example ex = sample(i);
        try {
          collator.add(ex);
        } catch (...) {
          collate_failed(std::current_exception());
        }
      }
      batch = collator.finish();
    } else {
      std::vector<Example> examples;
      examples.reserve(idx.size());
      for (int64_t i : idx) examples.push_back(sample(i));
      try {
        batch = options.collate(examples, pinned);
      } catch (...) {
        collate_failed(std::current_exception());
      }
    }
    batch.indices = idx;
    record_load(samples_s, seconds_since(start) - samples_s);
    return batch;
  }

  // Parks a pipeline for loader.epoch(e + 1); dropped instead once the loader is gone.
  void park(std::shared_ptr<Pipeline> p) {
    {
      std::lock_guard<std::mutex> lock(park_mutex);
      if (loader_alive) std::swap(parked, p);
    }
    // `p` (the one replaced, or the one refused) is let go here, outside the lock: its threads are joined.
  }

  std::shared_ptr<Pipeline> unpark() {
    std::lock_guard<std::mutex> lock(park_mutex);
    return std::move(parked);
  }
};

namespace loader_detail {

// A batch copied (or being copied) to the device: ready once `done` has happened on the copy stream.
struct InFlight {
  int64_t number = -1;
  Batch batch;
  std::unique_ptr<cuda::Event> done;
};

// Starts the host-to-device copy of a pinned batch on the copy stream. The host batch is released while
// the copy stream is current, so the pinned allocator reuses its memory only after the copy.
InFlight copy_to_device(const DataLoader::Core& core, int64_t number, Batch host) {
  const Device dev = *core.options.device;
  cuda::DeviceGuard device_guard(dev.index());
  cuda::StreamGuard stream_guard(*core.copy_stream);
  InFlight f;
  f.number = number;
  if (host.ready) host.ready->wait(*core.copy_stream);  // fields the collate made on the GPU
  f.batch = host.to(dev, /*non_blocking=*/true);
  f.done = std::make_unique<cuda::Event>();
  f.done->record(*core.copy_stream);
  host = Batch();
  return f;
}

// Worker threads loading the batches of a sequence of epoch segments. The consumer (the thread that iterates
// the epoch ranges) appends segments and takes batches; `ahead` is the consumer's alone.
struct Pipeline {
  struct Loaded {
    Batch batch;
    std::exception_ptr error;
  };

  std::shared_ptr<DataLoader::Core> core;
  const bool open;                // more segments may be appended: idle workers wait instead of ending
  std::optional<InFlight> ahead;  // the consumer's: batch `next` already on its way to the device
  uint64_t last_epoch = 0;        // the consumer's: the epoch of the last segment
  bool last_appended = false;     // the consumer's: no epoch after last_epoch is appended (see look_ahead)

  std::mutex mutex;  // guards what follows, shared with the workers
  std::condition_variable work_cv, ready_cv;
  std::deque<std::shared_ptr<const Segment>> segments;  // those not yet handed out in full, in order
  int64_t end = 0;                                      // the end of the last segment
  int64_t next = 0;                                     // the next number to hand out
  int64_t dispatch = 0;                                 // the next number a worker takes
  bool stop = false;
  std::map<int64_t, Loaded> ready;
  std::vector<std::thread> threads;

  // Starts `workers` threads on `seg` from its batch `start`.
  Pipeline(std::shared_ptr<DataLoader::Core> c, std::shared_ptr<const Segment> seg, int64_t start, int64_t workers,
           bool more)
      : core(std::move(c)), open(more) {
    end = seg->end();
    next = dispatch = seg->first + start;
    last_epoch = seg->epoch;
    segments.push_back(std::move(seg));
    try {
      for (int64_t w = 0; w < workers; ++w) threads.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {
      const size_t started = threads.size();
      shut_down();
      KILN_FAIL("DataLoader: could not start loading thread ", started + 1, " of ", workers, " (", e.what(),
                "); the system refuses more threads (see ulimit -u and the memory limit): use fewer workers");
    } catch (...) {
      shut_down();
      throw;
    }
  }
  ~Pipeline() { shut_down(); }
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Appends the segment of another epoch after the last one (the consumer's thread).
  std::shared_ptr<const Segment> append(uint64_t epoch, std::vector<std::vector<int64_t>> batches) {
    last_epoch = epoch;
    auto seg = std::make_shared<Segment>();
    seg->epoch = epoch;
    seg->batches = std::move(batches);
    {
      std::lock_guard<std::mutex> lock(mutex);
      seg->first = end;
      end = seg->end();
      segments.push_back(seg);
    }
    work_cv.notify_all();
    return seg;
  }

  // The segment that starts at `next` (the one an epoch range from batch 0 takes over), or null.
  std::shared_ptr<const Segment> segment_at_next() {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& s : segments) {
      if (s->first == next) return s;
    }
    return nullptr;
  }

  void work() {
    const int64_t window = core->options.prefetch_batches;
    for (;;) {
      int64_t number;
      std::shared_ptr<const Segment> seg;
      {
        std::unique_lock<std::mutex> lock(mutex);
        work_cv.wait(
            lock, [&] { return stop || (dispatch < end && dispatch < next + window) || (!open && dispatch >= end); });
        if (stop || dispatch >= end) return;
        number = dispatch++;
        for (const auto& s : segments) {  // looked up under the lock: the consumer appends and pops
          if (number >= s->first && number < s->end()) seg = s;
        }
      }
      Loaded r;
      try {
        r.batch = core->load(*seg, number - seg->first);
      } catch (...) {
        r.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        ready.emplace(number, std::move(r));
      }
      ready_cv.notify_all();
    }
  }

  // Number `number` from the workers, blocking up to `timeout_s` (0: forever); nullopt when it ran out.
  std::optional<Loaded> take(int64_t number, double timeout_s) {
    std::unique_lock<std::mutex> lock(mutex);
    auto has = [&] { return ready.count(number) > 0; };
    if (timeout_s > 0) {
      const auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
      if (!ready_cv.wait_for(lock, limit, has)) return std::nullopt;
    } else {
      ready_cv.wait(lock, has);
    }
    auto it = ready.find(number);
    Loaded r = std::move(it->second);
    ready.erase(it);
    return r;
  }

  // The consumer has handed out `number`: the window moves on, and finished segments are let go.
  void handed_out(int64_t number) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      next = number + 1;
      while (!segments.empty() && segments.front()->end() <= next) segments.pop_front();
    }
    work_cv.notify_all();
  }

  // Copies number `number` ahead if a worker has it ready (never waits); it may be the next epoch's first.
  void copy_ahead(int64_t number) {
    Batch host;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (number >= end) return;
      auto it = ready.find(number);
      if (it == ready.end() || it->second.error) return;
      host = std::move(it->second.batch);
      ready.erase(it);
    }
    ahead = copy_to_device(*core, number, std::move(host));
  }

  // Stops and joins the workers and drops what they loaded; idempotent, never throws.
  void shut_down() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    work_cv.notify_all();
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
    threads.clear();
    ready.clear();
    ahead.reset();
  }
};

}  // namespace loader_detail

using loader_detail::copy_to_device;
using loader_detail::InFlight;

namespace {

// Appends the epochs after the pipeline's last one while its prefetch window reaches past their end, so its workers
// go on into them (with a short epoch, several: batches of 256 from 2,400 samples make epochs of 9 batches, fewer
// than 16 workers' window of 32). The consumer's thread. An epoch whose sampler fails, or that has no batches,
// ends the look-ahead there: loader.epoch() of it then starts afresh and reports the error, or hands out nothing.
void look_ahead(const DataLoader::Core& core, Pipeline& pipe) {
  if (!pipe.open) return;
  const int64_t window = core.options.prefetch_batches;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(pipe.mutex);
      if (pipe.end >= pipe.next + window) return;
    }
    if (pipe.last_appended || pipe.last_epoch == std::numeric_limits<uint64_t>::max()) return;
    std::vector<std::vector<int64_t>> batches;
    try {
      batches = core.batches_of(pipe.last_epoch + 1);
    } catch (...) {
      pipe.last_appended = true;
      return;
    }
    if (batches.empty()) {
      pipe.last_appended = true;
      return;
    }
    pipe.append(pipe.last_epoch + 1, std::move(batches));
  }
}

}  // namespace

struct DataLoader::Epoch::Impl {
  std::shared_ptr<Core> core;
  std::shared_ptr<const Segment> seg;  // this epoch's batches
  int64_t start;
  int64_t next_;  // the next batch of this epoch to hand out
  bool begun = false;
  bool finished = false;
  Batch current;
  std::shared_ptr<Pipeline> pipe;  // null without workers; parked or let go when the range finishes

  Impl(std::shared_ptr<Core> c, std::shared_ptr<const Segment> s, int64_t first_batch, std::shared_ptr<Pipeline> p)
      : core(std::move(c)), seg(std::move(s)), start(first_batch), next_(first_batch), pipe(std::move(p)) {
    core->restart_stats();
  }

  int64_t end() const { return seg->count(); }

  // Batch `b` of this epoch from the workers (blocking), or loaded here without workers.
  Batch take(int64_t b) {
    if (!pipe) return core->load(*seg, b);
    const double timeout = core->options.timeout_s;
    std::optional<Pipeline::Loaded> r = pipe->take(seg->first + b, timeout);
    KILN_CHECK(r.has_value(), "DataLoader: batch ", b, " of epoch ", seg->epoch, " (samples ",
               seg->batches[static_cast<size_t>(b)], ") was not ready after timeout_s = ", timeout, " s; loading from ",
               core->dataset->describe(), " is stuck or slower than that (raise timeout_s, or 0 to wait forever)");
    if (r->error) std::rethrow_exception(r->error);
    return std::move(r->batch);
  }

  void handed_out(int64_t b) {
    next_ = b + 1;
    if (pipe) {
      pipe->handed_out(seg->first + b);
      look_ahead(*core, *pipe);
    }
  }

  // Hands out the next batch into `current`; false at the end of the epoch.
  bool advance() {
    if (finished) return false;
    if (next_ >= end()) {
      finish(/*at_end=*/true);
      return false;
    }
    const int64_t b = next_;
    const int64_t number = seg->first + b;  // in the pipeline's numbering
    // The wait recorded is all of this call's time on the consumer's thread: the wait for the workers and, with a
    // device, the loader's CUDA calls, which can block for long (up to 200 ms with nvJPEG decoding in the workers:
    // bench/results/2026-12-06j).
    const auto t0 = Clock::now();
    try {
      if (core->options.device && core->options.device->is_cuda()) {
        InFlight f;
        if (pipe && pipe->ahead && pipe->ahead->number == number) {
          f = std::move(*pipe->ahead);
          pipe->ahead.reset();
        } else {
          f = copy_to_device(*core, number, take(b));
        }
        handed_out(b);
        if (pipe) pipe->copy_ahead(number + 1);
        const cuda::Stream consumer = cuda::current_stream(core->options.device->index());
        f.done->wait(consumer);  // the consumer's stream waits on the GPU; the host does not
        for (size_t i = 0; i < f.batch.size(); ++i) cuda::record_stream(f.batch[i], consumer);
        current = std::move(f.batch);  // the previous batch's memory goes back to the allocator
      } else {
        Batch batch = take(b);
        handed_out(b);
        if (batch.ready) {  // fields made on a GPU: the consumer's stream waits for them, and keeps their memory
          const cuda::Stream consumer = cuda::current_stream();
          batch.ready->wait(consumer);
          for (size_t i = 0; i < batch.size(); ++i) {
            if (batch[i].device().is_cuda()) cuda::record_stream(batch[i], consumer);
          }
        }
        current = std::move(batch);
      }
    } catch (...) {
      finish(/*at_end=*/false);
      throw;
    }
    core->record_wait(seconds_since(t0));
    return true;
  }

  // Ends the range. At its end, a pipeline already loading the next epoch is parked for loader.epoch(e + 1);
  // otherwise (an error) it is let go, its threads joined once no one else holds it.
  void finish(bool at_end) {
    finished = true;
    std::shared_ptr<Pipeline> p = std::move(pipe);
    if (at_end && p && p->open && p->segment_at_next()) core->park(std::move(p));
  }
};

// ---- DataLoader ----

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : core_(std::make_shared<Core>()) {
  KILN_CHECK(dataset != nullptr, "DataLoader: the dataset is null");
  const int64_t n = dataset->size();
  KILN_CHECK(n > 0, "DataLoader: ", dataset->describe(), " is empty; there is nothing to load");
  KILN_CHECK(options.batch_size >= 1, "DataLoader: batch_size must be >= 1, got ", options.batch_size);
  KILN_CHECK(options.workers >= 0, "DataLoader: workers must be >= 0 (0 loads on the calling thread), got ",
             options.workers);
  KILN_CHECK(options.workers <= kMaxLoaderWorkers, "DataLoader: workers is ", options.workers, "; at most ",
             kMaxLoaderWorkers, " loading threads are allowed (this machine runs ", std::thread::hardware_concurrency(),
             " threads at once: a few per GPU is usual)");
  KILN_CHECK(options.prefetch_batches == -1 || options.prefetch_batches >= 1,
             "DataLoader: prefetch_batches must be >= 1 (or -1 for 2 per worker), got ", options.prefetch_batches);
  KILN_CHECK(std::isfinite(options.timeout_s) && options.timeout_s >= 0,
             "DataLoader: timeout_s must be a finite number of seconds >= 0 (0: no timeout), got ", options.timeout_s);
  KILN_CHECK(!(options.sampler && options.shuffle),
             "DataLoader: shuffle = true and a sampler were both given; the sampler decides the order (shuffle "
             "through the sampler, e.g. RandomSampler, and leave shuffle false)");
  if (options.prefetch_batches == -1) options.prefetch_batches = 2 * std::max(options.workers, 1);
  if (!options.sampler) {
    if (options.auto_distributed && distributed_env().world_size > 1) {
      options.sampler = std::make_shared<DistributedSampler>(
          n, DistributedSamplerOptions{.shuffle = options.shuffle, .seed = options.seed});
    } else if (options.shuffle) {
      options.sampler = std::make_shared<RandomSampler>(n, RandomSamplerOptions{.seed = options.seed});
    } else {
      options.sampler = std::make_shared<SequentialSampler>(n);
    }
  }
  if (options.device && options.device->is_cuda()) {
    const int index = options.device->index();
    KILN_CHECK(cuda::is_available(), "DataLoader: device ", options.device->str(),
               " was asked for, but CUDA is not available here (no GPU, or a build without CUDA); leave device unset");
    KILN_CHECK(index >= 0 && index < cuda::device_count(), "DataLoader: device ", options.device->str(),
               " does not exist; this machine has ", cuda::device_count(), " GPU(s)");
    core_->copy_stream = cuda::Stream::create(index);
  }
  core_->pinned = (options.pin_memory || core_->copy_stream.has_value()) && cuda::is_available();
  if (!options.collate) options.collate = dataset->collate_fn();
  core_->dataset = std::move(dataset);
  core_->options = std::move(options);
}

namespace {

// Breaks the cycle Core -> parked pipeline -> Core (joining the look-ahead's threads), and stops ranges that
// outlive the loader from parking.
void release(std::shared_ptr<DataLoader::Core>& core) noexcept {
  if (!core) return;
  std::shared_ptr<Pipeline> parked;
  {
    std::lock_guard<std::mutex> lock(core->park_mutex);
    core->loader_alive = false;
    parked = std::move(core->parked);
  }
  parked.reset();
  core.reset();
}

}  // namespace

DataLoader::~DataLoader() { release(core_); }
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&& other) noexcept {
  if (this != &other) {
    release(core_);
    core_ = std::move(other.core_);
  }
  return *this;
}

DataLoader::Epoch DataLoader::epoch(uint64_t epoch, int64_t start_batch) {
  const DataLoaderOptions& o = core_->options;
  // A look-ahead parked by the previous epoch's range: taken over by (epoch + 1, 0), else dropped here.
  if (std::shared_ptr<Pipeline> parked = core_->unpark()) {
    std::shared_ptr<const Segment> seg = start_batch == 0 ? parked->segment_at_next() : nullptr;
    if (seg && seg->epoch == epoch) {
      auto impl = std::make_unique<Epoch::Impl>(core_, seg, 0, parked);
      look_ahead(*core_, *parked);
      return Epoch(std::move(impl));
    }
  }  // not taken over: its threads are joined here, before this epoch's start
  auto seg = std::make_shared<Segment>();
  seg->epoch = epoch;
  seg->batches = core_->batches_of(epoch);
  const int64_t count = seg->count();
  KILN_CHECK(start_batch >= 0 && start_batch <= count, "DataLoader: start batch ", start_batch, " of epoch ", epoch,
             " is out of range; the epoch has ", count, " batches (start at 0..", count, ")");
  std::shared_ptr<Pipeline> pipe;
  if (o.workers > 0 && start_batch < count) {
    // No more threads than batches, unless they go on to the next epoch's.
    const int64_t threads = o.prefetch_next_epoch ? o.workers : std::min<int64_t>(o.workers, count - start_batch);
    pipe = std::make_shared<Pipeline>(core_, seg, start_batch, threads, o.prefetch_next_epoch);
  }
  auto impl = std::make_unique<Epoch::Impl>(core_, std::move(seg), start_batch, pipe);
  if (pipe) look_ahead(*core_, *pipe);
  return Epoch(std::move(impl));
}

int64_t DataLoader::size() const {
  return num_batches(core_->options.sampler->size(), core_->options.batch_size, core_->options.drop_last);
}
LoaderStats DataLoader::stats() const { return core_->read_stats(); }
const Dataset& DataLoader::dataset() const { return *core_->dataset; }
const Sampler& DataLoader::sampler() const { return *core_->options.sampler; }
const DataLoaderOptions& DataLoader::options() const { return core_->options; }

// ---- DataLoader::Epoch ----

DataLoader::Epoch::Epoch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DataLoader::Epoch::Epoch(Epoch&&) noexcept = default;
DataLoader::Epoch& DataLoader::Epoch::operator=(Epoch&&) noexcept = default;
DataLoader::Epoch::~Epoch() = default;

DataLoader::Epoch::iterator DataLoader::Epoch::begin() {
  KILN_CHECK(impl_ != nullptr, "DataLoader::Epoch: this range was moved from");
  KILN_CHECK(!impl_->begun,
             "DataLoader::Epoch: begin() was already called; an epoch range is iterated once "
             "(call loader.epoch(e) again for another pass)");
  impl_->begun = true;
  impl_->advance();
  return iterator(this);
}

int64_t DataLoader::Epoch::size() const { return impl_->end() - impl_->start; }
LoaderPosition DataLoader::Epoch::position() const { return {impl_->seg->epoch, impl_->next_}; }
LoaderStats DataLoader::Epoch::stats() const { return impl_->core->read_stats(); }

Batch& DataLoader::Epoch::iterator::operator*() const { return epoch_->impl_->current; }
DataLoader::Epoch::iterator& DataLoader::Epoch::iterator::operator++() {
  epoch_->impl_->advance();
  return *this;
}
bool DataLoader::Epoch::iterator::done() const { return epoch_->impl_->finished; }

}  // namespace kiln::data
