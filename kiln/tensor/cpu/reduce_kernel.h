// kiln/tensor/cpu/reduce_kernel.h — the CPU reduction engine (internal to tensor/cpu/).
//
//   Geometry g = make_geometry(in.sizes(), in.strides(), out.strides(), mask);
//   reduce_rows<T, Acc>(in_ptr, g, [&](int64_t o) { return SumBlock<Acc>{}; },
//                       [&](int64_t o, int64_t out_off, Acc total) { out_ptr[out_off] = from_acc<T>(total); });
//
// A reduction is planned once: the kept dims (one output each) and the reduced dims are split apart,
// each group sorted by input stride (largest first) and coalesced, so an NCHW sum over (0, 2, 3)
// becomes "for each of C outputs, N runs of H*W contiguous elements".
//  - reduce_rows: each output reduces its elements in blocks of up to kBlock along the innermost
//    reduced run (contiguous: read in place; strided or 16-bit: converted into a buffer), one Eigen
//    call per block (vectorised, several accumulators), the block results summed pairwise. Outputs
//    run in parallel; an output with very many elements is split into chunks whose partials merge in
//    a fixed order, so results do not depend on the thread count.
//  - reduce_columns: when the reduced dims are outer and a kept dim is contiguous (a sum over dim 0
//    of (N, C), or over H, W of a channels-last tensor), tiles of kTile outputs accumulate whole rows.
#pragma once

#include <Eigen/Core>  // Eigen::Map, Eigen::Array: vectorised block reductions

#include <algorithm>  // std::min, std::stable_sort
#include <cmath>      // std::isnan
#include <cstdint>
#include <limits>       // std::numeric_limits
#include <type_traits>  // std::is_same_v
#include <vector>

#include "kiln/tensor/backend.h"          // ReduceOp, ReduceParams
#include "kiln/tensor/cpu/parallel.h"     // parallel_for, kGrainSize
#include "kiln/tensor/dispatch.h"         // acc_t, Half, BFloat16
#include "kiln/tensor/reduce_geometry.h"  // ReduceGeometry, plan_reduction, offset_of
#include "kiln/tensor/shape.h"

namespace kiln::cpu::reduce_detail {

inline constexpr int64_t kBlock = 1024;        // elements per Eigen call (8 KiB of double: stays in L1)
inline constexpr int64_t kSplitChunk = 65536;  // elements per task when one output's reduction is split
inline constexpr int64_t kMaxSplits = 64;      // partials of one output, merged in order
inline constexpr int64_t kTile = 256;          // outputs per task on the column path
inline constexpr int64_t kRowsPerBlock = 64;   // rows summed plainly before they join the pairwise cascade

template <typename Acc>
using ArrayMap = Eigen::Map<const Eigen::Array<Acc, Eigen::Dynamic, 1>>;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename Acc, typename T>
inline Acc to_acc(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return static_cast<Acc>(static_cast<float>(v));
  } else {
    return static_cast<Acc>(v);
  }
}

// Rounds an accumulator once into the output's element type.
template <typename O, typename Acc>
inline O from_acc(Acc v) {
  if constexpr (std::is_same_v<O, bool>) {
    return v != Acc(0);
  } else if constexpr (std::is_same_v<O, Half> || std::is_same_v<O, BFloat16>) {
    return O(static_cast<float>(v));
  } else {
    return static_cast<O>(v);
  }
}

// max/min that let NaN win (as PyTorch's max, amax): once NaN, always NaN.
template <typename Acc>
inline Acc nan_max(Acc a, Acc b) {
  if constexpr (std::is_floating_point_v<Acc>) return ((b > a) | (b != b)) ? b : a;
  else return b > a ? b : a;
}
template <typename Acc>
inline Acc nan_min(Acc a, Acc b) {
  if constexpr (std::is_floating_point_v<Acc>) return ((b < a) | (b != b)) ? b : a;
  else return b < a ? b : a;
}

// Integer products wrap around on overflow, as in PyTorch (signed overflow would be undefined).
inline int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

// Pairwise (cascade) summation of a stream of partial sums: level k holds the sum of 2^k partials,
// so rounding error grows with log(count) rather than count. 10^7 float32 values stay within ~1e-7.
template <typename Acc>
class PairwiseSum {
 public:
  void add(Acc v) {
    int k = 0;
    while ((count_ >> k) & 1u) v += level_[k++];
    level_[k] = v;
    ++count_;
  }
  Acc total() const {
    Acc t = 0;
    for (int k = 0; k < 64; ++k) {
      if ((count_ >> k) & 1u) t += level_[k];
    }
    return t;
  }

