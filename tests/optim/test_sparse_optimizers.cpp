// tests/optim/test_sparse_optimizers.cpp — row-sparse gradients (kiln/autograd/sparse_grad.h) in the optimizers:
// SGD (plain and PyTorch's sparse momentum), SparseAdam and RowWiseAdagrad against float64 references written here
// (per-row loops over std::map, independent of kiln's ops) and against the dense path where the semantics coincide;
// rows outside the gradient keep their bits; state_dict round trips and exact resume; the refusals; clip_grad_norm_
// and amp::GradScaler with sparse gradients; nn::Embedding({.sparse = true}) end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include <unistd.h>  // getpid: a temporary file name per process

#include "kiln/autograd/sparse_grad.h"
#include "kiln/io/checkpoint.h"
#include "kiln/kiln.h"
#include "kiln/optim/rowwise_adagrad.h"
#include "kiln/optim/sparse_adam.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using Rows = std::vector<int64_t>;
using Table = std::vector<double>;  // (V, D) row-major, float64 reference values

// One step's gradient: rows (may repeat) and their values (K, D) row-major.
struct StepGrad {
  Rows rows;
  std::vector<double> values;
};

Tensor table_param(int64_t v, int64_t d, uint64_t seed, DType dtype = DType::Float64) {
  return make(uniform(v * d, -1, 1, seed), {v, d}, {.dtype = dtype}).requires_grad_();
}

SparseRowGrad sparse_of(const Tensor& p, const StepGrad& g) {
  const int64_t k = static_cast<int64_t>(g.rows.size());
  Shape vshape = p.shape();
  vshape[0] = k;
  std::vector<double> rows(g.rows.begin(), g.rows.end());
  return SparseRowGrad{.indices = make(rows, {k}, {.dtype = DType::Int64}),
                       .values = make(g.values, vshape, {.dtype = p.dtype()}),
                       .dense_shape = p.shape()};
}

// Adds the step's rows to p's sparse gradient in two backward-like calls when it has more than one row, so that
// the optimizers see an uncoalesced, appended gradient.
void give_sparse(const Tensor& p, const StepGrad& g) {
  const int64_t d = p.numel() / p.size(0);
  if (g.rows.size() < 2) {
    autograd::accumulate_sparse_grad(p, sparse_of(p, g));
    return;
  }
  const size_t half = g.rows.size() / 2;
  StepGrad a{Rows(g.rows.begin(), g.rows.begin() + half),
             std::vector<double>(g.values.begin(), g.values.begin() + static_cast<int64_t>(half) * d)};
  StepGrad b{Rows(g.rows.begin() + half, g.rows.end()),
             std::vector<double>(g.values.begin() + static_cast<int64_t>(half) * d, g.values.end())};
  autograd::accumulate_sparse_grad(p, sparse_of(p, a));
  autograd::accumulate_sparse_grad(p, sparse_of(p, b));
}

// The coalesced gradient as row -> summed values (float64).
std::map<int64_t, std::vector<double>> summed(const StepGrad& g, int64_t d) {
  std::map<int64_t, std::vector<double>> out;
  for (size_t i = 0; i < g.rows.size(); ++i) {
    auto& row = out[g.rows[i]];
    row.resize(static_cast<size_t>(d), 0.0);
    for (int64_t j = 0; j < d; ++j) row[static_cast<size_t>(j)] += g.values[i * static_cast<size_t>(d) + j];
  }
  return out;
}

// The dense (V, D) gradient of a step.
Tensor dense_of(const StepGrad& g, int64_t v, int64_t d, DType dtype = DType::Float64) {
  std::vector<double> dense(static_cast<size_t>(v * d), 0.0);
  for (const auto& [row, vals] : summed(g, d)) {
    for (int64_t j = 0; j < d; ++j) dense[static_cast<size_t>(row * d + j)] = vals[static_cast<size_t>(j)];
  }
  return make(dense, {v, d}, {.dtype = dtype});
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const std::vector<double> x = values(a), y = values(b);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_TRUE(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))
        << what << ": element " << i << " is " << x[i] << " vs " << y[i];
  }
}

// Rows of a (V, D...) tensor's values, other than `skip`, bit for bit against a snapshot.
void expect_rows_unchanged(const std::vector<double>& before, const Tensor& after, int64_t v,
                           const std::set<int64_t>& changed, const std::string& what) {
  const std::vector<double> now = values(after);
  ASSERT_EQ(now.size(), before.size()) << what;
  const size_t d = now.size() / static_cast<size_t>(v);
  for (int64_t r = 0; r < v; ++r) {
    if (changed.count(r)) continue;
    for (size_t j = 0; j < d; ++j) {
      const size_t i = static_cast<size_t>(r) * d + j;
      EXPECT_EQ(std::memcmp(&now[i], &before[i], sizeof(double)), 0)
          << what << ": row " << r << " changed from " << before[i] << " to " << now[i];
    }
  }
}

const std::vector<StepGrad> kSteps = {
    // V = 6, D = 3: repeats, rows touched in some steps only, row 4 never.
    {{0, 3, 3}, {0.5, -1, 2, 0.25, 0.5, -0.75, 1, -2, 0.125}},
    {{2}, {-0.5, 0.3, 0.7}},
    {{5, 0, 5}, {0.1, 0.2, -0.3, -1.5, 0.25, 0.5, 0.9, -0.4, 0.6}},
};
constexpr int64_t kV = 6, kD = 3;

