// CUDA kernels: comparisons and logical ops (any input dtype, Bool output) and CudaBackend::where.
// Half and BFloat16 compare in float (exact); NaN compares unequal to everything, as on the CPU.
#include "kiln/tensor/cuda/binary_ops.h"         // binary_compare
#include "kiln/tensor/cuda/elementwise_ops.cuh"  // launch_elementwise

namespace kiln::cuda {
namespace {

template <BinaryOp kOp, typename C>
struct CompareF {
  __device__ bool operator()(C x, C y) const {
    if constexpr (kOp == BinaryOp::Eq) return x == y;
    else if constexpr (kOp == BinaryOp::Ne) return x != y;
    else if constexpr (kOp == BinaryOp::Lt) return x < y;
    else if constexpr (kOp == BinaryOp::Le) return x <= y;
    else if constexpr (kOp == BinaryOp::Gt) return x > y;
    else if constexpr (kOp == BinaryOp::Ge) return x >= y;
    else if constexpr (kOp == BinaryOp::LogicalAnd) return (x != C(0)) && (y != C(0));
    else if constexpr (kOp == BinaryOp::LogicalOr) return (x != C(0)) || (y != C(0));
    else if constexpr (kOp == BinaryOp::LogicalXor) return (x != C(0)) != (y != C(0));
    else static_assert(kOp == BinaryOp::Eq, "not a comparison");
  }
};

template <BinaryOp kOp>
void run(const char* name, const Tensor& out, const Tensor& a, const Tensor& b) {
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise(name, Types<bool, T, T>{}, {out, a, b}, CompareF<kOp, compute_t<T>>{});
  });
}

// out = cond ? a : b on elements of `Bits` width (the dtype does not matter, only its size).
template <typename Bits>
struct SelectF {
  __device__ Bits operator()(bool c, Bits x, Bits y) const { return c ? x : y; }
};

template <typename Bits>
void select(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  launch_elementwise("where", Types<Bits, bool, Bits, Bits>{}, {out, cond, a, b}, SelectF<Bits>{});
}

}  // namespace

void binary_compare(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinaryOp::Eq: return run<BinaryOp::Eq>("eq", out, a, b);
    case BinaryOp::Ne: return run<BinaryOp::Ne>("ne", out, a, b);
    case BinaryOp::Lt: return run<BinaryOp::Lt>("lt", out, a, b);
    case BinaryOp::Le: return run<BinaryOp::Le>("le", out, a, b);
    case BinaryOp::Gt: return run<BinaryOp::Gt>("gt", out, a, b);
    case BinaryOp::Ge: return run<BinaryOp::Ge>("ge", out, a, b);
    case BinaryOp::LogicalAnd: return run<BinaryOp::LogicalAnd>("logical_and", out, a, b);
    case BinaryOp::LogicalOr: return run<BinaryOp::LogicalOr>("logical_or", out, a, b);
    case BinaryOp::LogicalXor: return run<BinaryOp::LogicalXor>("logical_xor", out, a, b);
    default: break;
  }
  KILN_FAIL("cuda::binary: unknown op ", static_cast<int>(op));
}

void CudaBackend::where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  switch (out.element_size()) {
    case 1: return select<uint8_t>(out, cond, a, b);
    case 2: return select<uint16_t>(out, cond, a, b);
    case 4: return select<uint32_t>(out, cond, a, b);
    case 8: return select<uint64_t>(out, cond, a, b);
  }
  KILN_FAIL("cuda::where: unexpected element size ", out.element_size());
}

}  // namespace kiln::cuda