 private:
  uint64_t count_ = 0;
  Acc level_[64];
};

// The plan (kept and reduced dims, coalesced) is shared with the CUDA backend.
using Geometry = ReduceGeometry;
inline Geometry make_geometry(const Shape& sizes, const Strides& in_strides, const Strides& out_strides,
                              const std::vector<bool>& reduce) {
  return plan_reduction(sizes, in_strides, out_strides, reduce);
}

// Feeds the reduced positions [r0, r1) of one output (whose elements start at `base`) to red.block()
// as contiguous arrays of Acc, at most kBlock long.
template <typename T, typename Acc, typename R>
void visit_blocks(const T* base, const Geometry& g, int64_t r0, int64_t r1, R& red) {
  const int64_t n0 = g.red_sizes.back(), s0 = g.red_in.back();
  const size_t outer = g.red_sizes.size() - 1;
  alignas(64) Acc buf[kBlock];
  int64_t r = r0;
  while (r < r1) {
    const int64_t i = r % n0;
    const T* src = base + offset_of(r / n0, g.red_sizes.data(), g.red_in.data(), outer) + i * s0;
    const int64_t len = std::min({n0 - i, r1 - r, kBlock});
    if constexpr (std::is_same_v<T, Acc>) {
      if (s0 == 1) {
        red.block(src, len);
        r += len;
        continue;
      }
    }
    for (int64_t j = 0; j < len; ++j) buf[j] = to_acc<Acc>(src[j * s0]);
    red.block(buf, len);
    r += len;
  }
}

// How many chunks one output's reduction is split into (1: outputs run whole, in parallel).
inline int64_t split_count(int64_t n_red) {
  return n_red >= 2 * kSplitChunk ? std::min(ceil_div(n_red, kSplitChunk), kMaxSplits) : 1;
}

// The row path. make(o) gives a block reducer R for output o: R::block(const Acc*, n), R::value() -> Acc,
// static R::merge(Acc, Acc) -> Acc. finish(o, out_offset, total) stores the result of output o.
template <typename T, typename Acc, typename Make, typename Finish>
void reduce_rows(const T* in, const Geometry& g, const Make& make, const Finish& finish) {
  using R = decltype(make(int64_t{0}));
  const int64_t splits = split_count(g.n_red);
  if (splits == 1) {
    const int64_t grain = std::max<int64_t>(1, kGrainSize / g.n_red);
    parallel_for(0, g.n_out, grain, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        R red = make(o);
        visit_blocks<T, Acc>(in + g.in_offset(o), g, 0, g.n_red, red);
        finish(o, g.out_offset(o), red.value());
      }
    });
    return;
  }
  // Few outputs with many elements each (a full reduction): chunks of every output run in parallel.
  const int64_t chunk = ceil_div(g.n_red, splits);
  std::vector<Acc> partial(static_cast<size_t>(g.n_out * splits));
  parallel_for(0, g.n_out * splits, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t o = item / splits, s = item % splits;
      R red = make(o);
      visit_blocks<T, Acc>(in + g.in_offset(o), g, s * chunk, std::min(g.n_red, (s + 1) * chunk), red);
      partial[item] = red.value();
    }
  });
  for (int64_t o = 0; o < g.n_out; ++o) {
    Acc total = partial[o * splits];
    for (int64_t s = 1; s < splits; ++s) total = R::merge(total, partial[o * splits + s]);
    finish(o, g.out_offset(o), total);
  }
}

