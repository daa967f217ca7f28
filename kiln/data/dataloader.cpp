// kiln/data/dataloader.cpp — worker threads, the bounded prefetch window, in-order delivery, the copy stream.
//
// Workers take batch numbers in order, at most prefetch_batches past the batch the consumer has reached,
// and leave the collated batch (or the error) in `ready`, keyed by number; the consumer takes them in order.
// For device delivery every CUDA call happens on the consumer's thread: when batch k is handed out, batch
// k+1 (if loaded) is copied on the copy stream, so its copy overlaps the consumer's work on batch k.
#include "kiln/data/dataloader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <string>
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

struct DataLoader::Core {
  std::shared_ptr<const Dataset> dataset;
  DataLoaderOptions options;
  bool pinned = false;                      // collate into page-locked memory
  std::optional<cuda::Stream> copy_stream;  // device delivery
  mutable std::mutex stats_mutex;
  Clock::time_point epoch_start = Clock::now();
  LoaderStats stats;

  LoaderStats read_stats() const {
    std::lock_guard<std::mutex> lock(stats_mutex);
    LoaderStats s = stats;
    s.elapsed_s = seconds_since(epoch_start);
    s.wait_fraction = s.elapsed_s > 0 ? std::min(1.0, s.total_wait_s / s.elapsed_s) : 0;
    return s;
  }
};

struct DataLoader::Epoch::Impl {
  // A batch copied (or being copied) to the device: ready once `done` has happened on the copy stream.
  struct InFlight {
    int64_t number = -1;
    Batch batch;
    std::unique_ptr<cuda::Event> done;
  };
  struct Loaded {
    Batch batch;
    std::exception_ptr error;
  };

  std::shared_ptr<Core> core;
  uint64_t epoch;
  std::vector<std::vector<int64_t>> batches;  // every batch of the epoch, as dataset indices
  int64_t start;
  bool begun = false;
  bool finished = false;
  Batch current;
  std::optional<InFlight> ahead;  // batch next_ already on its way to the device

  std::mutex mutex;  // guards what follows, shared with the workers
  std::condition_variable work_cv, ready_cv;
  int64_t next_;     // the next batch to hand out
  int64_t dispatch;  // the next batch a worker takes
  bool stop = false;
  std::map<int64_t, Loaded> ready;
  std::vector<std::thread> threads;

  Impl(std::shared_ptr<Core> c, uint64_t e, std::vector<std::vector<int64_t>> b, int64_t s)
      : core(std::move(c)), epoch(e), batches(std::move(b)), start(s), next_(s), dispatch(s) {
    {
      std::lock_guard<std::mutex> lock(core->stats_mutex);
      core->stats = {};
      core->epoch_start = Clock::now();
    }
    try {
      // No more threads than batches (counted before any starts: the workers advance `dispatch`).
      const int64_t count = std::min<int64_t>(core->options.workers, end() - start);
      for (int64_t w = 0; w < count; ++w) threads.emplace_back([this] { work(); });
    } catch (...) {
      shut_down();
      throw;
    }
  }
  ~Impl() { shut_down(); }

  int64_t end() const { return static_cast<int64_t>(batches.size()); }

  Batch load(int64_t number) const {
    const Dataset& ds = *core->dataset;
    const std::vector<int64_t>& idx = batches[static_cast<size_t>(number)];
    std::vector<Example> examples;
    examples.reserve(idx.size());
    for (int64_t i : idx) {
      try {
        SampleRng rng(core->options.seed, epoch, i);
        examples.push_back(ds.get(i, rng));
      } catch (...) {
        KILN_FAIL("DataLoader: loading sample ", i, " (batch ", number, " of epoch ", epoch, ") from ", ds.describe(),
                  " failed: ", what_of(std::current_exception()));
      }
    }
    Batch batch;
    try {
      std::optional<cuda::DeviceGuard> device_guard;  // a collate that works on the GPU works on the loader's
      if (core->options.device && core->options.device->is_cuda()) device_guard.emplace(core->options.device->index());
      batch = core->options.collate ? core->options.collate(examples, core->pinned) : collate(examples, core->pinned);
    } catch (...) {
      KILN_FAIL("DataLoader: collating batch ", number, " of epoch ", epoch, " (samples ", idx, ") from ",
                ds.describe(), " failed: ", what_of(std::current_exception()));
    }
    batch.indices = idx;
    return batch;
  }

