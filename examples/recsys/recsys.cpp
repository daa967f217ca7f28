// examples/recsys/recsys.cpp — a DLRM-style click-through model trained on generated Criteo-shaped data.
//
// Each sample has 13 dense features and 26 categorical ones (ids into 26 embedding tables), and a click label.
// The data come from a seeded generator in this file: ids follow Zipf(--zipf) over each table (a few rows are
// looked up most of the time, as in real logs), and the label is drawn from a hidden logistic model of the
// features, so there is something to learn and the best possible AUC is well above 0.5. The model is the DLRM
// recipe: a bottom MLP for the dense features, one embedding table per categorical feature with row-sparse
// gradients, the pairwise dot products of all 27 vectors, and a top MLP; the loss is binary cross-entropy. The
// embedding tables are trained by optim::SGD (or --table-optimizer: SparseAdam, RowWiseAdagrad) on their sparse
// gradients, so a step costs what its looked-up rows cost, whatever the tables' sizes.
//
//   ./build/examples/recsys/recsys                                  # small tables, on the CPU in about 20 s
//   ./build/examples/recsys/recsys --table-sizes 1000,100000,10000000 --embedding-dim 64 --device cuda
//   ./build/examples/recsys/recsys --checkpoint runs/rs/ckpt.h5 --steps 400   # then again with --resume
//   mpirun -np 2 ./build/examples/recsys/recsys --device cpu                    # the MLPs data-parallel
//   mpirun -np 2 ./build/examples/recsys/recsys --device cpu --hybrid-rows 100000   # one hot set for all ranks
//   ./build/examples/recsys/recsys --bench-steps 100 --bench-name x ...         # timing mode: one JSON line
//
// The timing mode (--bench-steps N, README "Measuring on a GPU") makes the batches of --bench-warmup + N steps
// first, runs the warm-up steps, then times each of the N steps (CUDA events around it, then a wait for it; host
// time on the CPU) and prints one JSON line: the median, min and max step time, samples/s, every step's loss and
// whether the loss fell, and the memory the tables and their optimizer state hold on the device and on the host.
#include <kiln/kiln.h>  // Tensor, nn::, optim::, io::

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "example_util.h"  // ex::Options, ex::pick_device

using namespace kiln;