// The column path, for ops whose accumulation is elementwise:
//   Op::identity(); Op::accumulate(acc*, x*, n, center*) folds one row in (acc[j] = acc[j] (+) f(x[j]),
//   where f may use center[j], the output's value from a first pass, or ignore it);
//   Op::merge(Acc, Acc) joins partial results; Op::kPairwise (sum-like: row blocks are cascaded).
// center, when given, holds one value per output (row-major over the kept dims).
// finish(o, out_offset, total) stores output o.
template <typename T, typename Acc, typename Op, typename Finish>
void reduce_columns(const T* in, const Geometry& g, const Finish& finish, const Acc* center = nullptr) {
  const int64_t width = g.kept_sizes.back(), out_step = g.kept_out.back();
  const int64_t groups = g.n_out / width, tiles = ceil_div(width, kTile);
  const size_t outer_kept = g.kept_sizes.size() - 1;
  // Split the rows only when there are too few tiles to share out (a decision by shape alone, so the
  // result does not depend on the thread count).
  const int64_t splits = groups * tiles < 16 ? split_count(g.n_red * std::min(width, kTile)) : 1;
  const int64_t chunk = ceil_div(g.n_red, splits);
  const int64_t items = groups * tiles * splits;
  // Partial results of item (group, tile, split): kTile accumulators each.
  std::vector<Acc> partial(splits > 1 ? static_cast<size_t>(items * kTile) : 0);
  auto merge_into = [](Acc* acc, const Acc* x, int64_t n) {
    for (int64_t j = 0; j < n; ++j) acc[j] = Op::merge(acc[j], x[j]);
  };

  auto run_item = [&](int64_t item, Acc* acc) {
    const int64_t s = item % splits, tile = (item / splits) % tiles, group = item / (splits * tiles);
    const int64_t k0 = tile * kTile, w = std::min(kTile, width - k0);
    const T* base = in + offset_of(group, g.kept_sizes.data(), g.kept_in.data(), outer_kept) + k0;
    const Acc* c = center ? center + group * width + k0 : nullptr;
    alignas(64) Acc row[kTile];
    alignas(64) Acc block[kTile];
    std::fill(acc, acc + w, Op::identity());
    std::fill(block, block + w, Op::identity());
    std::vector<std::vector<Acc>> levels;  // pairwise cascade of row blocks (sum-like ops)
    uint64_t count = 0;
    int64_t rows_in_block = 0;
    const int64_t r1 = std::min(g.n_red, (s + 1) * chunk);
    for (int64_t r = s * chunk; r < r1; ++r) {
      const T* src = base + g.red_offset(r);
      const Acc* x;
      if constexpr (std::is_same_v<T, Acc>) {
        x = src;
      } else {
        for (int64_t j = 0; j < w; ++j) row[j] = to_acc<Acc>(src[j]);
        x = row;
      }
      Op::accumulate(block, x, w, c);
      if (Op::kPairwise && ++rows_in_block == kRowsPerBlock) {
        std::vector<Acc> v(block, block + w);
        int k = 0;
        for (; (count >> k) & 1u; ++k) merge_into(v.data(), levels[k].data(), w);
        if (levels.size() <= static_cast<size_t>(k)) levels.resize(k + 1);
        levels[k] = std::move(v);
        ++count;
        std::fill(block, block + w, Op::identity());
        rows_in_block = 0;
      }
    }
    for (size_t k = 0; k < levels.size(); ++k) {
      if ((count >> k) & 1u) merge_into(acc, levels[k].data(), w);
    }
    merge_into(acc, block, w);
    return w;
  };

  const int64_t grain = std::max<int64_t>(1, kGrainSize / std::max<int64_t>(1, g.n_red * std::min(width, kTile)));
  parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    alignas(64) Acc acc[kTile];
    for (int64_t item = begin; item < end; ++item) {
      if (splits > 1) {
        run_item(item, partial.data() + item * kTile);
        continue;
      }
      const int64_t tile = item % tiles, group = item / tiles;
      const int64_t w = run_item(item, acc);
      const int64_t out0 =
          offset_of(group, g.kept_sizes.data(), g.kept_out.data(), outer_kept) + tile * kTile * out_step;
      for (int64_t j = 0; j < w; ++j) finish(group * width + tile * kTile + j, out0 + j * out_step, acc[j]);
    }
  });
  if (splits == 1) return;
  for (int64_t gt = 0; gt < groups * tiles; ++gt) {
    const int64_t tile = gt % tiles, group = gt / tiles;
    const int64_t k0 = tile * kTile, w = std::min(kTile, width - k0);
    const int64_t out0 = offset_of(group, g.kept_sizes.data(), g.kept_out.data(), outer_kept) + k0 * out_step;
    for (int64_t j = 0; j < w; ++j) {
      Acc total = partial[(gt * splits) * kTile + j];
      for (int64_t s = 1; s < splits; ++s) total = Op::merge(total, partial[(gt * splits + s) * kTile + j]);
      finish(group * width + k0 + j, out0 + j * out_step, total);
    }
  }
}

// Var, Std, Norm and LogSumExp (reduce_stats.cpp): floating dtypes, out has in's dtype.
void reduce_stats(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce,
                  const ReduceParams& params);

// Sums a row block by block (one Eigen call each), adding the block sums pairwise.
template <typename Acc>
struct SumBlock {
  PairwiseSum<Acc> sum;
  void block(const Acc* x, int64_t n) { sum.add(ArrayMap<Acc>(x, n).sum()); }
  Acc value() const { return sum.total(); }
  static Acc merge(Acc a, Acc b) { return a + b; }
};

}  // namespace kiln::cpu::reduce_detail
