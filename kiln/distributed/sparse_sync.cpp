// kiln/distributed/sparse_sync.cpp — all_gather_sparse_grads: row counts, then rows padded to the largest count.
#include "kiln/distributed/sparse_sync.h"

#include <algorithm>

#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/sparse_grad.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::dist {

void all_gather_sparse_grads(const std::vector<Tensor>& params, ProcessGroup* group_in) {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    // Each parameter through the group of its gradient's device (an nn::HybridEmbedding's hot tier on the GPU: NCCL;
    // its cold tier in host memory: MPI, or NCCL when its gradient is device-held), unless one group was given for all.
    const SparseRowGrad* g = autograd::sparse_grad(p);
    // Where the gradient lives: the parameter's device, or the GPU of a device-held one (sparse_grad.h: an
    // nn::HybridEmbedding's cold tier read through its mapping), whose rows then go through NCCL.
    const Device device = g != nullptr ? g->values.device() : p.device();
    KILN_CHECK(group_in == nullptr || group_in->device() == device, "all_gather_sparse_grads: parameter ", i,
               " (shape ", p.shape(), ") has its gradient on ", device, " but the given ", group_in->backend(),
               " group works on ", group_in->device(),
               "; pass no group, so that each parameter uses the world group of its gradient's device (dist::group)");
    ProcessGroup& group = group_in != nullptr ? *group_in : dist::group(device);
    const int world = group.size();
    // Every rank's row count (-1: no sparse gradient), gathered first: the rows' all-gathers need one size.
    const Tensor count = internal::full({1}, g == nullptr ? -1 : g->nnz(), {.dtype = DType::Int64, .device = device});
    const Tensor counts = internal::empty({world}, {.dtype = DType::Int64, .device = device});
    group.all_gather(counts, count);
    const Tensor host = internal::contiguous(internal::to(counts, Device::cpu()));
    const int64_t* k = host.data_ptr<int64_t>();
    const bool none = std::all_of(k, k + world, [](int64_t c) { return c < 0; });
    if (none) continue;
    KILN_CHECK(std::all_of(k, k + world, [](int64_t c) { return c >= 0; }), "all_gather_sparse_grads: parameter ", i,
               " (shape ", p.shape(),
               ") has a sparse gradient on some ranks and none on others; every rank must "
               "look up its table (an empty batch gives an empty gradient only through a lookup)");
    const int64_t most = *std::max_element(k, k + world);
    Shape row_shape = p.shape();
    row_shape[0] = most;
    // Each rank's rows padded to `most` (row index 0, values 0: padding adds nothing once sliced away).
    Tensor indices = internal::zeros({most}, {.dtype = DType::Int64, .device = device});
    Tensor values = internal::zeros(row_shape, {.dtype = p.dtype(), .device = device});
    if (g->nnz() > 0) {
      Tensor index_rows = internal::narrow(indices, 0, 0, g->nnz()),
             value_rows = internal::narrow(values, 0, 0, g->nnz());
      internal::copy_(index_rows, g->indices);
      internal::copy_(value_rows, g->values);
    }
    Shape all_rows = row_shape;
    all_rows.insert(all_rows.begin(), world);
    const Tensor all_indices = internal::empty({world, most}, {.dtype = DType::Int64, .device = device});
    const Tensor all_values = internal::empty(all_rows, {.dtype = p.dtype(), .device = device});
    group.all_gather(all_indices, indices);
    group.all_gather(all_values, values);
    std::vector<Tensor> idx_parts, value_parts;
    for (int r = 0; r < world; ++r) {
      idx_parts.push_back(internal::narrow(internal::select(all_indices, 0, r), 0, 0, k[r]));
      value_parts.push_back(internal::narrow(internal::select(all_values, 0, r), 0, 0, k[r]));
    }
    SparseRowGrad mean;
    mean.dense_shape = p.shape();
    mean.indices = internal::cat(idx_parts, 0);
    mean.values = internal::div(internal::cat(value_parts, 0), static_cast<double>(world));
    autograd::set_sparse_grad(p, std::move(mean));
  }
}

}  // namespace kiln::dist