namespace {

constexpr int64_t kDense = 13, kSparse = 26;

// ---------------------------------------------------------------- the generator

// splitmix64: a fixed, well-mixed hash of a 64-bit key, the source of every generated number (so a sample depends
// only on the seed and its position, and any step can be regenerated exactly).
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
double uniform(uint64_t key) { return (static_cast<double>(mix(key) >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
double normal(uint64_t key) {  // Box-Muller from two uniforms of the key
  return std::sqrt(-2.0 * std::log(uniform(key))) * std::cos(6.283185307179586 * uniform(key ^ 0x5DEECE66Dull));
}

// A Zipf(s)-like id in [0, rows): the inverse of the continuous power law's CDF, rounded down (rank 0 most likely).
int64_t zipf_id(double u, int64_t rows, double s) {
  const double n = static_cast<double>(rows);
  const double x = s == 1.0 ? std::exp(u * std::log(n + 1.0))
                            : std::pow(u * (std::pow(n + 1.0, 1.0 - s) - 1.0) + 1.0, 1.0 / (1.0 - s));
  return std::clamp<int64_t>(static_cast<int64_t>(x) - 1, 0, rows - 1);
}

struct Batch {
  Tensor dense;   // (B, 13) float32
  Tensor ids;     // (B, 26) int64, column t in [0, table t's rows)
  Tensor labels;  // (B) float32 0 or 1
};

// Samples `first`, first + 1, ... of the stream of seed `seed`. The hidden model: logit = dense . w + sum over the
// tables of a value per (table, row), both drawn from the seed; the label is a coin with probability sigmoid(logit).
Batch generate(uint64_t seed, int64_t first, int64_t count, const std::vector<int64_t>& rows, double zipf) {
  std::vector<float> dense(static_cast<size_t>(count * kDense)), labels(static_cast<size_t>(count));
  std::vector<int64_t> ids(static_cast<size_t>(count * kSparse));
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t sample = mix(seed ^ mix(static_cast<uint64_t>(first + i)));
    double logit = -0.5;
    for (int64_t d = 0; d < kDense; ++d) {
      const double x = normal(sample + static_cast<uint64_t>(d));
      dense[static_cast<size_t>(i * kDense + d)] = static_cast<float>(x);
      logit += 0.3 * normal(mix(seed) + static_cast<uint64_t>(d)) * x;
    }
    for (int64_t t = 0; t < kSparse; ++t) {
      const int64_t id = zipf_id(uniform(sample + 1000 + static_cast<uint64_t>(t)), rows[static_cast<size_t>(t)], zipf);
      ids[static_cast<size_t>(i * kSparse + t)] = id;
      logit += 0.35 * normal(mix(seed + 77) ^ (static_cast<uint64_t>(t) << 40) ^ static_cast<uint64_t>(id));
    }
    labels[static_cast<size_t>(i)] = uniform(sample + 5000) < 1.0 / (1.0 + std::exp(-logit)) ? 1.0f : 0.0f;
  }
  return {from_vector(dense, {count, kDense}), from_vector(ids, {count, kSparse}), from_vector(labels, {count})};
}

// ---------------------------------------------------------------- the model

// The sizes of a model: the tables' rows, their dim, the hidden widths of the two MLPs, and which tables are
// nn::HybridEmbedding (those of at least hybrid_rows rows, when hybrid_rows > 0) with how many rows on the device.
struct DlrmConfig {
  std::vector<int64_t> rows;         // per table (26)
  int64_t dim = 16;                  // every table's row length, and the bottom MLP's output
  std::vector<int64_t> bottom{64};   // hidden widths of the bottom MLP: 13 -> bottom... -> dim, ReLU after each
  std::vector<int64_t> top{64, 32};  // of the top MLP: dim + 351 -> top... -> 1, ReLU between
  int64_t hybrid_rows = 0;           // 0: every table whole on the device
  double hot_fraction = 0.1;         // a hybrid table's share of rows on the device ...
  int64_t hot_rows = -1;             // ... or this many (-1: use hot_fraction)
  nn::ColdReads cold_reads = nn::ColdReads::Mapped;  // how a hybrid table's lookups on a GPU read its cold rows
};

// (B, 13) dense and (B, 26) ids -> (B) logits.
// Tables of at least `hybrid_rows` rows are nn::HybridEmbedding (hot_fraction of their rows on `device`, the rest
// in host memory, the hot set from the lookups of the first 20 steps); the others nn::Embedding on `device`. Both
// start from the same draws (init_tables), so a run's numbers do not depend on where the rows live.
class Dlrm : public nn::Module {
 public:
  Dlrm(const DlrmConfig& config, Device device) : Module("Dlrm"), dim(config.dim) {
    using namespace nn;
    const int64_t vectors = kSparse + 1, pairs = vectors * (vectors - 1) / 2;
    bottom = register_module("bottom", mlp(kDense, config.bottom, dim, true));
    top = register_module("top", mlp(dim + pairs, config.top, 1, false));
    tables = register_module("tables", nn::make<ModuleList>());
    // The tables are made where they live, without the N(0, 1) start their constructors would draw (12.8e9 numbers
    // on the host for a 10^8-row table): init_tables draws the start.
    nn::SkipInit skip;
    for (int64_t r : config.rows) {
      rows.push_back(r);
      const bool hybrid = config.hybrid_rows > 0 && r >= config.hybrid_rows;
      is_hybrid.push_back(hybrid);
      if (hybrid) {
        tables->push_back(std::make_shared<HybridEmbedding>(
            r, dim,
            HybridEmbeddingOptions{.device = device,
                                   .hot_rows = config.hot_rows < 0 ? -1 : std::min(config.hot_rows, r),
                                   .hot_fraction = config.hot_fraction,
                                   .count_batches = 20,
                                   .cold_reads = config.cold_reads}));
      } else {
        tables->push_back(std::make_shared<Embedding>(r, dim, EmbeddingOptions{.sparse = true, .device = device}));
      }
    }
    // The strictly lower triangle of the (27, 27) dot products, as positions in the flattened matrix.
    std::vector<int64_t> lower;
    for (int64_t i = 0; i < vectors; ++i) {
      for (int64_t j = 0; j < i; ++j) lower.push_back(i * vectors + j);
    }
    pair_index = from_vector(lower, {pairs});
  }

  // Every table's start, DLRM's U(-1/sqrt(rows), 1/sqrt(rows)), drawn from `gen` on `device` (where the model now
  // is) in chunks of kInitChunk rows, one draw per chunk in row order, and copied to where each row lives: a plain
  // table's weight, or a hybrid table's hot tier (its rows 0..H-1 until the first rebalance) and cold tier (the
  // others, in host memory). No copy of a whole table is ever made, so a 51 GB table needs no second 51 GB.
  void init_tables(Generator& gen, Device device) {
    NoGradGuard no_grad;
    for (size_t t = 0; t < rows.size(); ++t) {
      const int64_t r = rows[t];
      const double bound = 1.0 / std::sqrt(static_cast<double>(r));
      nn::HybridEmbedding* hybrid =
          is_hybrid[t] ? tables->at<nn::HybridEmbedding>(static_cast<int64_t>(t)).get() : nullptr;
      const int64_t h = hybrid != nullptr ? hybrid->hot_rows : r;  // rows [0, h) in the first tensor
      if (hybrid != nullptr && h > 0 && h < r) {
        KILN_CHECK(hybrid->slot_of(h - 1) == h - 1 && hybrid->slot_of(h) == -1,
                   "recsys: a hybrid table's rows must still be in their first placement when they are drawn");
      }
      for (int64_t a = 0; a < r; a += kInitChunk) {
        const int64_t n = std::min(kInitChunk, r - a);
        Tensor chunk = empty({n, dim}, {.device = device});  // (n, D): rows a .. a + n - 1
        nn::init::uniform_(chunk, -bound, bound, &gen);
        if (hybrid == nullptr) {
          tables->at<nn::Embedding>(static_cast<int64_t>(t))->weight.narrow(0, a, n).copy_(chunk);
          continue;
        }
        const int64_t in_hot = std::clamp<int64_t>(h - a, 0, n);  // the chunk's first in_hot rows are hot
        if (in_hot > 0) hybrid->hot.narrow(0, a, in_hot).copy_(chunk.narrow(0, 0, in_hot));
        if (in_hot < n) hybrid->cold.narrow(0, a + in_hot - h, n - in_hot).copy_(chunk.narrow(0, in_hot, n - in_hot));
      }
    }
  }

  // ids (B, 26) on the model's device; host_ids, when given, the same on the CPU: the hybrid tables read their ids
  // there (where their placement is), so that no lookup waits for a copy back from the GPU.
  Tensor forward(const Tensor& dense, const Tensor& ids, const Tensor& host_ids = {}) {
    const int64_t b = dense.size(0);
    const Tensor x = bottom(dense);  // (B, D)
    std::vector<Tensor> vectors{x};
    for (int64_t t = 0; t < kSparse; ++t) {
      if (is_hybrid[static_cast<size_t>(t)]) {
        const Tensor column = select(host_ids.defined() ? host_ids : ids, 1, t);  // (B)
        vectors.push_back(tables->at<nn::HybridEmbedding>(t)(column));
      } else {
        vectors.push_back(tables->at<nn::Embedding>(t)(select(ids, 1, t)));
      }
    }
    const Tensor all = stack(vectors, 1);                                      // (B, 27, D)
    const Tensor dots = reshape(bmm(all, transpose(all, 1, 2)), {b, -1});      // (B, 27 * 27)
    const Tensor pairs = index_select(dots, 1, pair_index.to(dots.device()));  // (B, 351)
    return reshape(top(cat({x, pairs}, 1)), {b});                              // (B)
  }

  static constexpr int64_t kInitChunk = int64_t{1} << 20;  // rows per draw in init_tables

  int64_t dim;
  nn::Handle<nn::Sequential> bottom, top;
  nn::Handle<nn::ModuleList> tables;
  std::vector<int64_t> rows;    // per table
  std::vector<bool> is_hybrid;  // per table: an nn::HybridEmbedding
  Tensor pair_index;

 private:
  using nn::Module::forward;

  // in -> hidden... -> out, a ReLU after every Linear but the last, and after the last too when relu_last.
  static nn::Handle<nn::Sequential> mlp(int64_t in, const std::vector<int64_t>& hidden, int64_t out, bool relu_last) {
    auto seq = nn::make<nn::Sequential>();
    int64_t width = in;
    for (int64_t h : hidden) {
      seq->append(nn::Linear(width, h));
      seq->append(nn::ReLU());
      width = h;
    }
    seq->append(nn::Linear(width, out));
    if (relu_last) seq->append(nn::ReLU());
    return seq;
  }
};

// The area under the ROC curve of scores for labels (0/1): the probability that a random click scores above a
// random non-click (ties count half), from the ranks.
double auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double rank_sum = 0, positives = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double mean_rank = 0.5 * static_cast<double>(i + j + 1);  // ranks i+1 .. j
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        rank_sum += mean_rank;
        positives += 1;
      }
    }
    i = j;
  }
  const double negatives = static_cast<double>(scores.size()) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

