// The DataLoader on the CPU: order, determinism, resume, errors, timeouts, thread shutdown, wait time.
#include <gtest/gtest.h>
#include <sys/resource.h>  // setrlimit
#include <sys/wait.h>      // waitpid
#include <unistd.h>        // fork, alarm, sysconf

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kiln/data/dataloader.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using data::Batch;
using data::DataLoader;
using std::vector;

// Sample i: x = [i, u] (u: the first draw of the sample's SampleRng), y = i. Counts its loads, remembers the
// largest index loaded and which loads have finished; may sleep, or fail at one index.
class Numbers : public data::Dataset {
 public:
  explicit Numbers(int64_t n, int sleep_ms = 0) : n_(n), sleep_ms_(sleep_ms) {}
  int64_t size() const override { return n_; }
  std::string describe() const override { return "Numbers(" + std::to_string(n_) + ")"; }
  data::Example get(int64_t i, data::SampleRng& rng) const override {
    int64_t seen = max_index.load();  // before the count: a waiter that sees n loads sees their largest index
    while (i > seen && !max_index.compare_exchange_weak(seen, i)) {
    }
    {
      std::lock_guard<std::mutex> lock(loads_mutex_);
      loads.fetch_add(1);
    }
    loads_cv_.notify_all();
    if (sleep_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    if (i == slow_index) std::this_thread::sleep_for(std::chrono::milliseconds(kSlowLoadMs));
    if (i != fail_index) {
      {
        std::lock_guard<std::mutex> lock(loads_mutex_);
        finished_.insert(i);
      }
      loads_cv_.notify_all();
    }
    if (i == fail_index) {
      {
        std::lock_guard<std::mutex> lock(loads_mutex_);
        failures.fetch_add(1);
      }
      loads_cv_.notify_all();
      throw std::runtime_error("corrupt record in shard 3");
    }
    return {{"x", make({double(i), rng.uniform()}, {2}, {.dtype = DType::Float64})}, {"y", internal::scalar_tensor(i)}};
  }
  mutable std::atomic<int64_t> loads{0};
  mutable std::atomic<int64_t> max_index{-1};
  mutable std::atomic<int64_t> failures{0};
  std::atomic<int64_t> fail_index{-1};
  std::atomic<int64_t> slow_index{-1};
  static constexpr int kSlowLoadMs = 2500;  // the load of slow_index

  // Waits until at least `n` loads have begun: true, or false after `timeout_s`.
  bool wait_for_loads(int64_t n, double timeout_s = 20) const {
    std::unique_lock<std::mutex> lock(loads_mutex_);
    return loads_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return loads.load() >= n; });
  }
  // Waits until the load of sample `i` has returned (at least once).
  bool wait_until_loaded(int64_t i, double timeout_s = 20) const {
    std::unique_lock<std::mutex> lock(loads_mutex_);
    return loads_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return finished_.count(i) > 0; });
  }
  // Waits until at least `n` loads have failed (at fail_index).
  bool wait_for_failures(int64_t n, double timeout_s = 20) const {
    std::unique_lock<std::mutex> lock(loads_mutex_);
    return loads_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return failures.load() >= n; });
  }

 private:
  mutable std::mutex loads_mutex_;
  mutable std::condition_variable loads_cv_;
  mutable std::set<int64_t> finished_;  // samples whose load returned
  int64_t n_;
  int sleep_ms_;
};

// Every batch of an epoch: (indices, x values).
struct Seen {
  vector<vector<int64_t>> indices;
  vector<vector<double>> x;
  vector<vector<int64_t>> y;
};
Seen run(DataLoader& loader, uint64_t epoch, int64_t start = 0) {
  Seen s;
  for (Batch& b : loader.epoch(epoch, start)) {
    s.indices.push_back(b.indices);
    s.x.push_back(b["x"].to_vector<double>());
    s.y.push_back(b["y"].to_vector<int64_t>());
  }
  return s;
}

TEST(DataLoader, BatchesInSamplerOrderForAnyWorkerCount) {
  auto ds = std::make_shared<Numbers>(10);
  for (int workers : {0, 1, 4}) {
    DataLoader loader(ds, {.batch_size = 3, .workers = workers});
    EXPECT_EQ(loader.size(), 4);
    const Seen s = run(loader, 0);
    EXPECT_EQ(s.indices, (vector<vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9}})) << workers << " workers";
    EXPECT_EQ(s.y, s.indices);
    ASSERT_EQ(s.x.size(), 4u);
    EXPECT_EQ(s.x[3].size(), 2u);  // the last batch: one sample of shape [2]
    EXPECT_EQ(s.x[3][0], 9.0);
  }
}

