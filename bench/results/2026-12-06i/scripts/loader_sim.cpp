// Simulates resnet50_jpeg_gpu's loader: 16 workers, batches of 256 of 2400 samples (9 per epoch), collate takes
// D ms (waiting, as the GPU decode does), the consumer trains T ms per batch. Prints the mean host wait per batch.
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>
#include <cstdlib>
#include "kiln/kiln.h"
using namespace kiln;
using Clock = std::chrono::steady_clock;
struct Fake : data::Dataset {
  int64_t n; double collate_ms;
  Fake(int64_t n_, double c) : n(n_), collate_ms(c) {}
  int64_t size() const override { return n; }
  data::Example get(int64_t i, data::SampleRng&) const override {
    data::Example e; e.add("x", kiln::zeros({1})); return e;
  }
  data::CollateFn collate_fn() const override {
    double c = collate_ms;
    return [c](const std::vector<data::Example>& ex, bool) {
      thread_local std::mt19937 g(std::hash<std::thread::id>()(std::this_thread::get_id()));
      std::uniform_real_distribution<double> u(0.8, 1.4);
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(1000 * c * u(g))));
      data::Batch b; b.add("x", kiln::zeros({static_cast<int64_t>(ex.size())})); return b;
    };
  }
};
int main(int argc, char** argv) {
  const int64_t photos = std::atoll(argv[1]); const double collate = std::atof(argv[2]);
  const int workers = std::atoi(argv[3]); const double train_ms = std::atof(argv[4]);
  auto ds = std::make_shared<Fake>(photos, collate);
  data::DataLoader loader(ds, {.batch_size = 256, .workers = workers, .shuffle = true, .drop_last = true,
                               .prefetch_next_epoch = true});
  uint64_t epoch = 0;
  auto range = std::make_unique<data::DataLoader::Epoch>(loader.epoch(epoch));
  auto it = range->begin(); bool first = true;
  std::vector<double> waits; std::vector<int> pos; int p = 0;
  const int total = 200;
  auto t_start = Clock::now();
  for (int s = 0; s < total; ++s) {
    auto t0 = Clock::now();
    if (!first) ++it;
    first = false;
    if (it == range->end()) { range = std::make_unique<data::DataLoader::Epoch>(loader.epoch(++epoch)); it = range->begin(); p = 0; }
    data::Batch b = *it;
    waits.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count()); pos.push_back(p++);
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(train_ms * 1000)));
  }
  double w = 0; int n = 0; std::vector<double> bypos(64, 0); std::vector<int> cnt(64, 0);
  for (int i = 80; i < total; ++i) { w += waits[i]; ++n; bypos[pos[i]] += waits[i]; cnt[pos[i]]++; }
  std::printf("photos %lld collate %.0f ms workers %d train %.0f ms: mean wait %.2f ms, step %.2f ms; by position:",
              (long long)photos, collate, workers, train_ms, w / n, train_ms + w / n);
  for (int k = 0; k < 64; ++k) if (cnt[k]) std::printf(" %.1f", bypos[k] / cnt[k]);
  std::printf("\n");
}