// ---------------------------------------------------------------- SGD

TEST(SparseSgd, PlainSumsDuplicatesAndMatchesTheDensePath) {
  for (const bool maximize : {false, true}) {
    Tensor p = table_param(kV, kD, 3), q = p.detach().clone().requires_grad_();
    Table ref = values(p);
    optim::SGD sparse({p}, {.lr = 0.3, .maximize = maximize});
    optim::SGD dense({q}, {.lr = 0.3, .maximize = maximize});
    for (const StepGrad& g : kSteps) {
      give_sparse(p, g);
      EXPECT_FALSE(p.grad().defined());
      q.mutable_grad() = dense_of(g, kV, kD);
      sparse.step();
      dense.step();
      for (const auto& [row, vals] : summed(g, kD)) {
        for (int64_t j = 0; j < kD; ++j) ref[static_cast<size_t>(row * kD + j)] -= (maximize ? -0.3 : 0.3) * vals[j];
      }
      expect_values(p, {kV, kD}, ref, 1e-15, 1e-15);
      expect_same_bits(p, q, "sparse vs dense SGD");
      sparse.zero_grad();
      EXPECT_FALSE(autograd::has_sparse_grad(p));
    }
  }
}

// PyTorch's SGD with a sparse gradient: the buffer is a sparse tensor whose rows are every row ever touched
// (a row -> values map here); first step buf = g, then buf = momentum * buf + (1 - dampening) * g over the union,
// and p -= lr * (nesterov ? g + momentum * buf : buf) on those rows.
struct SgdCase {
  double momentum, dampening;
  bool nesterov, maximize;
};

TEST(SparseSgd, MomentumKeepsTheUnionOfRowsAsPyTorchAndMatchesTheDensePath) {
  const double lr = 0.2;
  for (const SgdCase c :
       {SgdCase{0.9, 0.0, false, false}, SgdCase{0.8, 0.3, false, true}, SgdCase{0.7, 0.0, true, false}}) {
    Tensor p = table_param(kV, kD, 5), q = p.detach().clone().requires_grad_();
    Table ref = values(p);
    std::map<int64_t, std::vector<double>> buf;  // the sparse momentum buffer
    const optim::SGDOptions o{
        .lr = lr, .momentum = c.momentum, .dampening = c.dampening, .nesterov = c.nesterov, .maximize = c.maximize};
    optim::SGD sparse({p}, o), dense({q}, o);
    bool first = true;
    for (const StepGrad& g : kSteps) {
      give_sparse(p, g);
      q.mutable_grad() = dense_of(g, kV, kD);
      sparse.step();
      dense.step();
      // Reference.
      auto gs = summed(g, kD);
      if (c.maximize) {
        for (auto& [r, vals] : gs) {
          for (double& x : vals) x = -x;
        }
      }
      if (first) {
        buf = gs;
      } else {
        for (auto& [r, vals] : buf) {
          for (double& x : vals) x *= c.momentum;
        }
        for (const auto& [r, vals] : gs) {
          auto& b = buf[r];
          b.resize(kD, 0.0);
          for (int64_t j = 0; j < kD; ++j) b[j] += (1 - c.dampening) * vals[j];
        }
      }
      first = false;
      for (const auto& [r, b] : buf) {
        for (int64_t j = 0; j < kD; ++j) {
          const double gj = gs.count(r) ? gs.at(r)[j] : 0.0;
          const double d = c.nesterov ? gj + c.momentum * b[j] : b[j];
          ref[static_cast<size_t>(r * kD + j)] -= lr * d;
        }
      }
      expect_values(p, {kV, kD}, ref, 1e-14, 1e-14);
      expect_same_bits(p, q, "sparse vs dense SGD momentum");
      expect_same_bits(sparse.state(p).at("momentum_buffer"), dense.state(q).at("momentum_buffer"), "buffers");
      // The rows ever touched, sorted.
      std::vector<double> rows;
      for (const auto& [r, b] : buf) rows.push_back(static_cast<double>(r));
      expect_values(sparse.state_dict().tensors.at("state.0.momentum_rows"), {static_cast<int64_t>(rows.size())}, rows,
                    0, 0);
      // Live, they are a mask over the rows.
      std::vector<double> mask(static_cast<size_t>(kV), 0.0);
      for (const double r : rows) mask[static_cast<size_t>(r)] = 1.0;
      expect_values(sparse.state(p).at("momentum_mask"), {kV}, mask, 0, 0);
      sparse.zero_grad();
      dense.zero_grad();
    }
    EXPECT_EQ(sparse.state(p).at("step").item<float>(), 3.0f);
  }
}