TEST(DataLoader, SameSeedAndEpochSameBatchesForAnyWorkerCount) {
  auto ds = std::make_shared<Numbers>(37);
  vector<Seen> runs;
  for (int workers : {0, 1, 3, 8}) {
    DataLoader loader(ds, {.batch_size = 4, .workers = workers, .shuffle = true, .seed = 5});
    runs.push_back(run(loader, 2));
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    EXPECT_EQ(runs[r].indices, runs[0].indices);
    EXPECT_EQ(runs[r].x, runs[0].x);  // also the random draws: SampleRng(seed, epoch, index)
  }
  // The order is RandomSampler's with the same seed.
  const auto order = data::RandomSampler(37, {.seed = 5}).indices(2);
  EXPECT_EQ(runs[0].indices, data::batch_indices(order, 4, false));
  // Another epoch shuffles differently (and draws differently); the same epoch again repeats.
  DataLoader loader(ds, {.batch_size = 4, .workers = 2, .shuffle = true, .seed = 5});
  const Seen e3 = run(loader, 3);
  EXPECT_NE(e3.indices, runs[0].indices);
  EXPECT_EQ(run(loader, 2).x, runs[0].x);
  DataLoader other_seed(ds, {.batch_size = 4, .workers = 2, .shuffle = true, .seed = 6});
  EXPECT_NE(run(other_seed, 2).indices, runs[0].indices);
}

TEST(DataLoader, DropLast) {
  auto ds = std::make_shared<Numbers>(10);
  for (int workers : {0, 2}) {
    DataLoader loader(ds, {.batch_size = 3, .workers = workers, .drop_last = true});
    EXPECT_EQ(loader.size(), 3);
    EXPECT_EQ(run(loader, 0).indices, (vector<vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}}));
  }
}

TEST(DataLoader, ResumesMidEpochWithoutLoadingSkippedBatches) {
  auto ds = std::make_shared<Numbers>(20);
  for (int workers : {0, 3}) {
    // Without the look-ahead into epoch 5, which would add its loads to the count below.
    DataLoader loader(ds,
                      {.batch_size = 4, .workers = workers, .shuffle = true, .seed = 1, .prefetch_next_epoch = false});
    const Seen full = run(loader, 4);
    ds->loads = 0;
    auto range = loader.epoch(data::LoaderPosition{4, 3});
    EXPECT_EQ(range.size(), 2);
    EXPECT_EQ(range.position(), (data::LoaderPosition{4, 3}));
    vector<data::LoaderPosition> positions;
    Seen rest;
    for (Batch& b : range) {
      rest.indices.push_back(b.indices);
      rest.x.push_back(b["x"].to_vector<double>());
      positions.push_back(range.position());
    }
    EXPECT_EQ(ds->loads.load(), 8) << "only the last two batches are loaded";
    EXPECT_EQ(rest.indices, vector<vector<int64_t>>(full.indices.begin() + 3, full.indices.end()));
    EXPECT_EQ(rest.x, vector<vector<double>>(full.x.begin() + 3, full.x.end()));
    EXPECT_EQ(positions, (vector<data::LoaderPosition>{{4, 4}, {4, 5}}));
    EXPECT_EQ(run(loader, 4, 5).indices.size(), 0u);  // resuming at the end: nothing left
    expect_error([&] { loader.epoch(4, 6); }, {"start batch 6", "5 batches"});
  }
}

TEST(DataLoader, WorkerErrorNamesSampleAndDatasetAndLoaderStaysUsable) {
  auto ds = std::make_shared<Numbers>(12);
  for (int workers : {0, 1, 3}) {
    DataLoader loader(ds, {.batch_size = 2, .workers = workers});
    const int before = thread_count();
    ds->fail_index = 7;
    vector<vector<int64_t>> got;
    expect_error(
        [&] {
          for (Batch& b : loader.epoch(0)) got.push_back(b.indices);
        },
        {"corrupt record in shard 3", "sample 7", "batch 3 of epoch 0", "Numbers(12)"});
    EXPECT_EQ(got, (vector<vector<int64_t>>{{0, 1}, {2, 3}, {4, 5}})) << "batches before the failure arrive";
    EXPECT_EQ(thread_count(), before);
    ds->fail_index = -1;
    EXPECT_EQ(run(loader, 1).indices.size(), 6u);
  }
}

// Sample i of `n`: x = i repeated, 3 values, except sample `odd`, which has 4.
class Ragged : public data::Dataset {
 public:
  Ragged(int64_t n, int64_t odd) : n_(n), odd_(odd) {}
  int64_t size() const override { return n_; }
  std::string describe() const override { return "Ragged(" + std::to_string(n_) + ")"; }
  data::Example get(int64_t i, data::SampleRng&) const override {
    return {{"x", internal::full({i == odd_ ? 4 : 3}, double(i))}};
  }

 private:
  int64_t n_, odd_;
};

