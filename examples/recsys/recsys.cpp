// examples/recsys/recsys.cpp — a DLRM-style click-through model trained on generated Criteo-shaped data.
//
// Each sample has 13 dense features and 26 categorical ones (ids into 26 embedding tables), and a click label.
// The data come from a seeded generator in this file: ids follow Zipf(--zipf) over each table (a few rows are
// looked up most of the time, as in real logs), and the label is drawn from a hidden logistic model of the
// features, so there is something to learn and the best possible AUC is well above 0.5. The model is the DLRM
// recipe: a bottom MLP for the dense features, one embedding table per categorical feature with row-sparse
// gradients, the pairwise dot products of all 27 vectors, and a top MLP; the loss is binary cross-entropy. The
// embedding tables are trained by optim::SGD on their sparse gradients, so a step costs what its looked-up rows
// cost, whatever the tables' sizes.
//
//   ./build/examples/recsys/recsys                                  # small tables, on the CPU in about 20 s
//   ./build/examples/recsys/recsys --table-sizes 1000,100000,10000000 --embedding-dim 64 --device cuda
//   ./build/examples/recsys/recsys --checkpoint runs/rs/ckpt.h5 --steps 400   # then again with --resume
//   mpirun -np 2 ./build/examples/recsys/recsys --device cpu                    # the MLPs data-parallel
//   mpirun -np 2 ./build/examples/recsys/recsys --device cpu --hybrid-rows 100000   # one hot set for all ranks
#include <kiln/kiln.h>  // Tensor, nn::, optim::, io::

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <sstream>

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

// (B, 13) dense and (B, 26) ids -> (B) logits.
// Tables of at least `hybrid_rows` rows are nn::HybridEmbedding (hot_fraction of their rows on `device`, the rest
// in host memory, the hot set from the lookups of the first 20 steps); the others nn::Embedding on `device`. Both
// start from the same draws, so a run's numbers do not depend on where the rows live.
class Dlrm : public nn::Module {
 public:
  Dlrm(const std::vector<int64_t>& rows, int64_t dim, Device device, int64_t hybrid_rows, double hot_fraction,
       uint64_t table_seed)
      : Module("Dlrm") {
    using namespace nn;
    bottom = register_module("bottom", nn::make<Sequential>(Linear(kDense, 64), ReLU(), Linear(64, dim), ReLU()));
    const int64_t vectors = kSparse + 1, pairs = vectors * (vectors - 1) / 2;
    top = register_module("top",
                          nn::make<Sequential>(Linear(dim + pairs, 64), ReLU(), Linear(64, 32), ReLU(), Linear(32, 1)));
    tables = register_module("tables", nn::make<ModuleList>());
    // The tables' values come from a generator of their own: a table's constructor draws its own start from the
    // default one, and a hybrid table draws differently from a plain one.
    Generator table_gen(table_seed);
    for (int64_t r : rows) {
      Tensor weight = empty({r, dim});  // DLRM's initialisation: U(-1/sqrt(rows), 1/sqrt(rows))
      const double bound = 1.0 / std::sqrt(static_cast<double>(r));
      init::uniform_(weight, -bound, bound, &table_gen);
      const bool hybrid = hybrid_rows > 0 && r >= hybrid_rows;
      is_hybrid.push_back(hybrid);
      if (hybrid) {
        auto table = std::make_shared<HybridEmbedding>(
            r, dim, HybridEmbeddingOptions{.device = device, .hot_fraction = hot_fraction, .count_batches = 20});
        table->load_state_dict({{"weight", weight}}, /*strict=*/false);
        tables->push_back(table);
      } else {
        auto table = std::make_shared<Embedding>(r, dim, EmbeddingOptions{.sparse = true});
        NoGradGuard no_grad;
        table->weight.copy_(weight);
        tables->push_back(table);
      }
    }
    // The strictly lower triangle of the (27, 27) dot products, as positions in the flattened matrix.
    std::vector<int64_t> lower;
    for (int64_t i = 0; i < vectors; ++i) {
      for (int64_t j = 0; j < i; ++j) lower.push_back(i * vectors + j);
    }
    pair_index = from_vector(lower, {pairs});
  }

  Tensor forward(const Tensor& dense, const Tensor& ids) {
    const int64_t b = dense.size(0);
    const Tensor x = bottom(dense);  // (B, D)
    std::vector<Tensor> vectors{x};
    for (int64_t t = 0; t < kSparse; ++t) {
      const Tensor column = select(ids, 1, t);  // (B)
      vectors.push_back(is_hybrid[static_cast<size_t>(t)] ? tables->at<nn::HybridEmbedding>(t)(column)
                                                          : tables->at<nn::Embedding>(t)(column));
    }
    const Tensor all = stack(vectors, 1);                                      // (B, 27, D)
    const Tensor dots = reshape(bmm(all, transpose(all, 1, 2)), {b, -1});      // (B, 27 * 27)
    const Tensor pairs = index_select(dots, 1, pair_index.to(dots.device()));  // (B, 351)
    return reshape(top(cat({x, pairs}, 1)), {b});                              // (B)
  }