// Dense and sparse steps mixed on one parameter: after a dense step the buffer is dense (every row), and a sparse
// step after it updates every row as the dense step would; a dense step after sparse ones covers every row too.
TEST(SparseSgd, DenseAndSparseStepsMixAsTheDensePath) {
  for (const bool dense_first : {true, false}) {
    Tensor p = table_param(kV, kD, 31), q = p.detach().clone().requires_grad_();
    const optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .dampening = 0.2};
    optim::SGD mixed({p}, o), dense({q}, o);
    for (size_t s = 0; s < kSteps.size(); ++s) {
      const bool dense_step = (s == 0) == dense_first;
      if (dense_step) {
        p.mutable_grad() = dense_of(kSteps[s], kV, kD);
      } else {
        give_sparse(p, kSteps[s]);
      }
      q.mutable_grad() = dense_of(kSteps[s], kV, kD);
      mixed.step();
      dense.step();
      expect_same_bits(p, q, "mixed vs dense SGD, step " + std::to_string(s));
      mixed.zero_grad();
      dense.zero_grad();
    }
    EXPECT_FALSE(mixed.state(p).count("momentum_rows"));  // dense since the dense step
    EXPECT_FALSE(mixed.state(p).count("momentum_mask"));
  }
}

// The usual setup: dense parameters with weight decay in one group, the table without in another.
TEST(SparseSgd, WeightDecayIsCheckedPerGroup) {
  Tensor w = make({1, -2}, {2}, {.dtype = DType::Float64}).requires_grad_();
  Tensor p = table_param(kV, kD, 39);
  Table ref = values(p);
  optim::SGD opt(
      {{.params = {w}, .options = {.lr = 0.1, .weight_decay = 0.5}}, {.params = {p}, .options = {.lr = 0.2}}});
  w.mutable_grad() = make({1, 1}, {2}, {.dtype = DType::Float64});
  give_sparse(p, kSteps[0]);
  opt.step();
  expect_values(w, {2}, {1 - 0.1 * (1 + 0.5 * 1), -2 - 0.1 * (1 + 0.5 * -2)}, 1e-15, 1e-15);
  for (const auto& [row, vals] : summed(kSteps[0], kD)) {
    for (int64_t j = 0; j < kD; ++j) ref[static_cast<size_t>(row * kD + j)] -= 0.2 * vals[j];
  }
  expect_values(p, {kV, kD}, ref, 1e-15, 1e-15);
}

// ---------------------------------------------------------------- SparseAdam

// Lazy Adam in float64 (torch.optim.SparseAdam): one step count per parameter; only the gradient's rows move.
struct LazyAdamRef {
  double lr, beta1, beta2, eps;
  bool maximize = false;
  Table p, m, v;
  int64_t d;
  int t = 0;
  void step(const StepGrad& g) {
    ++t;
    const double step_size = lr * std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t));
    for (const auto& [r, vals] : summed(g, d)) {
      for (int64_t j = 0; j < d; ++j) {
        const size_t i = static_cast<size_t>(r * d + j);
        const double gj = maximize ? -vals[j] : vals[j];
        m[i] = beta1 * m[i] + (1 - beta1) * gj;
        v[i] = beta2 * v[i] + (1 - beta2) * gj * gj;
        p[i] -= step_size * m[i] / (std::sqrt(v[i]) + eps);
      }
    }
  }
};

TEST(SparseAdam, MatchesLazyAdamReferenceWithRepeatsAndPartialRows) {
  for (const bool maximize : {false, true}) {
    Tensor p = table_param(kV, kD, 7);
    optim::SparseAdam opt({p}, {.lr = 0.05, .betas = {0.8, 0.95}, .eps = 1e-3, .maximize = maximize});
    LazyAdamRef ref{0.05, 0.8, 0.95, 1e-3, maximize, values(p), Table(kV * kD, 0.0), Table(kV * kD, 0.0), kD};
    for (const StepGrad& g : kSteps) {
      give_sparse(p, g);
      opt.step();
      ref.step(g);
      expect_values(p, {kV, kD}, ref.p, 1e-13, 1e-14);
      expect_values(opt.state(p).at("exp_avg"), {kV, kD}, ref.m, 1e-13, 1e-15);
      expect_values(opt.state(p).at("exp_avg_sq"), {kV, kD}, ref.v, 1e-13, 1e-15);
      opt.zero_grad();
    }
    EXPECT_EQ(opt.state(p).at("step").item<float>(), 3.0f);
  }
}

// float32 tables: state float32, the same reference within float32 rounding.
TEST(SparseAdam, Float32Table) {
  Tensor p = table_param(kV, kD, 9, DType::Float32);
  optim::SparseAdam opt({p}, {.lr = 0.05});
  LazyAdamRef ref{0.05, 0.9, 0.999, 1e-8, false, values(p), Table(kV * kD, 0.0), Table(kV * kD, 0.0), kD};
  for (const StepGrad& g : kSteps) {
    give_sparse(p, g);
    opt.step();
    ref.step(g);
    opt.zero_grad();
  }
  expect_values(p, {kV, kD}, ref.p, 1e-5, 1e-6);
  EXPECT_EQ(opt.state(p).at("exp_avg").dtype(), DType::Float32);
}