std::vector<float> to_floats(const Tensor& t) {
  const Tensor c = t.to(Device::cpu(), DType::Float32).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

// A hash of the tensors' bytes (FNV-1a). Of every parameter, printed at the end: two runs that end with the same
// parameters print the same digest (how the resume test compares a resumed run with an uninterrupted one). Of the
// parameters and buffers (the hybrid tables' slot and counts), compared between the ranks under mpirun.
uint64_t digest(const std::vector<Tensor>& tensors) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const Tensor& t : tensors) {
    const Tensor c = t.detach().to(Device::cpu()).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  }
  return h;
}

// A comma-separated list of positive integers (`option` names it in the error); empty text gives an empty list when
// allow_empty.
std::vector<int64_t> parse_list(const std::string& text, const std::string& option, bool allow_empty = false) {
  std::vector<int64_t> values;
  if (text.empty() && allow_empty) return values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KILN_CHECK(used == item.size() && v > 0, option, ": '", item,
               "' is not a positive number; give a comma-separated list such as 1000,100000");
    values.push_back(v);
  }
  KILN_CHECK(!values.empty(), option, ": give at least one number");
  return values;
}

std::vector<int64_t> parse_sizes(const std::string& text) {
  const std::vector<int64_t> sizes = parse_list(text, "--table-sizes");
  KILN_CHECK(static_cast<int64_t>(sizes.size()) <= kSparse, "--table-sizes: give 1 to ", kSparse,
             " sizes (they repeat over the 26 tables)");
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < kSparse; ++t) rows.push_back(sizes[static_cast<size_t>(t) % sizes.size()]);
  return rows;
}

// ---------------------------------------------------------------- the timing mode's report