TEST(DataLoader, SamplesCopiedIntoTheirBatchAsTheyLoadAndMismatchesNamed) {
  for (int workers : {0, 2}) {
    DataLoader good(std::make_shared<Ragged>(8, -1), {.batch_size = 4, .workers = workers});
    vector<double> values;
    for (Batch& b : good.epoch(0)) {
      EXPECT_EQ(b["x"].shape(), (Shape{4, 3}));
      for (double v : b["x"].to(DType::Float64).to_vector<double>()) values.push_back(v);
    }
    vector<double> want;
    for (int i = 0; i < 8; ++i) want.insert(want.end(), 3, double(i));
    EXPECT_EQ(values, want);
    DataLoader bad(std::make_shared<Ragged>(8, 6), {.batch_size = 4, .workers = workers});
    expect_error(
        [&] {
          for (Batch& b : bad.epoch(0)) (void)b;
        },
        {"collating batch 1 of epoch 0", "Ragged(8)", "field 'x' of sample 2", "[4]", "[3]", "same shape"});
  }
}

TEST(DataLoader, TimeoutNamesTheBatch) {
  auto ds = std::make_shared<Numbers>(6);
  // Batch 1's load takes 2.5 s, five times the timeout; batch 0 has the whole timeout to arrive, however busy the
  // machine is.
  ds->slow_index = 3;
  DataLoader loader(ds, {.batch_size = 2, .workers = 2, .timeout_s = 0.5});
  const int before = thread_count();
  vector<vector<int64_t>> got;
  expect_error(
      [&] {
        for (Batch& b : loader.epoch(0)) got.push_back(b.indices);
      },
      {"batch 1 of epoch 0", "samples [2, 3]", "timeout_s = 0.5", "Numbers(6)"});
  EXPECT_EQ(got.size(), 1u);
  EXPECT_EQ(thread_count(), before);  // the stuck worker was joined once its load returned
  ds->slow_index = -1;
  EXPECT_EQ(run(loader, 0).indices.size(), 3u);
}

TEST(DataLoader, NoThreadOutlivesItsEpoch) {
  auto ds = std::make_shared<Numbers>(200, 1);
  {
    DataLoader warm(ds, {.batch_size = 2, .workers = 2});
    run(warm, 0);  // anything started lazily by the tensor library starts now
  }
  const int before = thread_count();
  {
    DataLoader loader(ds, {.batch_size = 2, .workers = 6});
    int n = 0;
    for (Batch& b : loader.epoch(0)) {
      (void)b;
      if (++n == 2) {
        EXPECT_GT(thread_count(), before) << "the workers run during the epoch";
        break;  // the range is destroyed here: workers stopped and joined
      }
    }
    EXPECT_EQ(thread_count(), before);
    auto unused = loader.epoch(1);  // started, never iterated
    auto second = loader.epoch(2);
    EXPECT_GT(thread_count(), before);
  }  // ranges destroyed, then the loader
  EXPECT_EQ(thread_count(), before);
  // A range may outlive its loader.
  std::optional<DataLoader::Epoch> range;
  {
    DataLoader loader(ds, {.batch_size = 50, .workers = 2});
    range.emplace(loader.epoch(0));
  }
  int batches = 0;
  for (Batch& b : *range) batches += b.batch_size() == 50;
  EXPECT_EQ(batches, 4);
  range.reset();
  EXPECT_EQ(thread_count(), before);
}

TEST(DataLoader, PrefetchWindowIsBounded) {
  auto ds = std::make_shared<Numbers>(100);
  DataLoader loader(ds, {.batch_size = 1, .workers = 4, .prefetch_batches = 3});
  auto range = loader.epoch(0);
  auto it = range.begin();  // batch 0 handed out: batches 1..3 may load, not 4
  // Once batches 0..3 have begun loading, a loader that ignored the bound would start batch 4 at once; the pause
  // gives it the time to (it cannot fail a loader that keeps the bound, however slow the machine).
  ASSERT_TRUE(ds->wait_for_loads(4)) << ds->loads.load() << " loads";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(ds->max_index.load(), 3);
  EXPECT_EQ(ds->loads.load(), 4);
  ++it;
  ASSERT_TRUE(ds->wait_for_loads(5)) << ds->loads.load() << " loads";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(ds->max_index.load(), 4);
  EXPECT_EQ(ds->loads.load(), 5);
  EXPECT_EQ(it->indices, vector<int64_t>{1});
}