// A bfloat16 table: state and math in float32, the rows rounded once per step; other rows keep their bits.
TEST(SparseAdam, BFloat16TableKeepsFloat32State) {
  Tensor p = table_param(kV, kD, 33, DType::BFloat16);
  optim::SparseAdam opt({p}, {.lr = 0.05});
  LazyAdamRef ref{0.05, 0.9, 0.999, 1e-8, false, values(p), Table(kV * kD, 0.0), Table(kV * kD, 0.0), kD};
  const Table before = values(p);
  give_sparse(p, kSteps[0]);
  opt.step();
  ref.step(kSteps[0]);
  EXPECT_EQ(opt.state(p).at("exp_avg").dtype(), DType::Float32);
  EXPECT_EQ(p.dtype(), DType::BFloat16);
  expect_values(p, {kV, kD}, ref.p, 1e-2, 1e-2);
  expect_rows_unchanged(before, p, kV, {0, 3}, "bfloat16 rows outside the gradient");
}

// A gradient that holds no row (a batch that looked nothing up): nothing moves, the step count advances (PyTorch).
TEST(SparseAdam, EmptyGradientMovesNothing) {
  Tensor p = table_param(kV, kD, 35);
  const Table before = values(p);
  optim::SparseAdam adam({p});
  autograd::accumulate_sparse_grad(p, sparse_of(p, {{}, {}}));
  adam.step();
  expect_values(p, {kV, kD}, before, 0, 0);
  EXPECT_EQ(adam.state(p).at("step").item<float>(), 1.0f);
  optim::SGD sgd({p}, {.lr = 0.1, .momentum = 0.9});
  sgd.step();  // the first step: an empty buffer
  give_sparse(p, kSteps[1]);
  sgd.step();  // the union is row 2's
  expect_rows_unchanged(before, p, kV, {2}, "SGD after an empty gradient");
  expect_values(sgd.state_dict().tensors.at("state.0.momentum_rows"), {1}, {2}, 0, 0);
}

// ---------------------------------------------------------------- RowWiseAdagrad

struct RowWiseRef {
  double lr, eps, weight_decay = 0;
  bool maximize = false;
  Table p, sum;  // sum: (V)
  int64_t d;
  // One step over the given rows (-> summed gradient rows).
  void step(const std::map<int64_t, std::vector<double>>& rows) {
    for (const auto& [r, vals] : rows) {
      std::vector<double> g(static_cast<size_t>(d));
      double ms = 0;
      for (int64_t j = 0; j < d; ++j) {
        g[j] = (maximize ? -vals[j] : vals[j]) + weight_decay * p[static_cast<size_t>(r * d + j)];
        ms += g[j] * g[j];
      }
      sum[static_cast<size_t>(r)] += ms / static_cast<double>(d);
      for (int64_t j = 0; j < d; ++j) {
        p[static_cast<size_t>(r * d + j)] -= lr * g[j] / (std::sqrt(sum[static_cast<size_t>(r)]) + eps);
      }
    }
  }
};

TEST(RowWiseAdagrad, SparseMatchesReference) {
  for (const bool maximize : {false, true}) {
    Tensor p = table_param(kV, kD, 11);
    optim::RowWiseAdagrad opt({p}, {.lr = 0.1, .eps = 1e-6, .maximize = maximize});
    RowWiseRef ref{0.1, 1e-6, 0, maximize, values(p), Table(kV, 0.0), kD};
    for (const StepGrad& g : kSteps) {
      give_sparse(p, g);
      opt.step();
      ref.step(summed(g, kD));
      expect_values(p, {kV, kD}, ref.p, 1e-13, 1e-14);
      expect_values(opt.state(p).at("sum"), {kV}, ref.sum, 1e-13, 1e-15);
      opt.zero_grad();
    }
  }
}

TEST(RowWiseAdagrad, DefaultsAreAdagradsAndDenseGradientsTouchEveryRow) {
  const optim::RowWiseAdagradOptions defaults;
  EXPECT_EQ(defaults.lr, 0.01);
  EXPECT_EQ(defaults.eps, 1e-10);
  EXPECT_EQ(defaults.weight_decay, 0.0);
  // A 3-D parameter (rows of 2 x 2) with weight decay, and a 1-D one (rows of one element).
  Tensor a = make(uniform(12, -1, 1, 13), {3, 2, 2}, {.dtype = DType::Float64}).requires_grad_();
  Tensor b = make({0.5, -0.25, 2}, {3}, {.dtype = DType::Float64}).requires_grad_();
  optim::RowWiseAdagrad opt({a, b}, {.lr = 0.2, .eps = 1e-8, .weight_decay = 0.1});
  RowWiseRef ra{0.2, 1e-8, 0.1, false, values(a), Table(3, 0.0), 4};
  RowWiseRef rb{0.2, 1e-8, 0.1, false, values(b), Table(3, 0.0), 1};
  for (int s = 0; s < 3; ++s) {
    const std::vector<double> ga = uniform(12, -2, 2, 20 + s), gb = uniform(3, -2, 2, 30 + s);
    a.mutable_grad() = make(ga, {3, 2, 2}, {.dtype = DType::Float64});
    b.mutable_grad() = make(gb, {3}, {.dtype = DType::Float64});
    opt.step();
    std::map<int64_t, std::vector<double>> rows_a, rows_b;
    for (int64_t r = 0; r < 3; ++r) {
      rows_a[r] = std::vector<double>(ga.begin() + r * 4, ga.begin() + r * 4 + 4);
      rows_b[r] = {gb[r]};
    }
    ra.step(rows_a);
    rb.step(rows_b);
    expect_values(a, {3, 2, 2}, ra.p, 1e-13, 1e-14);
    expect_values(b, {3}, rb.p, 1e-13, 1e-14);
    expect_values(opt.state(a).at("sum"), {3}, ra.sum, 1e-13, 1e-15);
  }
  Tensor scalar = make({1.0}, {}, {.dtype = DType::Float64}).requires_grad_();
  optim::RowWiseAdagrad bad({scalar});
  scalar.mutable_grad() = make({1.0}, {}, {.dtype = DType::Float64});
  expect_error([&] { bad.step(); }, {"RowWiseAdagrad.step", "0-d"});
}