// A number as a JSON line carries it: NaN, Infinity or -Infinity where not finite (Python's json reads those).
std::string json_number(double value, int decimals) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string json_list(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// This process's resident memory now and at its peak (VmRSS, VmHWM of /proc/self/status), in GiB; NaN elsewhere.
std::pair<double, double> host_rss_gib() {
  std::ifstream status("/proc/self/status");
  double now = NAN, peak = NAN;
  std::string key;
  while (status >> key) {
    double kb = 0;
    if (key == "VmRSS:" && status >> kb) now = kb / (1 << 20);
    if (key == "VmHWM:" && status >> kb) peak = kb / (1 << 20);
    status.ignore(1 << 10, '\n');
  }
  return {now, peak};
}

// Bytes the embedding tables and their optimizer state hold, by where they live.
struct TableMemory {
  int64_t device_params = 0, device_state = 0;  // on the GPU (plain tables, hot tiers) ...
  int64_t host_params = 0, host_state = 0;      // ... and in host memory (cold tiers; every table on a CPU run)
  int64_t hot_params = 0, hot_state = 0;        // of those, the hybrid tables' hot tiers ...
  int64_t cold_params = 0, cold_state = 0;      // ... and cold tiers
  int64_t device_placement = 0;                 // the hybrid tables' placement and counts kept on the GPU
};

TableMemory table_memory(Dlrm& model, const std::vector<const optim::Optimizer*>& opts) {
  TableMemory m;
  auto state_bytes = [&](const Tensor& p, bool on_device) {
    int64_t bytes = 0;
    for (const optim::Optimizer* o : opts) {
      if (const auto* state = o->find_state(p)) {
        for (const auto& [name, t] : *state)
          if (t.defined() && t.device().is_cuda() == on_device) bytes += static_cast<int64_t>(t.nbytes());
      }
    }
    return bytes;
  };
  auto add = [&](const Tensor& p, int64_t* params_tier, int64_t* state_tier) {
    const bool dev = p.device().is_cuda();
    const auto pb = static_cast<int64_t>(p.nbytes());
    const int64_t sb = state_bytes(p, true) + state_bytes(p, false);
    (dev ? m.device_params : m.host_params) += pb;
    m.device_state += state_bytes(p, true);
    m.host_state += state_bytes(p, false);
    if (params_tier != nullptr) {
      *params_tier += pb;
      *state_tier += sb;
    }
  };
  for (size_t t = 0; t < model.rows.size(); ++t) {
    if (model.is_hybrid[t]) {
      const auto h = model.tables->at<nn::HybridEmbedding>(static_cast<int64_t>(t));
      add(h->hot, &m.hot_params, &m.hot_state);
      add(h->cold, &m.cold_params, &m.cold_state);
      m.device_placement += h->device_placement_bytes();
    } else {
      add(model.tables->at<nn::Embedding>(static_cast<int64_t>(t))->weight, nullptr, nullptr);
    }
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  ex::Options opts("recsys", "Trains a DLRM-style click-through model on generated Criteo-shaped data.");
  auto& table_sizes = opts.add_string("table-sizes", "1000,10000,100000",
                                      "rows of the embedding tables, comma-separated, repeated over the 26 tables");
  auto& dim = opts.add_int("embedding-dim", 16, "the length of every embedding row");
  auto& bottom_mlp = opts.add_string("bottom-mlp", "64", "hidden widths of the bottom MLP (13 -> these -> dim)");
  auto& top_mlp = opts.add_string("top-mlp", "64,32", "hidden widths of the top MLP (dim + 351 -> these -> 1)");
  auto& zipf = opts.add_double("zipf", 1.05, "the exponent of the ids' Zipf distribution");
  auto& id_rows = opts.add_int("id-rows", 0,
                               "draw each table's ids from its first this many rows only (0: from all its rows); the "
                               "same ids whatever the tables' sizes");
  auto& steps = opts.add_int("steps", 600, "training steps");
  auto& batch_size = opts.add_int("batch-size", 256, "samples per step");
  auto& lr = opts.add_double("lr", 1.0, "SGD's learning rate (DLRM's recipe: plain SGD for every parameter)");
  auto& table_optimizer = opts.add_string("table-optimizer", "sgd",
                                          "the tables' optimizer: sgd | sparse_adam | rowwise_adagrad (the MLPs "
                                          "keep SGD at --lr)");
  auto& table_lr = opts.add_double("table-lr", 0.0,
                                   "the tables' learning rate (0: --lr for sgd, 0.001 for sparse_adam, 0.01 for "
                                   "rowwise_adagrad)");
  auto& eval_size = opts.add_int("eval-size", 20000, "held-out samples for the AUC");
  auto& target = opts.add_double("target-auc", 0.0, "exit with status 1 if the final AUC is below this");
  auto& device_name = opts.add_string("device", "auto", "auto | cpu | cuda");
  auto& seed = opts.add_int("seed", 0, "seed of the data and the weights");
  auto& log_every = opts.add_int("log-every", 100, "print the mean loss every this many steps");
  auto& hybrid_rows = opts.add_int("hybrid-rows", 0,
                                   "tables of at least this many rows keep only --hot-fraction of them on the device "
                                   "(nn::HybridEmbedding); 0: every table whole on the device");
  auto& hot_fraction = opts.add_double("hot-fraction", 0.1, "the share of a hybrid table's rows on the device");
  auto& hot_rows = opts.add_int("hot-rows", -1, "a hybrid table's rows on the device (-1: --hot-fraction of them)");
  auto& cold_reads = opts.add_string("cold-reads", "mapped",
                                     "how a hybrid table's lookups on a GPU read its cold rows: mapped (a kernel reads "
                                     "the page-locked host table) | copy (gathered on the host, then copied)");
  auto& checkpoint = opts.add_string("checkpoint", "", "save the model, optimizer and step to this file at the end");
  auto& resume = opts.add_flag("resume", "continue from --checkpoint (exactly: the data stream resumes too)");
  auto& bench_steps = opts.add_int("bench-steps", 0,
                                   "timing mode: time this many steps after --bench-warmup and print one JSON line "
                                   "(then no AUC, no checkpoint; --steps is ignored)");
  auto& bench_warmup = opts.add_int("bench-warmup", 30,
                                    "timing mode: untimed steps first (a hybrid table rebalances "
                                    "after 20)");
  auto& bench_cycle = opts.add_int("bench-cycle", 10,
                                   "timing mode: the loss must fall, the mean of the last this many steps below "
                                   "that of the first this many");
  auto& bench_name = opts.add_string("bench-name", "recsys", "timing mode: the JSON line's \"case\"");
  const ex::ProfileOptions profiling = ex::StepProfiler::add_options(opts, "recsys_trace.json");
  opts.parse(argc, argv);
  if (dim < 1 || steps < 0 || batch_size < 1 || eval_size < 2 || log_every < 1) {
    opts.fail("--embedding-dim, --batch-size and --log-every must be at least 1, --steps at least 0, --eval-size 2");
  }
  if (!(lr > 0) || !(zipf > 0) || table_lr < 0) opts.fail("--lr and --zipf must be positive, --table-lr >= 0");
  if (resume && checkpoint.empty()) opts.fail("--resume needs --checkpoint");
  if (hybrid_rows < 0 || !(hot_fraction >= 0 && hot_fraction <= 1) || hot_rows < -1 || id_rows < 0) {
    opts.fail("--hybrid-rows and --id-rows must be >= 0, --hot-fraction in [0, 1], --hot-rows -1 or more");
  }
  if (cold_reads != "copy" && cold_reads != "mapped") opts.fail("--cold-reads must be copy or mapped");
  if (table_optimizer != "sgd" && table_optimizer != "sparse_adam" && table_optimizer != "rowwise_adagrad") {
    opts.fail("--table-optimizer must be sgd, sparse_adam or rowwise_adagrad, not '" + table_optimizer + "'");
  }
  if (bench_steps < 0 || bench_warmup < 0 || bench_cycle < 1) {
    opts.fail("--bench-steps and --bench-warmup must be >= 0, --bench-cycle >= 1");
  }
  const bool timing = bench_steps > 0;
  if (!timing && (!profiling.profile.empty() || profiling.nvtx))
    opts.fail("--profile and --nvtx profile the timing mode's steps: add --bench-steps N");
  if (timing && (!checkpoint.empty() || resume)) opts.fail("the timing mode (--bench-steps) takes no --checkpoint");
  const double tables_lr = table_lr > 0                       ? table_lr
                           : table_optimizer == "sgd"         ? lr
                           : table_optimizer == "sparse_adam" ? 1e-3
                                                              : 1e-2;
  // One optimizer for every parameter (DLRM's SGD) unless the tables take another: then the checkpoint, which holds
  // one optimizer, is not offered.
  const bool one_optimizer = table_optimizer == "sgd" && tables_lr == lr;
  if (!one_optimizer && !checkpoint.empty()) {
    opts.fail("--checkpoint saves one optimizer: it needs --table-optimizer sgd at the MLPs' --lr");
  }

  try {
    const auto clock_start = std::chrono::steady_clock::now();
    auto seconds_since = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    };
    DlrmConfig config{.rows = parse_sizes(table_sizes),
                      .dim = dim,
                      .bottom = parse_list(bottom_mlp, "--bottom-mlp", true),
                      .top = parse_list(top_mlp, "--top-mlp", true),
                      .hybrid_rows = hybrid_rows,
                      .hot_fraction = hot_fraction,
                      .hot_rows = hot_rows,
                      .cold_reads = cold_reads == "mapped" ? nn::ColdReads::Mapped : nn::ColdReads::Copy};
    const std::vector<int64_t>& rows = config.rows;
    std::vector<int64_t> id_range = rows;  // the rows each table's ids are drawn from
    for (int64_t& r : id_range) r = id_rows > 0 ? std::min(r, static_cast<int64_t>(id_rows)) : r;
    const dist::Env& env = dist::init();
    const Device dev = ex::pick_device(device_name, env);
    const auto data_seed = static_cast<uint64_t>(seed);
    manual_seed(data_seed);
    auto model = nn::make<Dlrm>(config, dev);
    model->to(dev);
    // The tables' values come from a generator of their own (drawn after the move, on the device).
    Generator table_gen(data_seed + 1);
    model->init_tables(table_gen, dev);
    const double build_s = seconds_since(clock_start);
    // Under mpirun each rank counts the lookups of its own batches; the hybrid tables' gradients, gathered over the
    // ranks by slot, need one placement: every rebalance first sums the counts over the ranks.
    if (env.distributed()) dist::share_placement(*model);
    int64_t table_rows = 0;
    for (int64_t r : rows) table_rows += r;
    if (env.is_main())
      std::printf("kiln %s recsys: 26 tables, %lld rows of %lld (%.1f MB), Zipf(%.2f) ids, %lld parameters, on %s\n",
                  KILN_VERSION_STRING, static_cast<long long>(table_rows), static_cast<long long>(dim),
                  static_cast<double>(table_rows * dim * 4) / 1e6, zipf,
                  static_cast<long long>(model->num_parameters()), dev.str().c_str());

    // The optimizers: SGD for the MLPs; the tables' own, or the same SGD (one optimizer, as DLRM's reference).
    std::vector<Tensor> dense_params = model->bottom->parameters(), table_params = model->tables->parameters();
    for (const Tensor& p : model->top->parameters()) dense_params.push_back(p);
    std::unique_ptr<optim::Optimizer> table_opt;
    optim::SGD opt(one_optimizer ? model->parameters() : dense_params, {.lr = lr});
    if (!one_optimizer) {
      if (table_optimizer == "sgd")
        table_opt = std::make_unique<optim::SGD>(table_params, optim::SGDOptions{.lr = tables_lr});
      if (table_optimizer == "sparse_adam")
        table_opt = std::make_unique<optim::SparseAdam>(table_params, optim::SparseAdamOptions{.lr = tables_lr});
      if (table_optimizer == "rowwise_adagrad")
        table_opt =
            std::make_unique<optim::RowWiseAdagrad>(table_params, optim::RowWiseAdagradOptions{.lr = tables_lr});
    }
    optim::Optimizer& tables_opt = one_optimizer ? static_cast<optim::Optimizer&>(opt) : *table_opt;
    // A hybrid table's rebalance moves rows between the tiers: their optimizer state follows them.
    for (size_t t = 0; t < rows.size(); ++t) {
      if (!model->is_hybrid[t]) continue;
      nn::HybridEmbedding* h = model->tables->at<nn::HybridEmbedding>(static_cast<int64_t>(t)).get();
      h->on_rebalance = [h, &tables_opt](const nn::RowSwaps& swaps) {
        h->swap_state_rows(swaps, tables_opt.state(h->hot), tables_opt.state(h->cold));
      };
    }
    // Under mpirun: the MLPs data-parallel (DataParallel averages their gradients during backward, and broadcasts
    // rank 0's weights now); the tables replicated, their sparse gradients averaged by all_gather_sparse_grads.
    // With one process both are no-ops.
    std::unique_ptr<dist::DataParallel> bottom_ddp, top_ddp;
    if (env.distributed()) {
      bottom_ddp = std::make_unique<dist::DataParallel>(model->bottom);
      top_ddp = std::make_unique<dist::DataParallel>(model->top);
      for (const Tensor& table : model->tables->parameters()) dist::broadcast(table);
    }
    bool any_hybrid = false;
    for (bool h : model->is_hybrid) any_hybrid = any_hybrid || h;

    // One training step on a batch already on the device (host_ids: its ids on the CPU, for the hybrid tables).
    auto train_step = [&](const Tensor& dense, const Tensor& ids, const Tensor& host_ids, const Tensor& labels) {
      opt.zero_grad();
      if (table_opt) table_opt->zero_grad();
      const Tensor loss = nn::binary_cross_entropy_with_logits(model->forward(dense, ids, host_ids), labels);
      loss.backward();
      dist::all_gather_sparse_grads(model->tables->parameters());
      opt.step();
      if (table_opt) table_opt->step();
      return loss.detach();
    };

    if (timing) {
      // The batches of every step, made first (the generator runs on the host, and is not what is measured):
      // dense, ids and labels on the device, the ids on the host too.
      const auto data_start = std::chrono::steady_clock::now();
      const int64_t total = bench_warmup + bench_steps;
      struct DeviceBatch {
        Tensor dense, ids, host_ids, labels;
      };
      std::vector<DeviceBatch> batches;
      std::vector<int64_t> touched;  // per timed step: the distinct rows it looks up, over all tables
      int64_t largest = 0;           // the largest table
      for (size_t t = 1; t < rows.size(); ++t)
        largest = rows[t] > rows[static_cast<size_t>(largest)] ? int64_t(t) : largest;
      double touched_largest = 0;
      for (int64_t step = 0; step < total; ++step) {
        const Batch b =
            generate(data_seed, (step * env.world_size + env.rank) * batch_size, batch_size, id_range, zipf);
        batches.push_back({b.dense.to(dev), b.ids.to(dev), b.ids, b.labels.to(dev)});
        if (step < bench_warmup) continue;
        int64_t k = 0;
        for (int64_t t = 0; t < kSparse; ++t) {
          const Tensor col = select(b.ids, 1, t).contiguous();
          std::vector<int64_t> v(col.data_ptr<int64_t>(), col.data_ptr<int64_t>() + col.numel());
          std::sort(v.begin(), v.end());
          const auto distinct = static_cast<int64_t>(std::unique(v.begin(), v.end()) - v.begin());
          k += distinct;
          if (t == largest) touched_largest += static_cast<double>(distinct);
        }
        touched.push_back(k);
      }
      const double data_s = seconds_since(data_start);
      // Every step's loss, written on the device as the steps run (no wait), read after the timing.
      const Tensor losses = zeros({total}, {.device = dev});
      // --profile counts steps from the first warm-up step (e.g. 30,3,5 after 30 warm-up steps); the steps it
      // records are slower, so a run to time takes no --profile.
      ex::StepProfiler profiler(profiling, profiling.trace, env.rank == 0, env.rank, env.world_size);
      auto run = [&](int64_t step) {
        const DeviceBatch& b = batches[static_cast<size_t>(step)];
        const Tensor loss = train_step(b.dense, b.ids, any_hybrid ? b.host_ids : Tensor(), b.labels);
        NoGradGuard no_grad;
        losses.narrow(0, step, 1).copy_(reshape(loss, {1}));
        profiler.step();
      };
      const auto warmup_start = std::chrono::steady_clock::now();
      for (int64_t step = 0; step < bench_warmup; ++step) run(step);
      if (dev.is_cuda()) cuda::synchronize();
      const double warmup_s = seconds_since(warmup_start);
      double gpu_peak_before = NAN;
      if (dev.is_cuda()) {
        gpu_peak_before = static_cast<double>(cuda::memory_stats().peak_allocated_bytes) / (1ull << 30);
        cuda::reset_peak_memory_stats();
      }
      std::vector<double> ms;
      const auto timed_start = std::chrono::steady_clock::now();
      // The timed steps are the range an attached profiler records (bench/kernel_trace.cpp, Nsight's
      // cudaProfilerApi capture range).
      if (dev.is_cuda()) cuda::profiler_start();
      for (int64_t step = bench_warmup; step < total; ++step) {
        if (dev.is_cuda()) {  // the step between two events, then a wait for it: its own time, host gaps included
          cuda::Event start(true), stop(true);
          start.record();
          run(step);
          stop.record();
          stop.synchronize();
          ms.push_back(start.elapsed_ms(stop));
        } else {
          const auto t0 = std::chrono::steady_clock::now();
          run(step);
          ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
      }
      if (dev.is_cuda()) cuda::profiler_stop();
      const double timed_s = seconds_since(timed_start);
      // The verdict: every loss finite, and the mean of the last bench_cycle steps below that of the first ones.
      const Tensor host_losses = losses.to(Device::cpu(), DType::Float64).contiguous();
      const std::vector<double> loss_log(host_losses.data_ptr<double>(), host_losses.data_ptr<double>() + total);
      std::string failed;
      for (int64_t i = 0; i < total && failed.empty(); ++i)
        if (!std::isfinite(loss_log[static_cast<size_t>(i)]))
          failed = "the loss of step " + std::to_string(i) + " is " + json_number(loss_log[static_cast<size_t>(i)], 4);
      const int64_t cycle = std::min<int64_t>(bench_cycle, total / 2);
      double first = 0, last = 0;
      for (int64_t i = 0; i < cycle; ++i) {
        first += loss_log[static_cast<size_t>(i)] / static_cast<double>(cycle);
        last += loss_log[static_cast<size_t>(total - cycle + i)] / static_cast<double>(cycle);
      }
      if (failed.empty() && !(cycle >= 1 && last < first))
        failed = "the loss did not fall: mean " + json_number(last, 4) + " over the last " + std::to_string(cycle) +
                 " steps, " + json_number(first, 4) + " over the first " + std::to_string(cycle);
      std::vector<double> sorted = ms;
      std::sort(sorted.begin(), sorted.end());
      const double median = sorted[sorted.size() / 2];
      const TableMemory mem = table_memory(*model, {&tables_opt});
      const auto [rss, rss_peak] = host_rss_gib();
      const double gib = 1.0 / static_cast<double>(1ull << 30);
      double mean_touched = 0;
      for (int64_t k : touched) mean_touched += static_cast<double>(k) / static_cast<double>(touched.size());
      int64_t hybrid_tables = 0;
      for (bool h : model->is_hybrid) hybrid_tables += h ? 1 : 0;
      const int64_t logical = mem.device_params + mem.device_state + mem.host_params + mem.host_state;
      std::string line = "{\"bench\": \"recsys\", \"framework\": \"kiln\", \"case\": \"" + bench_name + "\"";
      line += ", \"device\": \"" + dev.str() + "\", \"table_sizes\": " + json_list(rows) +
              ", \"embedding_dim\": " + std::to_string(dim) + ", \"bottom_mlp\": " + json_list(config.bottom) +
              ", \"top_mlp\": " + json_list(config.top) + ", \"batch\": " + std::to_string(batch_size) +
              ", \"zipf\": " + json_number(zipf, 3) + ", \"id_rows\": " + std::to_string(id_rows) +
              ", \"table_optimizer\": \"" + table_optimizer + "\", \"table_lr\": " + json_number(tables_lr, 6) +
              ", \"dense_optimizer\": \"sgd\", \"lr\": " + json_number(lr, 6) +
              ", \"hybrid_rows\": " + std::to_string(hybrid_rows) +
              ", \"hybrid_tables\": " + std::to_string(hybrid_tables) +
              ", \"hot_fraction\": " + json_number(hot_fraction, 4) + ", \"hot_rows\": " + std::to_string(hot_rows) +
              ", \"cold_reads\": \"" + cold_reads + "\"";
      line += ", \"warmup\": " + std::to_string(bench_warmup) + ", \"steps\": " + std::to_string(bench_steps) +
              ", \"step_ms\": " + json_number(median, 4) + ", \"step_ms_min\": " + json_number(sorted.front(), 4) +
              ", \"step_ms_max\": " + json_number(sorted.back(), 4) +
              ", \"throughput\": " + json_number(static_cast<double>(batch_size) * 1000.0 / median, 1) +
              ", \"unit\": \"samples/s\", \"timed_s\": " + json_number(timed_s, 3) +
              ", \"rows_touched_per_step\": " + json_number(mean_touched, 1) + ", \"largest_table_rows_touched\": " +
              json_number(touched_largest / static_cast<double>(std::max<size_t>(touched.size(), 1)), 1);
      line += ", \"emb_device_gib\": " +
              json_number(static_cast<double>(mem.device_params + mem.device_state + mem.device_placement) * gib, 4) +
              ", \"emb_device_placement_gib\": " + json_number(static_cast<double>(mem.device_placement) * gib, 4) +
              ", \"emb_device_params_gib\": " + json_number(static_cast<double>(mem.device_params) * gib, 4) +
              ", \"emb_device_state_gib\": " + json_number(static_cast<double>(mem.device_state) * gib, 4) +
              ", \"emb_host_gib\": " + json_number(static_cast<double>(mem.host_params + mem.host_state) * gib, 4) +
              ", \"emb_total_gib\": " + json_number(static_cast<double>(logical) * gib, 4) +
              ", \"hot_gib\": " + json_number(static_cast<double>(mem.hot_params + mem.hot_state) * gib, 4) +
              ", \"cold_gib\": " + json_number(static_cast<double>(mem.cold_params + mem.cold_state) * gib, 4);
      if (dev.is_cuda()) {
        const cuda::MemoryStats st = cuda::memory_stats();
        line += ", \"gpu_allocated_gib\": " + json_number(static_cast<double>(st.allocated_bytes) * gib, 3) +
                ", \"gpu_peak_gib\": " + json_number(static_cast<double>(st.peak_allocated_bytes) * gib, 3) +
                ", \"gpu_peak_setup_gib\": " + json_number(gpu_peak_before, 3) +
                ", \"gpu_reserved_gib\": " + json_number(static_cast<double>(st.reserved_bytes) * gib, 3);
      }
      line += ", \"host_rss_gib\": " + json_number(rss, 3) + ", \"host_peak_rss_gib\": " + json_number(rss_peak, 3) +
              ", \"build_s\": " + json_number(build_s, 2) + ", \"data_s\": " + json_number(data_s, 2) +
              ", \"warmup_s\": " + json_number(warmup_s, 2);
      line += ", \"trained\": " + std::string(failed.empty() ? "true" : "false");
      if (!failed.empty()) line += ", \"failed\": \"" + failed + "\"";
      line += ", \"cycle\": " + std::to_string(cycle) + ", \"loss_first\": " + json_number(first, 4) +
              ", \"loss_last\": " + json_number(last, 4) + ", \"losses\": [";
      for (int64_t i = 0; i < total; ++i) line += (i ? ", " : "") + json_number(loss_log[static_cast<size_t>(i)], 4);
      line += "], \"step_ms_all\": [";
      for (size_t i = 0; i < ms.size(); ++i) line += (i ? ", " : "") + json_number(ms[i], 4);
      line += "]}";
      if (env.is_main()) std::printf("%s\n", line.c_str());
      if (!failed.empty()) std::fprintf(stderr, "recsys: the run did not train: %s\n", failed.c_str());
      return failed.empty() ? 0 : 1;
    }

    io::Metadata metadata;
    int64_t start = 0;
    if (resume) {
      io::load_checkpoint(checkpoint, {.model = model.get(), .optimizer = &opt, .metadata = &metadata});
      KILN_CHECK(metadata.numbers.count("step") == 1, checkpoint, ": no step in its metadata; not a recsys checkpoint");
      start = static_cast<int64_t>(metadata.numbers.at("step"));
      std::printf("resumed from %s at step %lld\n", checkpoint.c_str(), static_cast<long long>(start));
    }

    // The held-out samples come from the end of the stream, far from any training step's.
    const int64_t eval_first = int64_t{1} << 40;
    auto evaluate = [&] {
      NoGradGuard no_grad;
      model->eval();
      std::vector<float> scores, labels;
      for (int64_t i = 0; i < eval_size; i += 4096) {
        const int64_t n = std::min<int64_t>(4096, eval_size - i);
        const Batch b = generate(data_seed, eval_first + i, n, id_range, zipf);
        const std::vector<float> s = to_floats(model->forward(b.dense.to(dev), b.ids.to(dev), b.ids));
        const std::vector<float> l = to_floats(b.labels);
        scores.insert(scores.end(), s.begin(), s.end());
        labels.insert(labels.end(), l.begin(), l.end());
      }
      model->train();
      return auc(scores, labels);
    };

    Tensor loss_sum = zeros({}, {.device = dev});
    for (int64_t step = start; step < steps; ++step) {
      // Each rank takes its own batch_size samples of the step: the global batch is batch_size * world size.
      const int64_t first = (step * env.world_size + env.rank) * batch_size;
      const Batch b = generate(data_seed, first, batch_size, id_range, zipf);
      loss_sum.add_(train_step(b.dense.to(dev), b.ids.to(dev), b.ids, b.labels.to(dev)));
      if ((step + 1) % log_every == 0) {
        if (env.is_main())
          std::printf("step %6lld  loss %.4f (rank 0's batches)\n", static_cast<long long>(step + 1),
                      loss_sum.item<double>() / static_cast<double>(log_every));
        loss_sum.zero_();
      }
    }
    const double final_auc = evaluate();
    if (env.is_main())
      std::printf("AUC on %lld held-out samples: %.4f\n", static_cast<long long>(eval_size), final_auc);
    const uint64_t mine = digest(model->parameters());
    if (env.distributed()) {
      // The hybrid tables' counts take every rank's lookups since the hot set was chosen (what a checkpoint saves).
      for (size_t t = 0; t < model->is_hybrid.size(); ++t) {
        if (model->is_hybrid[t]) model->tables->at<nn::HybridEmbedding>(static_cast<int64_t>(t))->agree_counts();
      }
      // The replicas must agree: every rank's digest of its parameters and buffers (the hybrid tables' placement and
      // counts), gathered (as two 32-bit halves, exact in int64).
      std::vector<Tensor> state = model->parameters();
      for (const Tensor& b : model->buffers()) state.push_back(b);
      const uint64_t replica = digest(state);
      const Tensor halves = from_vector(
          std::vector<int64_t>{static_cast<int64_t>(replica >> 32), static_cast<int64_t>(replica & 0xffffffffull)},
          {2});
      const Tensor all = empty({env.world_size, 2}, {.dtype = DType::Int64});
      dist::group(Device::cpu()).all_gather(all, halves);
      const Tensor same = all.eq(unsqueeze(halves, 0)).all();
      KILN_CHECK(same.item<bool>(), "the ranks' parameters or hybrid tables' placements differ after training: the ",
                 "replicas drifted apart");
      if (env.is_main()) {
        std::printf("replicas: the same parameters on all %d ranks", env.world_size);
        if (any_hybrid) std::printf(", and the same placement and counts of the hybrid tables");
        std::printf("\n");
      }
    }
    if (env.is_main()) std::printf("parameters digest %016llx\n", static_cast<unsigned long long>(mine));
    if (!checkpoint.empty() && env.is_main()) {
      metadata.numbers["step"] = static_cast<double>(std::max(start, steps));
      io::save_checkpoint(checkpoint, {.model = model.get(), .optimizer = &opt, .metadata = &metadata});
      std::printf("saved %s\n", checkpoint.c_str());
    }
    if (final_auc < target) {
      std::printf("AUC %.4f is below --target-auc %.4f\n", final_auc, target);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recsys: %s\n", e.what());
    return 1;
  }
}