// The wait the stats report is the time the loop spent in the loader. The bounds hold on a machine however
// loaded: sleeps only get longer, and where data keeps up the loop itself waits until the next sample is loaded.
TEST(DataLoader, WaitTimeShowsWhetherDataKeepsUp) {
  // No workers and no compute: the loop waits for every 50 ms load, and does nothing else.
  auto slow = std::make_shared<Numbers>(6, 50);
  DataLoader serial(slow, {.batch_size = 1});
  run(serial, 0);
  data::LoaderStats s = serial.stats();
  EXPECT_EQ(s.batches, 6);
  EXPECT_GE(s.total_wait_s, 6 * 0.05 * 0.99);
  EXPECT_GE(s.last_wait_s, 0.05 * 0.99);
  EXPECT_LE(s.total_wait_s, s.elapsed_s);
  EXPECT_GT(s.wait_fraction, 0.5) << s.total_wait_s << " of " << s.elapsed_s;
  // Eight workers feed a loop that, for each batch, waits until the next sample has been loaded and then computes
  // 30 ms: after the first batch the data is always there before it is asked for.
  auto fed = std::make_shared<Numbers>(16, 20);
  DataLoader parallel(fed, {.batch_size = 1, .workers = 8});
  auto range = parallel.epoch(0);
  int64_t i = 0;
  for (Batch& b : range) {
    (void)b;
    if (i + 1 < 16) {
      ASSERT_TRUE(fed->wait_until_loaded(i + 1)) << "sample " << i + 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ++i;
  }
  s = range.stats();
  EXPECT_EQ(s.batches, 16);
  EXPECT_GE(s.elapsed_s, 16 * 0.03 * 0.99);
  EXPECT_LT(s.wait_fraction, 0.5) << s.total_wait_s << " of " << s.elapsed_s;
}

// The workers' time, split between loading samples and collating them: each sample sleeps 10 ms, each collate
// 25 ms, so 4 batches of 3 samples take at least 120 ms of loading and 100 ms of collating (sleeps only get longer);
// with the default collate, the collating is what the samples' loads leave (at least 0).
TEST(DataLoader, StatsSplitTheWorkersTimeBetweenSamplesAndCollate) {
  auto ds = std::make_shared<Numbers>(12, 10);
  data::CollateFn slow_collate = [](const vector<data::Example>& xs, bool pinned) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    return data::collate(xs, pinned);
  };
  for (bool custom : {false, true}) {
    DataLoader loader(ds, {.batch_size = 3, .workers = 2, .collate = custom ? slow_collate : data::CollateFn()});
    auto range = loader.epoch(0);
    for (Batch& b : range) (void)b;
    const data::LoaderStats s = range.stats();
    EXPECT_EQ(s.batches_loaded, 4) << (custom ? "custom collate" : "default collate");
    EXPECT_GE(s.samples_s, 12 * 0.010 * 0.99);
    EXPECT_GE(s.collate_s, custom ? 4 * 0.025 * 0.99 : 0.0);
    if (!custom) {
      EXPECT_LT(s.collate_s, s.samples_s);  // copying 12 small samples takes far less than their 120 ms of sleep
    }
  }
}

TEST(DataLoader, ClearErrorsForBadOptions) {
  auto ds = std::make_shared<Numbers>(10);
  expect_error([&] { DataLoader(ds, {.batch_size = 0}); }, {"batch_size must be >= 1", "0"});
  expect_error([&] { DataLoader(ds, {.workers = -2}); }, {"workers must be >= 0", "-2"});
  expect_error([&] { DataLoader(ds, {.prefetch_batches = 0}); }, {"prefetch_batches"});
  expect_error([&] { DataLoader(ds, {.timeout_s = -1}); }, {"timeout_s"});
  expect_error([&] { DataLoader(std::make_shared<Numbers>(0)); }, {"Numbers(0) is empty"});
  expect_error([&] { DataLoader(nullptr); }, {"dataset is null"});
  auto big = std::make_shared<data::SequentialSampler>(13);
  expect_error([&] { DataLoader(ds, {.shuffle = true, .sampler = big}); }, {"shuffle", "sampler"});
  DataLoader loader(ds, {.batch_size = 4, .sampler = big});
  EXPECT_EQ(loader.size(), 4);
  expect_error([&] { loader.epoch(0); }, {"index 10", "position 10", "Numbers(10) has 10 samples"});
  DataLoader ok(ds);
  auto range = ok.epoch(0);
  range.begin();
  expect_error([&] { range.begin(); }, {"begin() was already called"});
  if (!cuda::is_available()) {
    expect_error([&] { DataLoader(ds, {.device = Device::cuda(0)}); }, {"cuda:0", "CUDA is not available"});
  }
}

// An absurd worker count is refused up front, naming the limit; a count the system cannot start (thread creation
// fails: here a child process whose address space is capped) is a kiln::Error naming the workers and the OS error,
// not a bare std::system_error.
TEST(DataLoader, WorkerCountsBeyondWhatTheSystemCanStart) {
  auto ds = std::make_shared<Numbers>(10);
  expect_error([&] { DataLoader(ds, {.workers = 100000}); }, {"workers is 100000", "at most 1024 loading threads"});
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the address-space cap below would break the sanitizer's own memory";
#else
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(30);  // a hang ends the child (status: not 0)
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) pages = 0;
      std::fclose(f);
    }
    if (pages <= 0) ::_exit(4);
    // Room for a few 8 MiB thread stacks, not for 1000.
    const rlim_t cap = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (64u << 20);
    const rlimit limit{cap, cap};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(5);
    try {
      DataLoader loader(std::make_shared<Numbers>(5000), {.batch_size = 1, .workers = 1000});
      for (auto& batch : loader.epoch(0)) (void)batch;
      ::_exit(3);  // every thread started: the cap did not bite
    } catch (const Error& e) {
      const std::string what = e.what();
      const bool ok = what.find("DataLoader: could not start loading thread") != std::string::npos &&
                      what.find(" of 1000 (") != std::string::npos &&
                      what.find("use fewer workers") != std::string::npos;
      if (!ok) std::fprintf(stderr, "unexpected message: %s\n", what.c_str());
      ::_exit(ok ? 0 : 1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "not a kiln::Error: %s\n", e.what());
      ::_exit(2);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: wrong message, 2: not a kiln::Error, 3: no failure, 4/5: setup";
#endif
}