// ---------------------------------------------------------------- O(k): rows outside the gradient keep their bits

TEST(SparseOptimizers, RowsOutsideTheGradientKeepTheirBits) {
  // After the three steps, a step on row 1 only: every other row of the parameter and of every (V, ...) state is
  // unchanged bit for bit (for SGD with momentum: every row outside the rows ever touched, {0, 1, 2, 3, 5}).
  auto run = [](optim::Optimizer& opt, Tensor& p, const std::set<int64_t>& moved) {
    for (const StepGrad& g : kSteps) {
      give_sparse(p, g);
      opt.step();
      opt.zero_grad();
    }
    const std::vector<double> before = values(p);
    std::map<std::string, std::vector<double>> state_before;
    for (const auto& [name, t] : opt.state(p)) {
      if (name != "step" && name != "momentum_rows") state_before[name] = values(t);
    }
    give_sparse(p, {{1}, {3, -2, 1}});
    opt.step();
    expect_rows_unchanged(before, p, kV, moved, opt.name() + " parameter");
    for (const auto& [name, b] : state_before) expect_rows_unchanged(b, opt.state(p).at(name), kV, moved, name);
  };
  {
    Tensor p = table_param(kV, kD, 15);
    optim::SparseAdam opt({p}, {.lr = 0.1});
    run(opt, p, {1});
  }
  {
    Tensor p = table_param(kV, kD, 15);
    optim::RowWiseAdagrad opt({p}, {.lr = 0.1});
    run(opt, p, {1});
  }
  {
    Tensor p = table_param(kV, kD, 15);
    optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
    run(opt, p, {0, 1, 2, 3, 5});  // row 4 was never touched
  }
  {
    Tensor p = table_param(kV, kD, 15);
    optim::SGD opt({p}, {.lr = 0.1});
    run(opt, p, {1});
  }
}

// ---------------------------------------------------------------- nn::Embedding end to end

TEST(SparseOptimizers, EmbeddingEndToEndWithSparseAdamAndSgd) {
  const int64_t v = 8, d = 3;
  const std::vector<double> ids = {1, 5, 1, 7};
  const std::vector<double> coef = uniform(4 * d, -1, 1, 17);  // loss = sum(emb(ids) * coef)
  // d loss / d weight[r] = sum of coef rows i with ids[i] == r.
  StepGrad g{{1, 5, 1, 7}, coef};
  for (int which = 0; which < 2; ++which) {
    auto emb = std::make_shared<nn::Embedding>(v, d, nn::EmbeddingOptions{.sparse = true});
    emb->to(DType::Float64);
    const Table w0 = values(emb->weight);
    std::unique_ptr<optim::Optimizer> opt;
    if (which == 0) {
      opt = std::make_unique<optim::SparseAdam>(emb->parameters(), optim::SparseAdamOptions{.lr = 0.1});
    } else {
      opt = std::make_unique<optim::SGD>(emb->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.5});
    }
    LazyAdamRef adam{0.1, 0.9, 0.999, 1e-8, false, w0, Table(v * d, 0.0), Table(v * d, 0.0), d};
    Table sgd = w0;
    std::map<int64_t, std::vector<double>> buf;
    const Tensor index = make(ids, {2, 2}, {.dtype = DType::Int64});
    const Tensor c = make(coef, {2, 2, d}, {.dtype = DType::Float64});
    for (int s = 0; s < 2; ++s) {
      opt->zero_grad();
      (emb->forward(index) * c).sum().backward();
      EXPECT_FALSE(emb->weight.grad().defined());
      ASSERT_TRUE(autograd::has_sparse_grad(emb->weight));
      opt->step();
      if (which == 0) {
        adam.step(g);
      } else {
        const auto gs = summed(g, d);
        for (const auto& [r, vals] : gs) {
          auto& b = buf[r];
          if (s == 0) {
            b = vals;
          } else {
            for (int64_t j = 0; j < d; ++j) b[j] = 0.5 * b[j] + vals[j];
          }
        }
        for (const auto& [r, b] : buf) {
          for (int64_t j = 0; j < d; ++j) sgd[static_cast<size_t>(r * d + j)] -= 0.1 * b[j];
        }
      }
    }
    expect_values(emb->weight, {v, d}, which == 0 ? adam.p : sgd, 1e-13, 1e-14);
  }
}

// ---------------------------------------------------------------- state_dict and exact resume

