// CPU kernels: sum, mean, prod, max, min, all, any over any set of dims (the engine is reduce_kernel.h).
#include <cmath>
#include <limits>

#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/reduce_kernel.h"

namespace kiln::cpu {
namespace {

using namespace reduce_detail;

// ---- block reducers (row path): one Eigen call per block of contiguous Acc values ----

template <typename Acc>
struct ProdBlock {
  Acc prod = 1;
  void block(const Acc* x, int64_t n) {
    if constexpr (std::is_floating_point_v<Acc>) {
      prod *= ArrayMap<Acc>(x, n).prod();
    } else {
      for (int64_t j = 0; j < n; ++j) prod = wrap_mul(prod, x[j]);
    }
  }
  Acc value() const { return prod; }
  static Acc merge(Acc a, Acc b) {
    if constexpr (std::is_floating_point_v<Acc>) return a * b;
    else return wrap_mul(a, b);
  }
};

template <typename Acc>
struct MaxBlock {
  Acc best = std::numeric_limits<Acc>::has_infinity ? -std::numeric_limits<Acc>::infinity()
                                                    : std::numeric_limits<Acc>::lowest();
  void block(const Acc* x, int64_t n) {
    if constexpr (std::is_floating_point_v<Acc>) {
      best = nan_max(best, ArrayMap<Acc>(x, n).template maxCoeff<Eigen::PropagateNaN>());
    } else {
      best = nan_max(best, ArrayMap<Acc>(x, n).maxCoeff());
    }
  }
  Acc value() const { return best; }
  static Acc merge(Acc a, Acc b) { return nan_max(a, b); }
};

template <typename Acc>
struct MinBlock {
  Acc best =
      std::numeric_limits<Acc>::has_infinity ? std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::max();
  void block(const Acc* x, int64_t n) {
    if constexpr (std::is_floating_point_v<Acc>) {
      best = nan_min(best, ArrayMap<Acc>(x, n).template minCoeff<Eigen::PropagateNaN>());
    } else {
      best = nan_min(best, ArrayMap<Acc>(x, n).minCoeff());
    }
  }
  Acc value() const { return best; }
  static Acc merge(Acc a, Acc b) { return nan_min(a, b); }
};

// ---- column ops (column path): elementwise accumulation of whole rows ----

template <typename Acc>
struct SumColumns {
  static constexpr bool kPairwise = true;
  static Acc identity() { return 0; }
  static void accumulate(Acc* acc, const Acc* x, int64_t n, const Acc*) {
    for (int64_t j = 0; j < n; ++j) acc[j] += x[j];
  }
  static Acc merge(Acc a, Acc b) { return a + b; }
};

template <typename Acc>
struct ProdColumns {
  static constexpr bool kPairwise = false;
  static Acc identity() { return 1; }
  static void accumulate(Acc* acc, const Acc* x, int64_t n, const Acc*) {
    for (int64_t j = 0; j < n; ++j) acc[j] = ProdBlock<Acc>::merge(acc[j], x[j]);
  }
  static Acc merge(Acc a, Acc b) { return ProdBlock<Acc>::merge(a, b); }
};

template <typename Acc>
struct MaxColumns {
  static constexpr bool kPairwise = false;
  static Acc identity() { return MaxBlock<Acc>{}.best; }
  static void accumulate(Acc* acc, const Acc* x, int64_t n, const Acc*) {
    for (int64_t j = 0; j < n; ++j) acc[j] = nan_max(acc[j], x[j]);
  }
  static Acc merge(Acc a, Acc b) { return nan_max(a, b); }
};

template <typename Acc>
struct MinColumns {
  static constexpr bool kPairwise = false;
  static Acc identity() { return MinBlock<Acc>{}.best; }
  static void accumulate(Acc* acc, const Acc* x, int64_t n, const Acc*) {
    for (int64_t j = 0; j < n; ++j) acc[j] = nan_min(acc[j], x[j]);
  }
  static Acc merge(Acc a, Acc b) { return nan_min(a, b); }
};

// Runs one op with input element type T and output element type O, accumulating in acc_t<T>.
// All and Any are Min and Max over bools (0/1); Mean is Sum scaled once at the end.
template <typename T, typename O>
void reduce_typed(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& mask) {
  using Acc = acc_t<T>;
  const Geometry g = make_geometry(in.sizes(), in.strides(), out.strides(), mask);
  const T* src = in.data_ptr<T>();
  O* dst = out.data_ptr<O>();
  const bool columns = !g.inner_contiguous() && g.columns_contiguous();
  auto run = [&](auto block_tag, auto columns_tag, auto scale) {
    using Block = typename decltype(block_tag)::type;
    using Columns = typename decltype(columns_tag)::type;
    if (columns) {
      reduce_columns<T, Acc, Columns>(src, g, [&](int64_t, int64_t off, Acc v) { dst[off] = from_acc<O>(scale(v)); });
    } else {
      reduce_rows<T, Acc>(
          src, g, [](int64_t) { return Block{}; },
          [&](int64_t, int64_t off, Acc v) { dst[off] = from_acc<O>(scale(v)); });
    }
  };
  auto same = [](Acc v) { return v; };
  switch (op) {
    case ReduceOp::Sum: return run(TypeTag<SumBlock<Acc>>{}, TypeTag<SumColumns<Acc>>{}, same);
    case ReduceOp::Mean: {
      const Acc n = static_cast<Acc>(g.n_red);
      return run(TypeTag<SumBlock<Acc>>{}, TypeTag<SumColumns<Acc>>{}, [n](Acc v) { return v / n; });
    }
    case ReduceOp::Prod: return run(TypeTag<ProdBlock<Acc>>{}, TypeTag<ProdColumns<Acc>>{}, same);
    case ReduceOp::Max:
    case ReduceOp::Any: return run(TypeTag<MaxBlock<Acc>>{}, TypeTag<MaxColumns<Acc>>{}, same);
    case ReduceOp::Min:
    case ReduceOp::All: return run(TypeTag<MinBlock<Acc>>{}, TypeTag<MinColumns<Acc>>{}, same);
    default: KILN_FAIL("cpu::reduce: op ", static_cast<int>(op), " is not handled here");
  }
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce,
                        const ReduceParams& params) {
  if (is_statistics_op(op)) return reduce_detail::reduce_stats(op, out, in, reduce, params);
  visit_reduce_dtypes("cpu::reduce", in.dtype(), out.dtype(),
                      [&]<typename In, typename Out>() { reduce_typed<In, Out>(op, out, in, reduce); });
}

}  // namespace kiln::cpu