TEST(DataLoader, CustomSamplerCollateAndCpuOptions) {
  auto ds = std::make_shared<Numbers>(10);
  auto weighted = std::make_shared<data::WeightedRandomSampler>(vector<double>{0, 0, 1, 0, 0, 0, 0, 0, 0, 1}, 6);
  data::CollateFn collate = [](const vector<data::Example>& xs, bool pinned) {
    Batch b = data::collate(xs, pinned);
    b.add("count", internal::scalar_tensor(int64_t(xs.size())));
    return b;
  };
  // pin_memory and device cpu are no-ops without a GPU; with one, batches are pinned.
  DataLoader loader(ds, {.batch_size = 3,
                         .workers = 2,
                         .pin_memory = true,
                         .sampler = weighted,
                         .device = Device::cpu(),
                         .collate = collate});
  EXPECT_EQ(loader.size(), 2);
  for (Batch& b : loader.epoch(0)) {
    EXPECT_EQ(b["count"].item<int64_t>(), 3);
    for (int64_t i : b.indices) EXPECT_TRUE(i == 2 || i == 9);
    EXPECT_EQ(b["y"].to_vector<int64_t>(), b.indices);
    EXPECT_EQ(b["x"].is_pinned(), cuda::is_available());
    Batch copy = b.to(Device::cpu(), true);  // users who move batches themselves
    EXPECT_EQ(copy["y"].to_vector<int64_t>(), b.indices);
  }
}

// ---- Loading across epoch boundaries (prefetch_next_epoch) ----

// Batches of epochs first..last from fresh loaders, one per epoch, without the look-ahead.
vector<Seen> fresh_epochs(std::shared_ptr<Numbers> ds, data::DataLoaderOptions o, uint64_t first, uint64_t last) {
  o.prefetch_next_epoch = false;
  vector<Seen> out;
  for (uint64_t e = first; e <= last; ++e) {
    DataLoader loader(ds, o);
    out.push_back(run(loader, e));
  }
  return out;
}

TEST(DataLoaderLookAhead, EpochsBackToBackEqualFreshLoaders) {
  auto ds = std::make_shared<Numbers>(23);
  const data::DataLoaderOptions base{.batch_size = 4, .shuffle = true, .seed = 9, .prefetch_next_epoch = true};
  const vector<Seen> expect = fresh_epochs(ds, base, 0, 2);
  for (auto [workers, prefetch] : vector<std::pair<int, int64_t>>{{1, 1}, {1, -1}, {2, 1}, {2, 3}, {3, 5}, {4, -1}}) {
    data::DataLoaderOptions o = base;
    o.workers = workers;
    o.prefetch_batches = prefetch;
    for (bool drop_last : {false, true}) {
      o.drop_last = drop_last;
      const vector<Seen> want = drop_last ? fresh_epochs(ds, o, 0, 2) : expect;
      DataLoader loader(ds, o);
      for (uint64_t e = 0; e <= 2; ++e) {
        auto range = loader.epoch(e);
        EXPECT_EQ(range.size(), int64_t(want[e].indices.size()));
        Seen got;
        vector<data::LoaderPosition> positions;
        for (Batch& b : range) {
          got.indices.push_back(b.indices);
          got.x.push_back(b["x"].to_vector<double>());
          got.y.push_back(b["y"].to_vector<int64_t>());
          positions.push_back(range.position());
        }
        const std::string where = std::to_string(workers) + " workers, prefetch " + std::to_string(prefetch) +
                                  (drop_last ? ", drop_last" : "") + ", epoch " + std::to_string(e);
        EXPECT_EQ(got.indices, want[e].indices) << where;
        EXPECT_EQ(got.x, want[e].x) << where;  // also the random draws: SampleRng(seed, epoch, index)
        EXPECT_EQ(got.y, want[e].y) << where;
        ASSERT_EQ(positions.size(), got.indices.size()) << where;
        for (size_t k = 0; k < positions.size(); ++k)
          EXPECT_EQ(positions[k], (data::LoaderPosition{e, int64_t(k) + 1}));
        EXPECT_EQ(range.stats().batches, int64_t(got.indices.size())) << "stats restart with each epoch";
      }
    }
  }
}

