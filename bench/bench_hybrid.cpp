// The host's share of an nn::HybridEmbedding lookup: the time the calling thread spends in forward (the ids' range
// check and counts, the placement's split, the index lists) and in backward (the gradients' split), per call, at a
// table size where the per-row arrays (slot, counts: 8 bytes a row each) are far larger than the CPU's caches.
//
//   bench_hybrid [--rows V] [--dim D] [--ids N] [--hot FRACTION] [--calls C] [--device cpu|cuda]
//                [--cold-reads copy|mapped] [--quick]
//
// Ids are drawn with P(row r) roughly proportional to 1 / (r + 1) (Zipf, as the recsys example's), in training mode
// after the hot set is placed by those frequencies. Prints one JSON line: the median host ms of forward and of
// backward over C calls (after 3 untimed), and, on a GPU, the median wall ms of a whole call with a wait at its end.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 100'000'000, dim = 1, ids = 4096, calls = 20;
  double hot = 0.1;
  std::string device_name = "cpu", reads = "copy";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_hybrid: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--rows") {
      rows = std::stoll(value());
    } else if (a == "--dim") {
      dim = std::stoll(value());
    } else if (a == "--ids") {
      ids = std::stoll(value());
    } else if (a == "--hot") {
      hot = std::stod(value());
    } else if (a == "--calls") {
      calls = std::stoll(value());
    } else if (a == "--device") {
      device_name = value();
    } else if (a == "--cold-reads") {
      reads = value();
    } else if (a == "--quick") {
      rows = 10'000, ids = 256, calls = 3;
    } else {
      std::fprintf(stderr,
                   "usage: bench_hybrid [--rows V] [--dim D] [--ids N] [--hot FRACTION] [--calls C] "
                   "[--device cpu|cuda] [--cold-reads copy|mapped] [--quick]\n");
      return 2;
    }
  }
  if (rows <= 0 || dim <= 0 || ids <= 0 || calls <= 0 || !(hot >= 0 && hot <= 1) ||
      (device_name != "cpu" && device_name != "cuda") || (reads != "copy" && reads != "mapped")) {
    std::fprintf(stderr,
                 "bench_hybrid: --rows, --dim, --ids and --calls must be positive, --hot in [0, 1], "
                 "--device cpu or cuda, --cold-reads copy or mapped\n");
    return 2;
  }
  if (device_name == "cuda" && !cuda::is_available()) {
    std::printf("bench_hybrid: no GPU visible; nothing to measure on cuda\n");
    return 0;
  }
  const Device device = device_name == "cuda" ? Device::cuda(0) : Device::cpu();

  // Frequencies 1 / (r + 1): the hot set is the first rows, and the ids follow the same law (inverse CDF of the
  // continuous 1 / x on [1, V + 1)).
  Tensor freq = empty({rows}, {.dtype = DType::Float32});
  float* f = freq.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) f[r] = 1.0f / static_cast<float>(r + 1);
  nn::SkipInit no_draws;  // the values do not matter here, and drawing 10^8 rows would dominate the set-up
  nn::HybridEmbedding emb(rows, dim,
                          {.device = device,
                           .hot_fraction = hot,
                           .frequencies = freq,
                           .cold_reads = reads == "mapped" ? nn::ColdReads::Mapped : nn::ColdReads::Copy});
  emb.train();
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  const double log_span = std::log(static_cast<double>(rows) + 1);
  const auto draw = [&] {
    Tensor t = empty({ids}, {.dtype = DType::Int64});
    int64_t* p = t.data_ptr<int64_t>();
    for (int64_t i = 0; i < ids; ++i)
      p[i] = std::min<int64_t>(rows - 1, static_cast<int64_t>(std::exp(u(rng) * log_span)) - 1);
    return t;
  };
  int64_t cold_lookups = 0;
  std::vector<double> forward_ms, backward_ms, call_ms;
  for (int64_t c = 0; c < calls + 3; ++c) {
    const Tensor batch = draw();
    if (c >= 3) {
      const int64_t* p = batch.data_ptr<int64_t>();
      for (int64_t i = 0; i < ids; ++i) cold_lookups += emb.slot_of(p[i]) < 0 ? 1 : 0;
    }
    if (device.is_cuda()) cuda::synchronize(0);
    const auto start = std::chrono::steady_clock::now();
    const Tensor out = emb(batch);
    const double fwd = ms_since(start);
    const Tensor loss = sum(out);
    const auto back = std::chrono::steady_clock::now();
    loss.backward();
    const double bwd = ms_since(back);
    if (device.is_cuda()) cuda::synchronize(0);
    const double whole = ms_since(start);
    emb.zero_grad();
    if (c < 3) continue;  // untimed: first allocations
    forward_ms.push_back(fwd);
    backward_ms.push_back(bwd);
    call_ms.push_back(whole);
  }
  std::printf(
      "{\"bench\": \"hybrid_lookup\", \"device\": \"%s\", \"cold_reads\": \"%s\", \"rows\": %lld, \"dim\": %lld, "
      "\"ids\": %lld, \"hot_rows\": %lld, \"cold_share\": %.4f, \"calls\": %lld, \"forward_host_ms\": %.4f, "
      "\"backward_host_ms\": %.4f, \"call_ms\": %.4f}\n",
      device.str().c_str(), device.is_cuda() ? reads.c_str() : "host", static_cast<long long>(rows),
      static_cast<long long>(dim), static_cast<long long>(ids), static_cast<long long>(emb.hot_rows),
      static_cast<double>(cold_lookups) / static_cast<double>(calls * ids), static_cast<long long>(calls),
      median(forward_ms), median(backward_ms), median(call_ms));
  return 0;
}
