// The CPU thread pool: a fixed set of workers that take chunks of one parallel_for at a time.
#include "kiln/tensor/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "kiln/tensor/env_vars.h"
#include "kiln/tensor/error.h"

namespace kiln::cpu {
namespace {

thread_local bool t_in_parallel_region = false;

class ThreadPool {
 public:
  explicit ThreadPool(int threads) { start(threads); }
  ~ThreadPool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int threads) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    stop();
    start(threads);
  }

  // Runs fn over [begin, end) split into chunks; the caller takes part. One job at a time.
  void run(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    const int64_t n = end - begin;
    const int64_t max_chunks = std::max<int64_t>(1, n / grain);
    const int64_t chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(size()) * 4);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = {begin, end, chunks, &fn};
      next_chunk_.store(0);
      remaining_.store(chunks);
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    work_on_job(job_);
    // Wait for every chunk, and for every worker that joined this job to leave it, so none can touch
    // the next job's counters with this one's function.
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return remaining_.load() == 0 && active_workers_ == 0; });
    job_.fn = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  struct Job {
    int64_t begin = 0, end = 0, chunks = 0;
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
  };

  void start(int threads) {
    quit_ = false;
    for (int i = 0; i + 1 < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  void work_on_job(const Job job) {
    t_in_parallel_region = true;
    const int64_t n = job.end - job.begin;
    for (int64_t c = next_chunk_.fetch_add(1); c < job.chunks; c = next_chunk_.fetch_add(1)) {
      const int64_t b = job.begin + n * c / job.chunks;
      const int64_t e = job.begin + n * (c + 1) / job.chunks;
      try {
        (*job.fn)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      if (remaining_.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_all();
      }
    }
    t_in_parallel_region = false;
  }

  void worker_loop() {
    uint64_t seen = 0;
    Job job;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return quit_ || (generation_ != seen && job_.fn != nullptr); });
        if (quit_) return;
        seen = generation_;
        job = job_;
        ++active_workers_;
      }
      work_on_job(job);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --active_workers_;
      }
      done_.notify_all();
    }
  }

  std::mutex run_mutex_;  // one parallel_for at a time (callers from several threads queue here)
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  Job job_;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int64_t> remaining_{0};
  std::exception_ptr error_;
  uint64_t generation_ = 0;
  int active_workers_ = 0;
  bool quit_ = false;
};

int default_thread_count() {
  const auto cores = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(env_positive_int("KILN_NUM_THREADS", cores));
}

ThreadPool& pool() {
  static ThreadPool instance(default_thread_count());
  return instance;
}

}  // namespace

int num_threads() { return pool().size(); }

void set_num_threads(int n) {
  KILN_CHECK(n >= 1, "set_num_threads: expected at least 1 thread, got ", n);
  pool().resize(n);
}

void parallel_for_impl(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (t_in_parallel_region) {
    fn(begin, end);
    return;
  }
  pool().run(begin, end, grain, fn);
}

}  // namespace kiln::cpu

namespace kiln {
int num_threads() { return cpu::num_threads(); }
void set_num_threads(int n) { cpu::set_num_threads(n); }
}  // namespace kiln