// 0..n-1 in epochs 0 and 1; from epoch 2 on an index out of range (the loader refuses that epoch).
class TwoEpochs : public data::Sampler {
 public:
  explicit TwoEpochs(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  vector<int64_t> indices(uint64_t epoch) const override {
    vector<int64_t> v(static_cast<size_t>(n_));
    std::iota(v.begin(), v.end(), epoch >= 2 ? 1 : 0);
    return v;
  }

 private:
  int64_t n_;
};

// 0..n-1 every epoch, but working out an epoch after the first takes `sleep_ms`: the loader's look-ahead asks for
// it on the training loop's thread.
class SlowLaterEpochs : public data::Sampler {
 public:
  SlowLaterEpochs(int64_t n, int sleep_ms) : n_(n), sleep_ms_(sleep_ms) {}
  int64_t size() const override { return n_; }
  vector<int64_t> indices(uint64_t epoch) const override {
    if (epoch >= 1) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    vector<int64_t> v(static_cast<size_t>(n_));
    std::iota(v.begin(), v.end(), 0);
    return v;
  }

 private:
  int64_t n_;
  int sleep_ms_;
};

// The wait is all the loop's time inside the loader's hand-out, not only its wait for the workers: here the
// workers are always ahead, and the time goes to the look-ahead's sampler call on the loop's thread. Epochs of 4
// batches and a window of 8: making the range appends epoch 1 (outside any hand-out), and handing out batch 0
// appends epoch 2, whose sampler call takes 80 ms.
TEST(DataLoader, WaitTimeCountsTheLoadersWorkOnTheLoop) {
  auto ds = std::make_shared<Numbers>(8);
  DataLoader loader(ds, {.batch_size = 2,
                         .workers = 2,
                         .prefetch_batches = 8,
                         .sampler = std::make_shared<SlowLaterEpochs>(8, 80),
                         .prefetch_next_epoch = true});
  auto range = loader.epoch(0);
  int64_t i = 0;
  for (Batch& b : range) {
    (void)b;
    ASSERT_TRUE(ds->wait_for_loads(std::min<int64_t>(2 * (i + 2), 8))) << ds->loads.load() << " loads";
    ++i;
  }
  const data::LoaderStats s = range.stats();
  EXPECT_EQ(s.batches, 4);
  EXPECT_GE(s.total_wait_s, 0.08 * 0.99) << "the look-ahead's sampler call is the loop's wait";
  EXPECT_LE(s.total_wait_s, s.elapsed_s);
}

TEST(DataLoaderLookAhead, NextEpochLoadsBeforeItIsAskedFor) {
  auto ds = std::make_shared<Numbers>(12);  // 6 batches of 2
  DataLoader loader(ds, {.batch_size = 2,
                         .workers = 2,
                         .prefetch_batches = 4,
                         .sampler = std::make_shared<TwoEpochs>(12),
                         .prefetch_next_epoch = true});
  const vector<Seen> expect = fresh_epochs(ds, loader.options(), 1, 1);
  ds->loads = 0;
  const Seen e0 = run(loader, 0);
  EXPECT_EQ(e0.indices.size(), 6u);
  // The window (4 batches) reaches on into epoch 1 while nobody asks for it: 8 more samples, then it is full.
  ASSERT_TRUE(ds->wait_for_loads(12 + 8)) << ds->loads.load() << " loads";
  EXPECT_EQ(ds->loads.load(), 12 + 8);
  ds->loads = 0;
  auto range = loader.epoch(1);
  EXPECT_EQ(range.stats().batches, 0);
  EXPECT_EQ(range.size(), 6);
  Seen e1;
  for (Batch& b : range) {
    e1.indices.push_back(b.indices);
    e1.x.push_back(b["x"].to_vector<double>());
  }
  EXPECT_EQ(e1.indices, expect[0].indices);
  EXPECT_EQ(e1.x, expect[0].x);
  // Epoch 1 took over the 4 batches loaded ahead and loaded only its last 2; epoch 2, which the sampler
  // gets wrong, was not looked ahead at, and its error comes when it is asked for.
  EXPECT_EQ(ds->loads.load(), 4);
  expect_error([&] { loader.epoch(2); }, {"index 12", "of epoch 2", "Numbers(12) has 12 samples"});
}

// Epochs shorter than the prefetch window: the workers go on through as many epochs as the window reaches, so
// none waits idle at an epoch's end (a folder of 2,400 photos in batches of 256 has 9 batches an epoch, and 16
// workers' window is 32). The epochs handed out are the fresh loaders' all the same.
TEST(DataLoaderLookAhead, WindowReachesAcrossSeveralShortEpochs) {
  auto ds = std::make_shared<Numbers>(6);  // 3 batches of 2 an epoch
  const data::DataLoaderOptions o{
      .batch_size = 2, .workers = 2, .shuffle = true, .seed = 5, .prefetch_batches = 8, .prefetch_next_epoch = true};
  const vector<Seen> expect = fresh_epochs(ds, o, 0, 4);
  DataLoader loader(ds, o);
  ds->loads = 0;
  EXPECT_EQ(run(loader, 0).x, expect[0].x);
  // Epoch 0 handed out (batch numbers 0..2): the window of 8 reaches number 10, epoch 3's second batch. Looking
  // one epoch ahead only, the workers would stop at epoch 1's end: 12 samples.
  ASSERT_TRUE(ds->wait_for_loads(6 + 16)) << ds->loads.load() << " loads";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // time for a load past the window, if any came
  EXPECT_EQ(ds->loads.load(), 6 + 16);
  // Epochs 1 and 2 take over what was loaded, and the look-ahead goes on.
  for (uint64_t e : {1, 2}) {
    const Seen got = run(loader, e);
    EXPECT_EQ(got.indices, expect[e].indices) << "epoch " << e;
    EXPECT_EQ(got.x, expect[e].x) << "epoch " << e;
  }
  // Epoch 4 instead of 3: the look-ahead (epoch 3 and on) is dropped, and epoch 4 is the fresh loader's.
  EXPECT_EQ(run(loader, 4).x, expect[4].x);
  EXPECT_EQ(run(loader, 5).x, fresh_epochs(ds, o, 5, 5)[0].x);
}

TEST(DataLoaderLookAhead, OtherCallsDropTheLookAhead) {
  auto ds = std::make_shared<Numbers>(30);
  const data::DataLoaderOptions o{
      .batch_size = 4, .workers = 3, .shuffle = true, .seed = 4, .prefetch_next_epoch = true};
  const vector<Seen> expect = fresh_epochs(ds, o, 0, 3);
  DataLoader loader(ds, o);
  // Resume: epoch 1 from batch 3 after a full epoch 0.
  run(loader, 0);
  Seen rest = run(loader, 1, 3);
  EXPECT_EQ(rest.indices, vector<vector<int64_t>>(expect[1].indices.begin() + 3, expect[1].indices.end()));
  EXPECT_EQ(rest.x, vector<vector<double>>(expect[1].x.begin() + 3, expect[1].x.end()));
  // Another epoch than the next one, and the same one again.
  EXPECT_EQ(run(loader, 3).x, expect[3].x);
  EXPECT_EQ(run(loader, 3).x, expect[3].x);
  EXPECT_EQ(run(loader, 0).x, expect[0].x);
  // A break out of epoch 0, then epoch 1 (and 2 after it, back to back).
  int n = 0;
  for (Batch& b : loader.epoch(0)) {
    EXPECT_EQ(b.indices, expect[0].indices[size_t(n)]);
    if (++n == 2) break;
  }
  EXPECT_EQ(run(loader, 1).x, expect[1].x);
  EXPECT_EQ(run(loader, 2).x, expect[2].x);
  // An epoch range that ran to its end while the next one was started early: each has its own workers.
  auto e0 = loader.epoch(0);
  auto e1 = loader.epoch(1);
  vector<vector<int64_t>> got0, got1;
  for (Batch& b : e0) got0.push_back(b.indices);
  for (Batch& b : e1) got1.push_back(b.indices);
  EXPECT_EQ(got0, expect[0].indices);
  EXPECT_EQ(got1, expect[1].indices);
  EXPECT_EQ(run(loader, 2).x, expect[2].x);
}

TEST(DataLoaderLookAhead, ThreadsStayForTheNextEpochAndEndWithTheLoader) {
  auto ds = std::make_shared<Numbers>(40);
  {
    DataLoader warm(ds, {.batch_size = 2, .workers = 2});
    run(warm, 0);  // anything started lazily by the tensor library starts now
  }
  const int before = thread_count();
  ds->loads = 0;
  {
    DataLoader loader(ds, {.batch_size = 2, .workers = 3, .prefetch_batches = 2, .prefetch_next_epoch = true});
    run(loader, 0);
    EXPECT_EQ(thread_count(), before + 3) << "the workers go on into epoch 1";
    ASSERT_TRUE(ds->wait_for_loads(40 + 4));  // the window is full: they wait for epoch 1 to begin
    run(loader, 1);
    EXPECT_EQ(thread_count(), before + 3) << "epoch 1 took them over";
    // Move-assigning another loader over it ends its look-ahead.
    loader = DataLoader(ds, {.batch_size = 2});
    EXPECT_EQ(thread_count(), before);
    DataLoader again(ds, {.batch_size = 5, .workers = 2, .prefetch_next_epoch = true});
    run(again, 0);
  }  // destroyed with a parked look-ahead whose workers wait on a full window: joined, no hang
  EXPECT_EQ(thread_count(), before);
  // A range that outlives its loader parks nothing at its end.
  std::optional<DataLoader::Epoch> range;
  {
    DataLoader loader(ds, {.batch_size = 10, .workers = 2, .prefetch_next_epoch = true});
    range.emplace(loader.epoch(0));
  }
  int batches = 0;
  for (Batch& b : *range) batches += b.batch_size() == 10;
  EXPECT_EQ(batches, 4);
  EXPECT_EQ(thread_count(), before);
  range.reset();
  EXPECT_EQ(thread_count(), before);
}

TEST(DataLoaderLookAhead, ErrorOfALookAheadBatchSurfacesInItsEpoch) {
  auto ds = std::make_shared<Numbers>(12);  // 6 batches of 2, in order
  for (int workers : {1, 2}) {
    ds->failures = 0;
    DataLoader loader(ds, {.batch_size = 2, .workers = workers, .prefetch_batches = 2, .prefetch_next_epoch = true});
    int n = 0;
    for (Batch& b : loader.epoch(0)) {
      // Sample 0 is loaded again only as epoch 1's first batch, ahead (the window reaches it from batch 4 on).
      if (n++ == 0) ds->fail_index = 0;
      (void)b;
    }
    EXPECT_EQ(n, 6) << "epoch 0 is not disturbed by its successor's error";
    ASSERT_TRUE(ds->wait_for_failures(1));  // the load failed ahead, before epoch 1 was asked for
    ds->fail_index = -1;                    // a fresh load would succeed now; the look-ahead's error stays
    auto range = loader.epoch(1);
    vector<vector<int64_t>> got;
    expect_error(
        [&] {
          for (Batch& b : range) got.push_back(b.indices);
        },
        {"corrupt record in shard 3", "sample 0", "batch 0 of epoch 1", "Numbers(12)"});
    EXPECT_TRUE(got.empty());
    EXPECT_EQ(range.position(), (data::LoaderPosition{1, 0}));
    EXPECT_EQ(run(loader, 1).indices.size(), 6u) << "the loader starts afresh after the error";
  }
}

// As PyTorch's DataLoader (without persistent workers): by default nothing of epoch e+1 is loaded before
// loader.epoch(e + 1) is called, so an evaluation loader asked for epoch 0 every time loads nothing for nothing.
TEST(DataLoaderLookAhead, OffByDefaultNothingOfTheNextEpochLoadsBeforeItIsAskedFor) {
  auto ds = std::make_shared<Numbers>(12);  // 6 batches of 2
  {
    DataLoader warm(ds, {.batch_size = 2, .workers = 2});
    run(warm, 0);
  }
  const int before = thread_count();
  DataLoader loader(ds, {.batch_size = 2, .workers = 2, .prefetch_batches = 4});
  EXPECT_FALSE(loader.options().prefetch_next_epoch);
  ds->loads = 0;
  const Seen e0 = run(loader, 0);
  EXPECT_EQ(e0.indices.size(), 6u);
  EXPECT_EQ(thread_count(), before) << "the workers end with the epoch";
  // A look-ahead would load epoch 1's first 4 batches (8 samples) at once; the wait gives it the time to, and
  // cannot fail a loader without one (its workers were joined above).
  EXPECT_FALSE(ds->wait_for_loads(12 + 1, 0.5)) << ds->loads.load() << " loads";
  EXPECT_EQ(ds->loads.load(), 12);
  // The evaluation pattern: the same epoch again loads each sample once more, and nothing else.
  EXPECT_EQ(run(loader, 0).x, e0.x);
  EXPECT_FALSE(ds->wait_for_loads(24 + 1, 0.2)) << ds->loads.load() << " loads";
  EXPECT_EQ(ds->loads.load(), 24);
}

TEST(DataLoaderLookAhead, SwitchedOffEachEpochEndsItsThreads) {
  auto ds = std::make_shared<Numbers>(12);
  {
    DataLoader warm(ds, {.batch_size = 2, .workers = 2});
    run(warm, 0);
  }
  const int before = thread_count();
  for (int workers : {0, 3}) {
    DataLoader loader(ds, {.batch_size = 2, .workers = workers, .prefetch_next_epoch = false});
    ds->loads = 0;
    const Seen e0 = run(loader, 0);
    EXPECT_EQ(thread_count(), before) << workers << " workers: joined at the epoch's end";
    EXPECT_EQ(ds->loads.load(), 12) << "nothing of epoch 1 is loaded";
    EXPECT_EQ(e0.indices.size(), 6u);
    EXPECT_EQ(run(loader, 1).x, fresh_epochs(ds, loader.options(), 1, 1)[0].x);
  }
  // workers = 0 with the switch on: batches are loaded when asked for, nothing ahead.
  DataLoader serial(ds, {.batch_size = 2, .prefetch_next_epoch = true});
  ds->loads = 0;
  run(serial, 0);
  EXPECT_EQ(ds->loads.load(), 12);
  EXPECT_EQ(thread_count(), before);
}

}  // namespace
}  // namespace kiln::testing