  nn::Handle<nn::Sequential> bottom, top;
  nn::Handle<nn::ModuleList> tables;
  std::vector<bool> is_hybrid;  // per table: an nn::HybridEmbedding
  Tensor pair_index;

 private:
  using nn::Module::forward;
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

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> sizes;
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
    KILN_CHECK(used == item.size() && v > 0, "--table-sizes: '", item,
               "' is not a positive number of rows; give a comma-separated list such as 1000,100000");
    sizes.push_back(v);
  }
  KILN_CHECK(!sizes.empty() && static_cast<int64_t>(sizes.size()) <= kSparse, "--table-sizes: give 1 to ", kSparse,
             " sizes (they repeat over the 26 tables)");
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < kSparse; ++t) rows.push_back(sizes[static_cast<size_t>(t) % sizes.size()]);
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  ex::Options opts("recsys", "Trains a DLRM-style click-through model on generated Criteo-shaped data.");
  auto& table_sizes = opts.add_string("table-sizes", "1000,10000,100000",
                                      "rows of the embedding tables, comma-separated, repeated over the 26 tables");
  auto& dim = opts.add_int("embedding-dim", 16, "the length of every embedding row");
  auto& zipf = opts.add_double("zipf", 1.05, "the exponent of the ids' Zipf distribution");
  auto& steps = opts.add_int("steps", 600, "training steps");
  auto& batch_size = opts.add_int("batch-size", 256, "samples per step");
  auto& lr = opts.add_double("lr", 1.0, "SGD's learning rate (DLRM's recipe: plain SGD for every parameter)");
  auto& eval_size = opts.add_int("eval-size", 20000, "held-out samples for the AUC");
  auto& target = opts.add_double("target-auc", 0.0, "exit with status 1 if the final AUC is below this");
  auto& device_name = opts.add_string("device", "auto", "auto | cpu | cuda");
  auto& seed = opts.add_int("seed", 0, "seed of the data and the weights");
  auto& log_every = opts.add_int("log-every", 100, "print the mean loss every this many steps");
  auto& hybrid_rows = opts.add_int("hybrid-rows", 0,
                                   "tables of at least this many rows keep only --hot-fraction of them on the device "
                                   "(nn::HybridEmbedding); 0: every table whole on the device");
  auto& hot_fraction = opts.add_double("hot-fraction", 0.1, "the share of a hybrid table's rows on the device");
  auto& checkpoint = opts.add_string("checkpoint", "", "save the model, optimizer and step to this file at the end");
  auto& resume = opts.add_flag("resume", "continue from --checkpoint (exactly: the data stream resumes too)");
  opts.parse(argc, argv);
  if (dim < 1 || steps < 0 || batch_size < 1 || eval_size < 2 || log_every < 1) {
    opts.fail("--embedding-dim, --batch-size and --log-every must be at least 1, --steps at least 0, --eval-size 2");
  }
  if (!(lr > 0) || !(zipf > 0)) opts.fail("--lr and --zipf must be positive");
  if (resume && checkpoint.empty()) opts.fail("--resume needs --checkpoint");
  if (hybrid_rows < 0 || !(hot_fraction >= 0 && hot_fraction <= 1)) {
    opts.fail("--hybrid-rows must be >= 0 and --hot-fraction in [0, 1]");
  }

  try {
    const std::vector<int64_t> rows = parse_sizes(table_sizes);
    const dist::Env& env = dist::init();
    const Device dev = ex::pick_device(device_name, env);
    const auto data_seed = static_cast<uint64_t>(seed);
    manual_seed(data_seed);
    auto model = nn::make<Dlrm>(rows, dim, dev, hybrid_rows, hot_fraction, data_seed + 1);
    model->to(dev);
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
    optim::SGD opt(model->parameters(), {.lr = lr});
    // Under mpirun: the MLPs data-parallel (DataParallel averages their gradients during backward, and broadcasts
    // rank 0's weights now); the tables replicated, their sparse gradients averaged by all_gather_sparse_grads.
    // With one process both are no-ops.
    std::unique_ptr<dist::DataParallel> bottom_ddp, top_ddp;
    if (env.distributed()) {
      bottom_ddp = std::make_unique<dist::DataParallel>(model->bottom);
      top_ddp = std::make_unique<dist::DataParallel>(model->top);
      for (const Tensor& table : model->tables->parameters()) dist::broadcast(table);
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
        const Batch b = generate(data_seed, eval_first + i, n, rows, zipf);
        const std::vector<float> s = to_floats(model->forward(b.dense.to(dev), b.ids.to(dev)));
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
      const Batch b = generate(data_seed, first, batch_size, rows, zipf);
      opt.zero_grad();
      const Tensor loss =
          nn::binary_cross_entropy_with_logits(model->forward(b.dense.to(dev), b.ids.to(dev)), b.labels.to(dev));
      loss.backward();
      dist::all_gather_sparse_grads(model->tables->parameters());
      opt.step();
      loss_sum.add_(loss.detach());
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
        const bool hybrid = std::count(model->is_hybrid.begin(), model->is_hybrid.end(), true) > 0;
        if (hybrid) std::printf(", and the same placement and counts of the hybrid tables");
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
