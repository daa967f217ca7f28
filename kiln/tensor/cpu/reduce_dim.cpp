// CPU kernels along one dim: max/min with the index of the first extreme, softmax and log-softmax.
//
// Both see the input as "lines": every position of the other dims owns one line of n = size(dim)
// elements, `stride(dim)` apart. Lines run in parallel.
#include <Eigen/Core>  // Eigen::Map, Eigen::Array: vectorised max, exp and sum over a line

#include <cmath>
#include <limits>
#include <vector>

#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/parallel.h"
#include "kiln/tensor/cpu/special_math.h"  // exp_n: exp with its edges decided explicitly
#include "kiln/tensor/dispatch.h"

namespace kiln::cpu {
namespace {

// Offsets of line o in up to three tensors sharing a shape, over every dim but `dim`.
struct Lines {
  Shape sizes;                   // the other dims, outermost first
  std::vector<Strides> strides;  // per tensor
  int64_t count = 1;

  Lines(const Shape& shape, int64_t dim, const std::vector<const Strides*>& tensors) : strides(tensors.size()) {
    for (size_t d = 0; d < shape.size(); ++d) {
      if (static_cast<int64_t>(d) == dim || shape[d] == 1) continue;
      sizes.push_back(shape[d]);
      count *= shape[d];
      for (size_t t = 0; t < tensors.size(); ++t) strides[t].push_back((*tensors[t])[d]);
    }
  }
  // offsets[t] = element offset of line o in tensor t
  void offsets(int64_t o, int64_t* out) const {
    for (size_t t = 0; t < strides.size(); ++t) out[t] = 0;
    for (size_t d = sizes.size(); d-- > 0;) {
      const int64_t i = o % sizes[d];
      o /= sizes[d];
      for (size_t t = 0; t < strides.size(); ++t) out[t] += i * strides[t][d];
    }
  }
};

template <typename T>
void arg_reduce_typed(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) {
  using C = compute_t<T>;
  const int64_t n = in.size(dim), step = in.stride(dim);
  const Lines lines(in.shape(), dim, {&in.strides(), &values.strides(), &indices.strides()});
  const T* src = in.data_ptr<T>();
  T* val = values.data_ptr<T>();
  int64_t* idx = indices.data_ptr<int64_t>();
  parallel_for(0, lines.count, std::max<int64_t>(1, kGrainSize / n), [&](int64_t begin, int64_t end) {
    int64_t off[3];
    for (int64_t o = begin; o < end; ++o) {
      lines.offsets(o, off);
      const T* x = src + off[0];
      int64_t best_i = 0;
      C best = static_cast<C>(x[0]);
      // The first extreme wins ties; the first NaN beats everything (as PyTorch).
      bool found_nan = false;
      if constexpr (std::is_floating_point_v<C>) found_nan = best != best;
      for (int64_t i = 1; i < n && !found_nan; ++i) {
        const C v = static_cast<C>(x[i * step]);
        if constexpr (std::is_floating_point_v<C>) {
          if (v != v) {
            best_i = i;
            found_nan = true;
            break;
          }
        }
        if (is_max ? v > best : v < best) {
          best = v;
          best_i = i;
        }
      }
      val[off[1]] = x[best_i * step];
      idx[off[2]] = best_i;
    }
  });
}

template <typename T>
void softmax_typed(const Tensor& out, const Tensor& in, int64_t dim, bool log) {
  using C = compute_t<T>;  // float for 16-bit inputs
  using Array = Eigen::Array<C, Eigen::Dynamic, 1>;
  const int64_t n = in.size(dim), in_step = in.stride(dim), out_step = out.stride(dim);
  const Lines lines(in.shape(), dim, {&in.strides(), &out.strides()});
  const T* src = in.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  parallel_for(0, lines.count, std::max<int64_t>(1, kGrainSize / n), [&](int64_t begin, int64_t end) {
    Array line(n), e(log ? n : 0);  // per task: the line in compute precision, and exp of it for log_softmax
    int64_t off[2];
    for (int64_t o = begin; o < end; ++o) {
      lines.offsets(o, off);
      const T* x = src + off[0];
      for (int64_t i = 0; i < n; ++i) line[i] = static_cast<C>(x[i * in_step]);
      // Subtracting the max keeps exp() from overflowing; a NaN anywhere makes the line NaN.
      const C max = line.template maxCoeff<Eigen::PropagateNaN>();
      line -= max;
      // exp_n (special_math.h): exp(-inf) is exactly 0 (a masked position's probability) and tiny terms are
      // exact, whatever the vector instruction set; the sum is at least 1 (the max's term) or NaN.
      if (log) {
        exp_n(line.data(), e.data(), n);
        line -= std::log(e.sum());
      } else {
        exp_n(line.data(), line.data(), n);
        line /= line.sum();
      }
      T* y = dst + off[1];
      for (int64_t i = 0; i < n; ++i) y[i * out_step] = static_cast<T>(line[i]);
    }
  });
}

}  // namespace

void CpuBackend::arg_reduce(ReduceOp op, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim) {
  KILN_CHECK(op == ReduceOp::Max || op == ReduceOp::Min, "cpu::arg_reduce: expected Max or Min, got op ",
             static_cast<int>(op));
  visit_dtype(in.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    arg_reduce_typed<T>(op == ReduceOp::Max, values, indices, in, dim);
  });
}

void CpuBackend::softmax(const Tensor& out, const Tensor& in, int64_t dim, bool log) {
  visit_floating_dtype(in.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_typed<T>(out, in, dim, log);
  });
}

}  // namespace kiln::cpu
