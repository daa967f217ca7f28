// The sparse optimizers' step on one embedding table's row-sparse gradient, alone: on a GPU the fused updates of
// kiln/optim/cuda/sparse.cu (sort by row, then one warp per row's run of entries), on the CPU the kiln ops. For each
// table size and rule: k ids drawn Zipf(s)-like over the table (as the recsys example draws them, so that a few rows
// repeat hundreds of times in a small table), one backward to make the gradient, then the optimizer's step timed on
// its own, again and again on that gradient.
//
//   bench_sparse_update [--rows 3,1000,1000000,10000000] [--ids 4096] [--dim 128] [--zipf 1.05]
//                       [--rules sgd,sgd_momentum,sparse_adam,rowwise_adagrad] [--device cuda|cpu] [--quick]
//
// Prints one JSON line per (rule, rows): the median step in microseconds (CUDA events on a GPU, a wall clock on the
// CPU) over 50 steps after 10 untimed ones, the distinct rows of the ids and the longest run of one row; or the error
// of a case that failed (a table and its optimizer state that do not fit: SparseAdam and SGD's momentum keep state
// as large as the table), and the next case runs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_timing.h"  // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A Zipf(s)-like id in [0, rows): the inverse of the continuous power law's CDF, rounded down (rank 0 most likely).
int64_t zipf_id(double u, int64_t rows, double s) {
  const double n = static_cast<double>(rows);
  const double x = s == 1.0 ? std::exp(u * std::log(n + 1.0))
                            : std::pow(u * (std::pow(n + 1.0, 1.0 - s) - 1.0) + 1.0, 1.0 / (1.0 - s));
  return std::clamp<int64_t>(static_cast<int64_t>(x) - 1, 0, rows - 1);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& rule, const std::vector<Tensor>& params) {
  if (rule == "sgd") return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.1});
  if (rule == "sgd_momentum")
    return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  if (rule == "sparse_adam") return std::make_unique<optim::SparseAdam>(params, optim::SparseAdamOptions{.lr = 1e-3});
  if (rule == "rowwise_adagrad") {
    return std::make_unique<optim::RowWiseAdagrad>(params, optim::RowWiseAdagradOptions{.lr = 0.01});
  }
  return nullptr;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int usage(const char* why) {
  std::fprintf(stderr,
               "bench_sparse_update: %s\nusage: bench_sparse_update [--rows V,...] [--ids K] [--dim D] [--zipf S] "
               "[--rules sgd,sgd_momentum,sparse_adam,rowwise_adagrad] [--device cuda|cpu] [--quick]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string rows_list = "3,1000,1000000,10000000", rules_list = "sgd,sgd_momentum,sparse_adam,rowwise_adagrad";
  std::string device_name = cuda::is_available() ? "cuda" : "cpu";
  int64_t ids = 4096, dim = 128;
  double zipf = 1.05;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--quick") {
      quick = true;
    } else if (a == "--rows" && has_value) {
      rows_list = argv[++i];
    } else if (a == "--rules" && has_value) {
      rules_list = argv[++i];
    } else if (a == "--device" && has_value) {
      device_name = argv[++i];
    } else if (a == "--ids" && has_value) {
      ids = std::atoll(argv[++i]);
    } else if (a == "--dim" && has_value) {
      dim = std::atoll(argv[++i]);
    } else if (a == "--zipf" && has_value) {
      zipf = std::atof(argv[++i]);
    } else {
      return usage(("unknown or incomplete option '" + a + "'").c_str());
    }
  }
  if (quick) {
    rows_list = "3,1000";
    ids = 64;
    dim = 8;
  }
  if (device_name != "cuda" && device_name != "cpu") return usage("--device must be cuda or cpu");
  if (device_name == "cuda" && !cuda::is_available()) return usage("--device cuda, but no GPU is visible");
  if (ids < 1 || dim < 1 || !(zipf > 0)) return usage("--ids and --dim must be at least 1 and --zipf above 0");
  const Device dev = device_name == "cuda" ? Device::cuda(0) : Device::cpu();
  std::vector<int64_t> table_rows;
  for (const std::string& r : split(rows_list)) {
    const long long v = std::atoll(r.c_str());
    if (v < 1) return usage(("--rows: '" + r + "' is not a row count of at least 1").c_str());
    table_rows.push_back(v);
  }
  const std::vector<std::string> rules = split(rules_list);
  for (const std::string& rule : rules) {
    if (rule != "sgd" && rule != "sgd_momentum" && rule != "sparse_adam" && rule != "rowwise_adagrad") {
      return usage(("--rules: unknown rule '" + rule + "'").c_str());
    }
  }
  const int warmup = quick ? 1 : 10, steps = quick ? 3 : 50;
  bool failed = false;

  for (const int64_t rows : table_rows) {
    // The ids and what they repeat, on the host.
    std::mt19937_64 gen(7);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::vector<int64_t> host_ids(static_cast<size_t>(ids));
    for (int64_t& id : host_ids) id = zipf_id(uniform(gen), rows, zipf);
    std::map<int64_t, int64_t> counts;
    for (const int64_t id : host_ids) ++counts[id];
    int64_t longest = 0;
    for (const auto& [row, n] : counts) longest = std::max(longest, n);
    const Tensor index = from_vector(host_ids, {ids}).to(dev);
    for (const std::string& rule : rules) {
      try {
        std::shared_ptr<nn::Embedding> table;
        {
          nn::SkipInit no_draws;  // the values do not matter, and drawing 10^8 rows would dominate the set-up
          table = std::make_shared<nn::Embedding>(rows, dim, nn::EmbeddingOptions{.sparse = true, .device = dev});
        }
        {
          NoGradGuard no_grad;
          table->weight.zero_();
        }
        const Tensor upstream = randn({ids, dim}, {.device = dev});
        sum(table->forward(index) * upstream).backward();  // the row-sparse gradient every timed step applies
        std::unique_ptr<optim::Optimizer> opt = make_optimizer(rule, table->parameters());
        double us = 0;
        if (dev.is_cuda()) {
          us = 1000.0 * bench::median_step_ms(warmup, steps, [&] { opt->step(); });
        } else {
          for (int i = 0; i < warmup; ++i) opt->step();
          std::vector<double> times;
          for (int i = 0; i < steps; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            opt->step();
            times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          }
          us = median(times);
        }
        std::printf(
            "{\"bench\": \"sparse_update\", \"device\": \"%s\", \"rule\": \"%s\", \"rows\": %lld, \"ids\": %lld, "
            "\"dim\": %lld, \"zipf\": %.3g, \"distinct\": %zu, \"longest_run\": %lld, \"us\": %.2f}\n",
            dev.str().c_str(), rule.c_str(), static_cast<long long>(rows), static_cast<long long>(ids),
            static_cast<long long>(dim), zipf, counts.size(), static_cast<long long>(longest), us);
        std::fflush(stdout);
      } catch (const std::exception& e) {
        std::string why = e.what();
        std::replace(why.begin(), why.end(), '"', '\'');
        std::replace(why.begin(), why.end(), '\n', ' ');
        std::printf(
            "{\"bench\": \"sparse_update\", \"device\": \"%s\", \"rule\": \"%s\", \"rows\": %lld, \"error\": \"%s\"}\n",
            dev.str().c_str(), rule.c_str(), static_cast<long long>(rows), why.c_str());
        std::fflush(stdout);
        failed = true;
      }
    }
  }
  return failed ? 1 : 0;
}
