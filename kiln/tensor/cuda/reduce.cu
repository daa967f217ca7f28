// CUDA kernels: sum, mean, prod, max, min, all, any over any set of dims (the engine is
// reduce_engine.cuh; var, std, norm and logsumexp are in reduce_stats.cu).
#include <mutex>

#include "kiln/tensor/cuda/reduce_engine.cuh"

namespace kiln::cuda {
namespace kdetail {

int sm_count() {
  static std::mutex mutex;
  static int counts[64] = {};
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device), "reduce");
  std::lock_guard<std::mutex> lock(mutex);
  if (device < 0 || device >= 64) return 132;
  if (counts[device] == 0) {
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device), "reduce");
  }
  return counts[device];
}

}  // namespace kdetail

void reduce_stats(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce,
                  const ReduceParams& params);  // reduce_stats.cu

namespace {

using namespace rdetail;

// One op with input element type T and output type O, accumulating in acc_t<T>. All and Any are Min
// and Max over bools (0/1); Mean is Sum divided once at the end (in Acc, as the CPU).
template <typename T, typename O>
void reduce_typed(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& mask) {
  using Acc = acc_t<T>;
  const Geometry g = make_geometry(in.sizes(), in.strides(), out.strides(), mask);
  cudaStream_t stream = stream_for(in);
  const T* src = in.data_ptr<T>();
  O* dst = out.data_ptr<O>();
  auto run = [&](const auto& reducer, Finish<Acc> finish) {
    run_reduce<T, O, Acc>(src, dst, g.kept_out, g, static_cast<const Acc*>(nullptr), reducer, finish, stream,
                          in.device());
  };
  switch (op) {
    case ReduceOp::Sum: return run(SumOp<Acc>{}, {});
    case ReduceOp::Mean: return run(SumOp<Acc>{}, {.kind = kDivide, .divisor = static_cast<Acc>(g.n_red)});
    case ReduceOp::Prod: return run(ProdOp<Acc>{}, {});
    default: break;
  }
  if constexpr (std::is_same_v<T, O>) {  // max and min keep the dtype
    switch (op) {
      case ReduceOp::Max:
      case ReduceOp::Any: return run(MaxOp<Acc>{}, {});
      case ReduceOp::Min:
      case ReduceOp::All: return run(MinOp<Acc>{}, {});
      default: break;
    }
  }
  KILN_FAIL("cuda::reduce: op ", static_cast<int>(op), " is not handled for ", in.dtype(), " into ", out.dtype());
}

}  // namespace

void CudaBackend::reduce(ReduceOp op, const Tensor& out, const Tensor& in, const std::vector<bool>& reduce,
                         const ReduceParams& params) {
  if (is_statistics_op(op)) return reduce_stats(op, out, in, reduce, params);
  visit_reduce_dtypes("cuda::reduce", in.dtype(), out.dtype(),
                      [&]<typename In, typename Out>() { reduce_typed<In, Out>(op, out, in, reduce); });
}

}  // namespace kiln::cuda
