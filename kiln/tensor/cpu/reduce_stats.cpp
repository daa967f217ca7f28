// CPU kernels: var, std, p-norms and logsumexp (floating dtypes), on the row path of reduce_kernel.h.
//
// var and logsumexp take two passes over the input: the mean (or the max) of each output first, then
// the sum of squared deviations from it (or of exp(x - max)). Two passes cost one more read but keep
// float32 accurate where a one-pass sum of squares would cancel catastrophically.
#include <cmath>
#include <limits>

#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/reduce_kernel.h"

namespace kiln::cpu::reduce_detail {
namespace {

// sum((x - center)^2)
template <typename Acc>
struct SquaredDeviationBlock {
  explicit SquaredDeviationBlock(Acc c) : center(c) {}
  Acc center;
  PairwiseSum<Acc> sum;
  void block(const Acc* x, int64_t n) { sum.add((ArrayMap<Acc>(x, n) - center).square().sum()); }
  Acc value() const { return sum.total(); }
  static Acc merge(Acc a, Acc b) { return a + b; }
};

// sum(exp(x - max)); skipped when the max is not finite (the result is then the max itself).
template <typename Acc>
struct ExpBlock {
  explicit ExpBlock(Acc m) : max(m) {}
  Acc max;
  PairwiseSum<Acc> sum;
  void block(const Acc* x, int64_t n) {
    if (std::isfinite(max)) sum.add((ArrayMap<Acc>(x, n) - max).exp().sum());
  }
  Acc value() const { return sum.total(); }
  static Acc merge(Acc a, Acc b) { return a + b; }
};

// sum(|x|^p) for p = 1, 2, 0 (count of nonzeros) or any other p.
template <typename Acc, int kKind>  // kKind: 1, 2, 0, or -1 for a general p
struct PowerSumBlock {
  explicit PowerSumBlock(Acc order = 0) : p(order) {}
  Acc p;
  PairwiseSum<Acc> sum;
  void block(const Acc* x, int64_t n) {
    const ArrayMap<Acc> a(x, n);
    if constexpr (kKind == 1) sum.add(a.abs().sum());
    else if constexpr (kKind == 2) sum.add(a.square().sum());
    else if constexpr (kKind == 0) sum.add(static_cast<Acc>((a != Acc(0)).count()));
    else sum.add(a.abs().pow(p).sum());
  }
  Acc value() const { return sum.total(); }
  static Acc merge(Acc a, Acc b) { return a + b; }
};

// ---- column ops (reduce_kernel.h's column path: channels-last inputs, outer dims) ----

template <typename Acc, typename F>
struct SumLikeColumns {  // acc += f(x, center)
  static constexpr bool kPairwise = true;
  static Acc identity() { return 0; }
  static void accumulate(Acc* acc, const Acc* x, int64_t n, const Acc* c) {
    for (int64_t j = 0; j < n; ++j) acc[j] += F::apply(x[j], c ? c[j] : Acc(0));
  }
  static Acc merge(Acc a, Acc b) { return a + b; }
};
struct Identity {
  template <typename Acc>
  static Acc apply(Acc x, Acc) {
    return x;
  }
};
struct SquaredDeviation {
  template <typename Acc>
  static Acc apply(Acc x, Acc c) {
    return (x - c) * (x - c);
  }
};
struct ShiftedExp {  // nothing to add when the max is not finite: the result is the max itself
  template <typename Acc>
  static Acc apply(Acc x, Acc c) {
    return std::isfinite(c) ? std::exp(x - c) : Acc(0);
  }
};
struct Abs {
  template <typename Acc>
  static Acc apply(Acc x, Acc) {
    return std::abs(x);
  }
};
struct Square {
  template <typename Acc>
  static Acc apply(Acc x, Acc) {
    return x * x;
  }
};
struct NonZero {
  template <typename Acc>
  static Acc apply(Acc x, Acc) {
    return x != Acc(0) ? Acc(1) : Acc(0);
  }
};

template <typename Acc, bool kMax, bool kAbs>
struct ExtremeColumns {  // max or min of x (or |x|), NaN winning
  static constexpr bool kPairwise = false;
  static Acc identity() {
    return kMax ? (kAbs ? Acc(0) : -std::numeric_limits<Acc>::infinity()) : std::numeric_limits<Acc>::infinity();
  }
  static void accumulate(Acc* acc, const Acc* x, int64_t n, const Acc*) {
    for (int64_t j = 0; j < n; ++j) {
      const Acc v = kAbs ? std::abs(x[j]) : x[j];
      acc[j] = kMax ? nan_max(acc[j], v) : nan_min(acc[j], v);
    }
  }
  static Acc merge(Acc a, Acc b) { return kMax ? nan_max(a, b) : nan_min(a, b); }
};

// The same on the row path: one Eigen call per block of contiguous values.
template <typename Acc, bool kMax, bool kAbs>
struct ExtremeBlock {
  Acc best = ExtremeColumns<Acc, kMax, kAbs>::identity();
  void block(const Acc* x, int64_t n) {
    if constexpr (kAbs) take(ArrayMap<Acc>(x, n).abs());
    else take(ArrayMap<Acc>(x, n));
  }
  template <typename Values>
  void take(const Values& v) {
    if constexpr (kMax) best = nan_max(best, v.template maxCoeff<Eigen::PropagateNaN>());
    else best = nan_min(best, v.template minCoeff<Eigen::PropagateNaN>());
  }
  Acc value() const { return best; }
  static Acc merge(Acc a, Acc b) { return ExtremeColumns<Acc, kMax, kAbs>::merge(a, b); }
};

template <typename T>
void stats_typed(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& mask,
                 const ReduceParams& params) {
  using Acc = acc_t<T>;
  const Geometry g = make_geometry(in.sizes(), in.strides(), out.strides(), mask);
  const T* src = in.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  auto store = [&](int64_t off, Acc v) { dst[off] = from_acc<T>(v); };
  // Outer reductions over a contiguous kept dim (channels-last statistics) accumulate whole rows.
  const bool columns = !g.inner_contiguous() && g.columns_contiguous();
  auto run = [&](auto columns_tag, const auto& make, const auto& finish, const Acc* center = nullptr) {
    using Columns = typename decltype(columns_tag)::type;
    if (columns) reduce_columns<T, Acc, Columns>(src, g, finish, center);
    else reduce_rows<T, Acc>(src, g, make, finish);
  };
  switch (op) {
    case ReduceOp::Var:
    case ReduceOp::Std: {
      const Acc n = static_cast<Acc>(g.n_red);
      std::vector<Acc> mean(static_cast<size_t>(g.n_out));
      run(
          TypeTag<SumLikeColumns<Acc, Identity>>{}, [](int64_t) { return SumBlock<Acc>{}; },
          [&](int64_t o, int64_t, Acc v) { mean[o] = v / n; });
      const Acc divisor = static_cast<Acc>(std::max<int64_t>(g.n_red - params.correction, 0));
      const bool root = op == ReduceOp::Std;
      run(
          TypeTag<SumLikeColumns<Acc, SquaredDeviation>>{},
          [&](int64_t o) { return SquaredDeviationBlock<Acc>(mean[o]); },
          [&](int64_t, int64_t off, Acc m2) {
            const Acc var = m2 / divisor;
            store(off, root ? std::sqrt(var) : var);
          },
          mean.data());
      return;
    }
    case ReduceOp::LogSumExp: {
      std::vector<Acc> max(static_cast<size_t>(g.n_out));
      run(
          TypeTag<ExtremeColumns<Acc, true, false>>{}, [](int64_t) { return ExtremeBlock<Acc, true, false>{}; },
          [&](int64_t o, int64_t, Acc v) { max[o] = v; });
      run(
          TypeTag<SumLikeColumns<Acc, ShiftedExp>>{}, [&](int64_t o) { return ExpBlock<Acc>(max[o]); },
          [&](int64_t o, int64_t off, Acc s) { store(off, std::isfinite(max[o]) ? max[o] + std::log(s) : max[o]); },
          max.data());
      return;
    }
    case ReduceOp::Norm: {
      const double p = params.p;
      auto plain = [&](int64_t, int64_t off, Acc v) { store(off, v); };
      if (std::isinf(p) && p > 0) {
        run(
            TypeTag<ExtremeColumns<Acc, true, true>>{}, [](int64_t) { return ExtremeBlock<Acc, true, true>{}; }, plain);
      } else if (std::isinf(p)) {
        run(
            TypeTag<ExtremeColumns<Acc, false, true>>{}, [](int64_t) { return ExtremeBlock<Acc, false, true>{}; },
            plain);
      } else if (p == 0) {
        run(
            TypeTag<SumLikeColumns<Acc, NonZero>>{}, [](int64_t) { return PowerSumBlock<Acc, 0>{}; }, plain);
      } else if (p == 1) {
        run(
            TypeTag<SumLikeColumns<Acc, Abs>>{}, [](int64_t) { return PowerSumBlock<Acc, 1>{}; }, plain);
      } else if (p == 2) {
        run(
            TypeTag<SumLikeColumns<Acc, Square>>{}, [](int64_t) { return PowerSumBlock<Acc, 2>{}; },
            [&](int64_t, int64_t off, Acc v) { store(off, std::sqrt(v)); });
      } else {
        // A general order is rare: the row path serves every layout.
        const Acc pa = static_cast<Acc>(p), inv = static_cast<Acc>(1.0 / p);
        reduce_rows<T, Acc>(
            src, g, [pa](int64_t) { return PowerSumBlock<Acc, -1>(pa); },
            [&](int64_t, int64_t off, Acc v) { store(off, std::pow(v, inv)); });
      }
      return;
    }
    default: KILN_FAIL("cpu::reduce: op ", static_cast<int>(op), " is not a statistics op");
  }
}

}  // namespace

void reduce_stats(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce,
                  const ReduceParams& params) {
  visit_stats_dtype("cpu::reduce", in.dtype(), out.dtype(),
                    [&]<typename T>() { stats_typed<T>(op, out, in, reduce, params); });
}

}  // namespace kiln::cpu::reduce_detail
