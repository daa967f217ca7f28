// CUDA kernels: var, std, p-norms and logsumexp (floating dtypes) on the engine of reduce_engine.cuh.
//
// var and logsumexp take two passes, as on the CPU: the mean (or max) of each output into a
// temporary first, then the sum of squared deviations from it (or of exp(x - max)). The extra read
// keeps float32 accurate where a one-pass sum of squares would cancel.
#include "kiln/tensor/cuda/reduce_engine.cuh"

namespace kiln::cuda {
namespace {

using namespace rdetail;

// Sum-like ops over a function of x (and of the output's center c).
template <typename Acc>
struct SquaredDeviationOp : SumOp<Acc> {
  __device__ Acc map(Acc x, Acc c) const { return (x - c) * (x - c); }
};
template <typename Acc>
struct ShiftedExpOp : SumOp<Acc> {  // nothing to add when the max is not finite: the result is the max
  __device__ Acc map(Acc x, Acc c) const { return isfinite(c) ? exp(x - c) : Acc(0); }
};
template <typename Acc>
struct AbsSumOp : SumOp<Acc> {
  __device__ Acc map(Acc x, Acc) const { return fabs(x); }
};
template <typename Acc>
struct SquareSumOp : SumOp<Acc> {
  __device__ Acc map(Acc x, Acc) const { return x * x; }
};
template <typename Acc>
struct NonZeroOp : SumOp<Acc> {
  __device__ Acc map(Acc x, Acc) const { return x != Acc(0) ? Acc(1) : Acc(0); }
};
template <typename Acc>
struct PowSumOp : SumOp<Acc> {
  Acc p;
  __device__ Acc map(Acc x, Acc) const { return pow(fabs(x), p); }
};
template <typename Acc>
struct MaxAbsOp : MaxOp<Acc> {
  __device__ Acc identity() const { return Acc(0); }
  __device__ Acc map(Acc x, Acc) const { return fabs(x); }
};
template <typename Acc>
struct MinAbsOp : MinOp<Acc> {
  __device__ Acc map(Acc x, Acc) const { return fabs(x); }
};

template <typename T>
void stats_typed(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& mask,
                 const ReduceParams& params) {
  using Acc = acc_t<T>;
  const Geometry g = make_geometry(in.sizes(), in.strides(), out.strides(), mask);
  cudaStream_t stream = stream_for(in);
  const Device device = in.device();
  const T* src = in.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  auto run = [&](const auto& reducer, Finish<Acc> finish, const Acc* center = nullptr) {
    run_reduce<T, T, Acc>(src, dst, g.kept_out, g, center, reducer, finish, stream, device);
  };
  // First pass: one Acc per output (row-major over the kept dims) into a temporary.
  auto first_pass = [&](const auto& reducer, Finish<Acc> finish) {
    Tensor center = internal::empty({g.n_out}, {.dtype = acc_dtype<Acc>(), .device = device});
    run_reduce<T, Acc, Acc>(src, center.data_ptr<Acc>(), contiguous_like(g.kept_out), g,
                            static_cast<const Acc*>(nullptr), reducer, finish, stream, device);
    return center;
  };
  switch (op) {
    case ReduceOp::Var:
    case ReduceOp::Std: {
      const Tensor mean = first_pass(SumOp<Acc>{}, {.kind = kDivide, .divisor = static_cast<Acc>(g.n_red)});
      const Acc divisor = static_cast<Acc>(std::max<int64_t>(g.n_red - params.correction, 0));
      return run(SquaredDeviationOp<Acc>{}, {.kind = op == ReduceOp::Std ? kDivideSqrt : kDivide, .divisor = divisor},
                 mean.data_ptr<Acc>());
    }
    case ReduceOp::LogSumExp: {
      const Tensor max = first_pass(MaxOp<Acc>{}, {});
      return run(ShiftedExpOp<Acc>{}, {.kind = kLogSumExp}, max.data_ptr<Acc>());
    }
    case ReduceOp::Norm: {
      const double p = params.p;
      if (std::isinf(p)) return p > 0 ? run(MaxAbsOp<Acc>{}, {}) : run(MinAbsOp<Acc>{}, {});
      if (p == 0) return run(NonZeroOp<Acc>{}, {});
      if (p == 1) return run(AbsSumOp<Acc>{}, {});
      if (p == 2) return run(SquareSumOp<Acc>{}, {.kind = kSqrt});
      PowSumOp<Acc> pow_sum;
      pow_sum.p = static_cast<Acc>(p);
      return run(pow_sum, {.kind = kPow, .exponent = static_cast<Acc>(1.0 / p)});
    }
    default: KILN_FAIL("cuda::reduce: op ", static_cast<int>(op), " is not a statistics op");
  }
}

}  // namespace

void reduce_stats(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce,
                  const ReduceParams& params) {
  visit_stats_dtype("cuda::reduce", in.dtype(), out.dtype(),
                    [&]<typename T>() { stats_typed<T>(op, out, in, reduce, params); });
}

}  // namespace kiln::cuda