  void work() {
    const int64_t window = core->options.prefetch_batches;
    for (;;) {
      int64_t number;
      {
        std::unique_lock<std::mutex> lock(mutex);
        work_cv.wait(lock, [&] { return stop || dispatch >= end() || dispatch < next_ + window; });
        if (stop || dispatch >= end()) return;
        number = dispatch++;
      }
      Loaded r;
      try {
        r.batch = load(number);
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

  // Batch `number` from the workers (blocking), or loaded here without workers.
  Batch take(int64_t number) {
    if (threads.empty()) return load(number);
    std::unique_lock<std::mutex> lock(mutex);
    auto has = [&] { return ready.count(number) > 0; };
    const double timeout = core->options.timeout_s;
    if (timeout > 0) {
      const auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout));
      KILN_CHECK(ready_cv.wait_for(lock, limit, has), "DataLoader: batch ", number, " of epoch ", epoch, " (samples ",
                 batches[static_cast<size_t>(number)], ") was not ready after timeout_s = ", timeout,
                 " s; loading from ", core->dataset->describe(),
                 " is stuck or slower than that (raise timeout_s, or 0 to wait forever)");
    } else {
      ready_cv.wait(lock, has);
    }
    auto it = ready.find(number);
    Loaded r = std::move(it->second);
    ready.erase(it);
    if (r.error) std::rethrow_exception(r.error);
    return std::move(r.batch);
  }

  // Starts the host-to-device copy of a pinned batch on the copy stream. The host batch is released while
  // the copy stream is current, so the pinned allocator reuses its memory only after the copy.
  InFlight copy_to_device(int64_t number, Batch host) {
    const Device dev = *core->options.device;
    cuda::DeviceGuard device_guard(dev.index());
    cuda::StreamGuard stream_guard(*core->copy_stream);
    InFlight f;
    f.number = number;
    if (host.ready) host.ready->wait(*core->copy_stream);  // fields the collate made on the GPU
    f.batch = host.to(dev, /*non_blocking=*/true);
    f.done = std::make_unique<cuda::Event>();
    f.done->record(*core->copy_stream);
    host = Batch();
    return f;
  }

  // Copies batch `number` ahead if a worker has it ready (never waits).
  void copy_ahead(int64_t number) {
    if (threads.empty() || number >= end()) return;
    Batch host;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = ready.find(number);
      if (it == ready.end() || it->second.error) return;
      host = std::move(it->second.batch);
      ready.erase(it);
    }
    ahead = copy_to_device(number, std::move(host));
  }

  void record_wait(double wait) {
    std::lock_guard<std::mutex> lock(core->stats_mutex);
    core->stats.last_wait_s = wait;
    core->stats.total_wait_s += wait;
    core->stats.batches += 1;
  }

  void handed_out(int64_t number) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      next_ = number + 1;
    }
    work_cv.notify_all();
  }

  // Hands out the next batch into `current`; false at the end of the epoch.
  bool advance() {
    if (finished) return false;
    if (next_ >= end()) {
      shut_down();
      return false;
    }
    const int64_t number = next_;
    try {
      if (core->options.device && core->options.device->is_cuda()) {
        InFlight f;
        if (ahead && ahead->number == number) {
          f = std::move(*ahead);
          ahead.reset();
          record_wait(0);
        } else {
          const auto t0 = Clock::now();
          Batch host = take(number);
          record_wait(seconds_since(t0));
          f = copy_to_device(number, std::move(host));
        }
        handed_out(number);
        copy_ahead(number + 1);
        const cuda::Stream consumer = cuda::current_stream(core->options.device->index());
        f.done->wait(consumer);  // the consumer's stream waits on the GPU; the host does not
        for (size_t i = 0; i < f.batch.size(); ++i) cuda::record_stream(f.batch[i], consumer);
        current = std::move(f.batch);
      } else {
        const auto t0 = Clock::now();
        Batch b = take(number);
        record_wait(seconds_since(t0));
        handed_out(number);
        if (b.ready) {  // fields made on a GPU: the consumer's stream waits for them, and keeps their memory
          const cuda::Stream consumer = cuda::current_stream();
          b.ready->wait(consumer);
          for (size_t i = 0; i < b.size(); ++i) {
            if (b[i].device().is_cuda()) cuda::record_stream(b[i], consumer);
          }
        }
        current = std::move(b);
      }
    } catch (...) {
      shut_down();
      throw;
    }
    return true;
  }

  // Stops and joins the workers and drops what they loaded; idempotent, never throws.
  void shut_down() noexcept {
    finished = true;
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

// ---- DataLoader ----

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : core_(std::make_shared<Core>()) {
  KILN_CHECK(dataset != nullptr, "DataLoader: the dataset is null");
  const int64_t n = dataset->size();
  KILN_CHECK(n > 0, "DataLoader: ", dataset->describe(), " is empty; there is nothing to load");
  KILN_CHECK(options.batch_size >= 1, "DataLoader: batch_size must be >= 1, got ", options.batch_size);
  KILN_CHECK(options.workers >= 0, "DataLoader: workers must be >= 0 (0 loads on the calling thread), got ",
             options.workers);
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

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

DataLoader::Epoch DataLoader::epoch(uint64_t epoch, int64_t start_batch) {
  const DataLoaderOptions& o = core_->options;
  std::vector<int64_t> indices = o.sampler->indices(epoch);
  const int64_t n = core_->dataset->size();
  for (size_t i = 0; i < indices.size(); ++i) {
    KILN_CHECK(indices[i] >= 0 && indices[i] < n, "DataLoader: the sampler gave index ", indices[i], " (position ", i,
               " of epoch ", epoch, ") but ", core_->dataset->describe(), " has ", n, " samples (indices 0..", n - 1,
               ")");
  }
  auto batches = batch_indices(indices, o.batch_size, o.drop_last);
  const int64_t count = static_cast<int64_t>(batches.size());
  KILN_CHECK(start_batch >= 0 && start_batch <= count, "DataLoader: start batch ", start_batch, " of epoch ", epoch,
             " is out of range; the epoch has ", count, " batches (start at 0..", count, ")");
  return Epoch(std::make_unique<Epoch::Impl>(core_, epoch, std::move(batches), start_batch));
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
LoaderPosition DataLoader::Epoch::position() const { return {impl_->epoch, impl_->next_}; }
LoaderStats DataLoader::Epoch::stats() const { return impl_->core->read_stats(); }

Batch& DataLoader::Epoch::iterator::operator*() const { return epoch_->impl_->current; }
DataLoader::Epoch::iterator& DataLoader::Epoch::iterator::operator++() {
  epoch_->impl_->advance();
  return *this;
}
bool DataLoader::Epoch::iterator::done() const { return epoch_->impl_->finished; }

}  // namespace kiln::data
