// bench/bench_tensor.cpp — throughput of the tensor core's CPU backend on this machine.
//
//   ./build/bench/bench_tensor                   matmul 256..2048; add, sum and random draws over 64M floats
//   ./build/bench/bench_tensor --quick           small sizes: checks that it runs, measures little
//   ./build/bench/bench_tensor --sizes 512,1024 --elements 16777216 --reps 10
//   KILN_NUM_THREADS=1 ./build/bench/bench_tensor  one thread
//
// Each case runs once to warm up (page faults, thread pool start, caches), then repeats until it
// has run at least --reps times and --min-time seconds, and reports the best time: the least
// disturbed run is the best estimate of what the code can do on an otherwise idle machine.
//   matmul (float32, n x n x n):    GFLOP/s = 2 n^3 / time
//   c = a + b, a.add_(b) (float32): GB/s = 3 * 4 n / time   (read a, read b, write the result)
//   a.sum() (float32):              GB/s = 4 n / time
//   normal_, uniform_ (float32):    millions of numbers drawn per second
#include <kiln/kiln.h>  // Tensor, kiln::randn, kiln::matmul, kiln::manual_seed, KILN_VERSION_STRING

#include <algorithm>  // std::min
#include <chrono>     // std::chrono::steady_clock
#include <cstdint>
#include <cstdio>   // std::printf
#include <cstdlib>  // std::strtoll, std::strtod, EXIT_FAILURE
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>  // std::thread::hardware_concurrency
#include <vector>

namespace {

struct Options {
  std::vector<int64_t> sizes = {256, 512, 1024, 2048};
  int64_t elements = int64_t{64} << 20;  // 64M floats: 256 MB per tensor, far beyond any cache
  int reps = 5;
  double min_time = 1.0;  // seconds per case
};

struct Timing {
  double best = std::numeric_limits<double>::infinity();  // seconds
  int runs = 0;
};

// Warm-up once, then repeat until both `reps` runs and `min_time` seconds are done.
Timing time_best(const Options& opt, const std::function<void()>& fn) {
  using clock = std::chrono::steady_clock;
  fn();
  Timing t;
  const auto start = clock::now();
  while (t.runs < opt.reps || std::chrono::duration<double>(clock::now() - start).count() < opt.min_time) {
    const auto t0 = clock::now();
    fn();
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    t.best = std::min(t.best, s);
    ++t.runs;
    if (t.runs >= 1000) break;  // tiny cases: enough samples
  }
  return t;
}

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> sizes;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) sizes.push_back(std::strtoll(item.c_str(), nullptr, 10));
  return sizes;
}

void usage(const char* program) {
  std::printf("usage: %s [--quick] [--sizes N,N,...] [--elements N] [--reps N] [--min-time SECONDS]\n", program);
}

int run(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--quick") {
      opt.sizes = {64, 128};
      opt.elements = int64_t{1} << 20;
      opt.reps = 2;
      opt.min_time = 0.0;
    } else if (arg == "--sizes" && has_value) {
      opt.sizes = parse_sizes(argv[++i]);
    } else if (arg == "--elements" && has_value) {
      opt.elements = std::strtoll(argv[++i], nullptr, 10);
    } else if (arg == "--reps" && has_value) {
      opt.reps = static_cast<int>(std::strtol(argv[++i], nullptr, 10));
    } else if (arg == "--min-time" && has_value) {
      opt.min_time = std::strtod(argv[++i], nullptr);
    } else if (arg == "-h" || arg == "--help") {
      usage(argv[0]);
      return 0;
    } else {
      usage(argv[0]);
      return EXIT_FAILURE;
    }
  }

  std::printf("kiln %s, CPU backend: %d threads (hardware: %u)\n", KILN_VERSION_STRING, kiln::num_threads(),
              std::thread::hardware_concurrency());
  std::printf("best of >= %d runs and >= %.1f s per case, after one warm-up run\n\n", opt.reps, opt.min_time);
  kiln::manual_seed(0);

  std::printf("%-28s %12s %8s %14s\n", "case", "best (ms)", "runs", "throughput");
  for (int64_t n : opt.sizes) {
    const kiln::Tensor a = kiln::randn({n, n});  // (n, n) float32
    const kiln::Tensor b = kiln::randn({n, n});
    kiln::Tensor c;
    const Timing t = time_best(opt, [&] { c = kiln::matmul(a, b); });
    const double gflops = 2.0 * static_cast<double>(n) * n * n / t.best / 1e9;
    const std::string name = "matmul f32 " + std::to_string(n) + "^3";
    std::printf("%-28s %12.3f %8d %9.1f GFLOP/s\n", name.c_str(), t.best * 1e3, t.runs, gflops);
  }

  const int64_t n = opt.elements;
  const double mb = static_cast<double>(n) * 4 / (1 << 20);
  kiln::Tensor a = kiln::randn({n});  // (n) float32
  const kiln::Tensor b = kiln::randn({n});
  {
    kiln::Tensor c;
    const Timing t = time_best(opt, [&] { c = a + b; });  // allocates c each time, as a training step does
    std::printf("%-28s %12.3f %8d %9.1f GB/s\n", ("c = a + b (" + std::to_string(n) + ")").c_str(), t.best * 1e3,
                t.runs, 3.0 * 4 * n / t.best / 1e9);
  }
  {
    const Timing t = time_best(opt, [&] { a.add_(b); });
    std::printf("%-28s %12.3f %8d %9.1f GB/s\n", ("a.add_(b) (" + std::to_string(n) + ")").c_str(), t.best * 1e3,
                t.runs, 3.0 * 4 * n / t.best / 1e9);
  }
  {
    volatile float sink = 0;  // the result must be used, or the work could be skipped
    const Timing t = time_best(opt, [&] { sink = a.sum().item<float>(); });
    std::printf("%-28s %12.3f %8d %9.1f GB/s\n", ("a.sum() (" + std::to_string(n) + ")").c_str(), t.best * 1e3, t.runs,
                4.0 * n / t.best / 1e9);
  }
  for (const bool normal : {true, false}) {  // random draws into a preallocated tensor: numbers per second
    const Timing t = time_best(opt, [&] { normal ? kiln::normal_(a, 0, 1) : kiln::uniform_(a, -1, 1); });
    std::printf("%-28s %12.3f %8d %9.1f M/s\n",
                ((normal ? "a.normal_() (" : "a.uniform_() (") + std::to_string(n) + ")").c_str(), t.best * 1e3, t.runs,
                static_cast<double>(n) / t.best / 1e6);
  }
  std::printf("\n(elementwise tensors: %.0f MB each)\n", mb);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kiln::Error& e) {  // a clear message instead of an abort (an op not written yet, say)
    std::fflush(stdout);
    std::fprintf(stderr, "bench_tensor: error: %s\n", e.what());
    return EXIT_FAILURE;
  }
}