TEST(SparseOptimizers, StateDictRoundTripGivesAnIdenticalNextStep) {
  auto check = [](auto make_opt, const std::vector<std::string>& keys) {
    Tensor p = table_param(kV, kD, 19);
    auto a = make_opt(p);
    for (size_t s = 0; s < 2; ++s) {
      give_sparse(p, kSteps[s]);
      a.step();
      a.zero_grad();
    }
    const optim::OptimizerState sd = a.state_dict();
    for (const std::string& key : keys) EXPECT_TRUE(sd.tensors.count(key)) << a.name() << " lacks " << key;
    // A fresh optimizer on a copy of the parameter, loaded from copies of the saved tensors.
    Tensor q = p.detach().clone().requires_grad_();
    auto b = make_opt(q);
    optim::OptimizerState copy = sd;
    for (auto& [key, t] : copy.tensors) t = t.clone();
    b.load_state_dict(copy);
    give_sparse(p, kSteps[2]);
    give_sparse(q, kSteps[2]);
    a.step();
    b.step();
    expect_same_bits(p, q, a.name() + " parameter after resume");
    for (const auto& [name, t] : a.state(p)) expect_same_bits(t, b.state(q).at(name), a.name() + " " + name);
  };
  check(
      [](const Tensor& p) {
        return optim::SparseAdam({p}, {.lr = 0.1, .betas = {0.8, 0.9}});
      },
      {"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq"});
  check([](const Tensor& p) { return optim::RowWiseAdagrad({p}, {.lr = 0.1}); }, {"state.0.step", "state.0.sum"});
  check([](const Tensor& p) { return optim::SGD({p}, {.lr = 0.1, .momentum = 0.9, .nesterov = true}); },
        {"state.0.step", "state.0.momentum_buffer", "state.0.momentum_rows"});
}

// Through a checkpoint file (HDF5): SGD's Int64 row list and RowWiseAdagrad's (V) sums come back, and the next step
// is the same bit for bit.
TEST(SparseOptimizers, CheckpointFileResumesExactly) {
  const std::string path = ::testing::TempDir() + "/kiln_sparse_optim_" + std::to_string(::getpid()) + ".h5";
  auto check = [&](auto make_opt) {
    Tensor p = table_param(kV, kD, 37);
    auto a = make_opt(p);
    for (size_t s = 0; s < 2; ++s) {
      give_sparse(p, kSteps[s]);
      a.step();
      a.zero_grad();
    }
    io::save_checkpoint(path, {.optimizer = &a});
    Tensor q = p.detach().clone().requires_grad_();
    auto b = make_opt(q);
    io::load_checkpoint(path, {.optimizer = &b});
    give_sparse(p, kSteps[2]);
    give_sparse(q, kSteps[2]);
    a.step();
    b.step();
    expect_same_bits(p, q, a.name() + " parameter after a checkpoint");
    for (const auto& [name, t] : a.state(p)) {
      EXPECT_EQ(t.dtype(), b.state(q).at(name).dtype()) << name;
      expect_same_bits(t, b.state(q).at(name), a.name() + " " + name);
    }
  };
  check([](const Tensor& p) { return optim::SGD({p}, {.lr = 0.1, .momentum = 0.9}); });
  check([](const Tensor& p) { return optim::RowWiseAdagrad({p}, {.lr = 0.1}); });
  check([](const Tensor& p) { return optim::SparseAdam({p}, {.lr = 0.1}); });
  std::filesystem::remove(path);
}

TEST(SparseOptimizers, OptionsRoundTripAndBadStatesAreRefused) {
  Tensor p = table_param(kV, kD, 21);
  optim::SparseAdam a({p}, {.lr = 0.2, .betas = {0.5, 0.6}, .eps = 1e-4, .maximize = true});
  EXPECT_EQ(a.name(), "SparseAdam");
  Tensor q = table_param(kV, kD, 21);
  optim::SparseAdam b({q});
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.groups()[0].options.betas[1], 0.6);
  EXPECT_EQ(b.groups()[0].options.eps, 1e-4);
  EXPECT_TRUE(b.groups()[0].options.maximize);
  EXPECT_EQ(b.lr(0), 0.2);

  optim::RowWiseAdagrad r({p});
  EXPECT_EQ(r.name(), "RowWiseAdagrad");
  optim::OptimizerState bad = r.state_dict();
  bad.tensors["state.0.sum"] = make({1, 2}, {2}, {.dtype = DType::Float64});
  expect_error([&] { r.load_state_dict(bad); }, {"RowWiseAdagrad.load_state_dict", "state.0.sum", "[2]", "[6, 3]"});
  optim::SGD s({p}, {.lr = 0.1, .momentum = 0.9});
  optim::OptimizerState rows = s.state_dict();
  rows.tensors["state.0.momentum_rows"] = make({3, 1}, {2}, {.dtype = DType::Int64});
  expect_error([&] { s.load_state_dict(rows); }, {"SGD.load_state_dict", "momentum_rows", "sorted, unique"});
  optim::OptimizerState mask = s.state_dict();
  mask.tensors["state.0.momentum_mask"] = make({1, 0, 1}, {3}, {.dtype = DType::Int64});
  expect_error([&] { s.load_state_dict(mask); }, {"SGD.load_state_dict", "state.0.momentum_mask", "(6) Bool"});
  EXPECT_TRUE(s.state(p).empty()) << "a refused state changes nothing";
  EXPECT_TRUE(s.state(p).empty());  // nothing loaded

  // An LR scheduler drives the new optimizers as the others.
  optim::StepLR sched(a, 1, 0.5);
  sched.step();
  EXPECT_DOUBLE_EQ(a.lr(0), 0.1);
}

// ---------------------------------------------------------------- refusals

TEST(SparseOptimizers, RefusalsNameTheOptimizerAndShapeAndChangeNothing) {
  {  // SGD with weight decay
    Tensor p = table_param(kV, kD, 23);
    const Table before = values(p);
    optim::SGD opt({p}, {.lr = 0.1, .weight_decay = 0.01});
    give_sparse(p, kSteps[0]);
    expect_error([&] { opt.step(); }, {"SGD.step", "[6, 3]", "sparse gradient", "weight_decay"});
    expect_values(p, {kV, kD}, before, 0, 0);
  }
  {  // RowWiseAdagrad with weight decay
    Tensor p = table_param(kV, kD, 23);
    optim::RowWiseAdagrad opt({p}, {.weight_decay = 0.01});
    give_sparse(p, kSteps[0]);
    expect_error([&] { opt.step(); }, {"RowWiseAdagrad.step", "[6, 3]", "sparse gradient", "weight_decay"});
  }
  {  // SparseAdam with a dense gradient
    Tensor p = table_param(kV, kD, 23);
    optim::SparseAdam opt({p});
    p.mutable_grad() = dense_of(kSteps[0], kV, kD);
    expect_error([&] { opt.step(); }, {"SparseAdam.step", "[6, 3]", "dense gradient", "optim::Adam"});
    EXPECT_TRUE(opt.state(p).empty());
  }
  {  // Adam, AdamW, LAMB with a sparse gradient, beside a dense parameter that must not move either
    Tensor dense_param = make({1, 2}, {2}, {.dtype = DType::Float64}).requires_grad_();
    Tensor p = table_param(kV, kD, 23);
    optim::Adam adam({dense_param, p});
    optim::AdamW adamw({dense_param, p});
    optim::LAMB lamb({dense_param, p});
    dense_param.mutable_grad() = make({1, 1}, {2}, {.dtype = DType::Float64});
    give_sparse(p, kSteps[0]);
    const std::vector<std::string> takes = {"optim::SGD", "optim::SparseAdam", "optim::RowWiseAdagrad"};
    for (optim::Optimizer* opt : std::vector<optim::Optimizer*>{&adam, &adamw, &lamb}) {
      std::vector<std::string> fragments = {opt->name() + ".step", "[6, 3]", "sparse gradient"};
      fragments.insert(fragments.end(), takes.begin(), takes.end());
      expect_error([&] { opt->step(); }, fragments);
      expect_values(dense_param, {2}, {1, 2}, 0, 0);
      EXPECT_EQ(opt->find_state(dense_param), nullptr);
    }
  }
}

// ---------------------------------------------------------------- clip_grad_norm_

TEST(SparseOptimizers, ClipGradNormCountsCoalescedSparseRowsAndScalesThem) {
  for (const double norm_type : {2.0, 1.0, static_cast<double>(INFINITY)}) {
    Tensor dense_param = make({0, 0, 0, 0}, {4}, {.dtype = DType::Float64}).requires_grad_();
    Tensor p = table_param(kV, kD, 25);
    const std::vector<double> dg = {3, -4, 0.5, 1};
    dense_param.mutable_grad() = make(dg, {4}, {.dtype = DType::Float64});
    // Rows 3 and 3 cancel partly: the norm is of the sums, not of the entries.
    const StepGrad g{{3, 1, 3}, {2, -1, 0.5, 1, 1, 1, -1.5, 2, 0.25}};
    give_sparse(p, g);
    const auto rows = summed(g, kD);
    double total = 0;
    auto add = [&](double x) {
      if (std::isinf(norm_type)) {
        total = std::max(total, std::abs(x));
      } else {
        total += std::pow(std::abs(x), norm_type);
      }
    };
    for (double x : dg) add(x);
    for (const auto& [r, vals] : rows) {
      for (double x : vals) add(x);
    }
    if (!std::isinf(norm_type)) total = std::pow(total, 1 / norm_type);
    const double max_norm = 1.5;
    const Tensor got = optim::clip_grad_norm_({dense_param, p}, max_norm, norm_type);
    EXPECT_NEAR(got.item<double>(), total, 1e-12 * total) << norm_type;
    const double coef = std::min(1.0, max_norm / (total + 1e-6));
    std::vector<double> want_dense, want_rows, want_values;
    for (double x : dg) want_dense.push_back(x * coef);
    expect_values(dense_param.grad(), {4}, want_dense, 1e-13, 1e-15);
    const SparseRowGrad c = autograd::sparse_grad(p)->coalesce();
    for (const auto& [r, vals] : rows) {
      want_rows.push_back(static_cast<double>(r));
      for (double x : vals) want_values.push_back(x * coef);
    }
    expect_values(c.indices, {2}, want_rows, 0, 0);
    expect_values(c.values, {2, kD}, want_values, 1e-13, 1e-15);
  }
  // Only sparse gradients: the total is theirs.
  Tensor p = table_param(kV, kD, 27);
  give_sparse(p, {{2}, {3, 4, 0}});
  EXPECT_NEAR(optim::clip_grad_norm_({p}, 100.0).item<double>(), 5.0, 1e-12);
}

// ---------------------------------------------------------------- amp::GradScaler

TEST(SparseOptimizers, GradScalerUnscalesSparseGradientsAndSkipsOnInf) {
  const int64_t v = 6, d = 2;
  auto emb = std::make_shared<nn::Embedding>(v, d, nn::EmbeddingOptions{.sparse = true});
  const Tensor index = make({4, 1, 4}, {3}, {.dtype = DType::Int64});
  const Tensor c = make({1, -2, 0.5, 3, -1, 0.25}, {3, d});
  optim::SparseAdam opt(emb->parameters(), {.lr = 0.1});
  amp::GradScaler scaler({.init_scale = 1024, .growth_interval = 100});
  // A finite step: unscaled values are the plain gradient's.
  scaler.scale((emb->forward(index) * c).sum()).backward();
  scaler.unscale_(opt);
  const SparseRowGrad g = autograd::sparse_grad(emb->weight)->coalesce();
  expect_values(g.indices, {2}, {1, 4}, 0, 0);
  expect_values(g.values, {2, d}, {0.5, 3, 0, -1.75}, 1e-7, 1e-7);
  const Table before = values(emb->weight);
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(opt.state(emb->weight).at("step").item<float>(), 1.0f);
  expect_rows_unchanged(before, emb->weight, v, {1, 4}, "rows outside the gradient");
  // An inf in the sparse gradient: the step is skipped (parameter and state unchanged) and the scale backs off.
  opt.zero_grad();
  scaler.scale((emb->forward(index) * c).sum()).backward();
  SparseRowGrad bad = *autograd::sparse_grad(emb->weight);
  bad.values = bad.values.clone();
  bad.values.select(0, 1).fill_(INFINITY);
  autograd::set_sparse_grad(emb->weight, bad);
  const Table w1 = values(emb->weight);
  const Table m1 = values(opt.state(emb->weight).at("exp_avg"));
  scaler.step(opt);
  scaler.update();
  expect_values(emb->weight, {v, d}, w1, 0, 0);
  expect_values(opt.state(emb->weight).at("exp_avg"), {v, d}, m1, 0, 0);
  EXPECT_EQ(opt.state(emb->weight).at("step").item<float>(), 1.0f);
  EXPECT_EQ(scaler.get_scale(), 512.0);
}

// step_with on the CPU path (what the GradScaler uses on CUDA): the scale divides the sparse gradient, found_inf skips.
TEST(SparseOptimizers, StepWithDividesByTheScaleAndSkipsOnFoundInf) {
  Tensor p = table_param(kV, kD, 29), q = p.detach().clone().requires_grad_();
  optim::RowWiseAdagrad a({p}, {.lr = 0.1}), b({q}, {.lr = 0.1});
  StepGrad scaled = kSteps[0];
  for (double& x : scaled.values) x *= 8;
  give_sparse(p, scaled);
  give_sparse(q, kSteps[0]);
  a.step_with(make({8}, {1}), make({0}, {1}));
  b.step();
  expect_values(p, {kV, kD}, values(q), 1e-14, 1e-15);
  const Table before = values(p);
  a.zero_grad();
  give_sparse(p, scaled);
  a.step_with(make({8}, {1}), make({1}, {1}));
  expect_values(p, {kV, kD}, before, 0, 0);
  EXPECT_EQ(a.state(p).at("step").item<float>(), 1.0f);
}

}  // namespace
// clip_grad_value_ on a sparse gradient: the coalesced rows clamped, equal to clamping the dense gradient.
TEST(SparseOptimizers, ClipGradValueClampsTheCoalescedRowsAsTheDenseGradient) {
  Tensor p = zeros({5, 2}, {.dtype = DType::Float64});
  p.requires_grad_();
  // Row 1 twice: 0.3 + 0.4 = 0.7 is clamped to 0.5, although neither addend alone would be.
  autograd::accumulate_sparse_grad(p, {from_vector(std::vector<int64_t>{1, 3, 1}, {3}),
                                       from_vector(std::vector<double>{0.3, -2.0, 0.1, 0.2, 0.4, -0.1}, {3, 2}),
                                       {5, 2}});
  const Tensor dense = autograd::sparse_grad(p)->to_dense();
  optim::clip_grad_value_({p}, 0.5);
  const SparseRowGrad* g = autograd::sparse_grad(p);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->coalesced);
  const Tensor want = clamp(dense, -0.5, 0.5);
  const Tensor got = g->to_dense();
  const double* w = want.contiguous().data_ptr<double>();
  const double* x = got.contiguous().data_ptr<double>();
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(x[i], w[i]) << i;
  EXPECT_EQ(x[2], 0.5);  // row 1, first column: 0.7 clamped
}

}  // namespace kiln::testing
