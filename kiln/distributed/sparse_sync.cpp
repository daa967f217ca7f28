// kiln/distributed/sparse_sync.cpp — all_gather_sparse_grads: every parameter's row counts in one all-gather per
// group, then each parameter's rows padded to its largest count. A group of one rank does nothing.
#include "kiln/distributed/sparse_sync.h"

#include <algorithm>
#include <vector>

#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/sparse_grad.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::dist {

namespace {

// One parameter to average: its position in the list, its gradient (null: none on this rank) and the group it goes
// through (that of the gradient's device).
struct Entry {
  size_t index;
  const SparseRowGrad* grad;
  ProcessGroup* group;
};

// Replaces entry e's gradient by the mean of every rank's rows, given every rank's row count k (-1: none).
void gather_one(const Tensor& p, const Entry& e, const int64_t* k) {
  ProcessGroup& group = *e.group;
  const int world = group.size();
  const Device device = group.device();
  const bool none = std::all_of(k, k + world, [](int64_t c) { return c < 0; });
  if (none) return;
  KILN_CHECK(std::all_of(k, k + world, [](int64_t c) { return c >= 0; }), "all_gather_sparse_grads: parameter ",
             e.index, " (shape ", p.shape(),
             ") has a sparse gradient on some ranks and none on others; every rank must "
             "look up its table (an empty batch gives an empty gradient only through a lookup)");
  const SparseRowGrad* g = e.grad;
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

}  // namespace

void all_gather_sparse_grads(const std::vector<Tensor>& params, ProcessGroup* group_in) {
  NoGradGuard no_grad;
  // Each parameter through the group of its gradient's device (an nn::HybridEmbedding's hot tier on the GPU: NCCL;
  // its cold tier in host memory: MPI, or NCCL when its gradient is device-held), unless one group was given for all.
  std::vector<ProcessGroup*> groups;  // in order of first use
  std::vector<Entry> entries;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const SparseRowGrad* g = autograd::sparse_grad(p);
    // Where the gradient lives: the parameter's device, or the GPU of a device-held one (sparse_grad.h: an
    // nn::HybridEmbedding's cold tier read through its mapping), whose rows then go through NCCL.
    const Device device = g != nullptr ? g->values.device() : p.device();
    KILN_CHECK(group_in == nullptr || group_in->device() == device, "all_gather_sparse_grads: parameter ", i,
               " (shape ", p.shape(), ") has its gradient on ", device, " but the given ", group_in->backend(),
               " group works on ", group_in->device(),
               "; pass no group, so that each parameter uses the world group of its gradient's device (dist::group)");
    ProcessGroup* group = group_in != nullptr ? group_in : &dist::group(device);
    // One rank: the mean over the ranks is the gradient itself.
    if (group->size() == 1) continue;
    if (std::find(groups.begin(), groups.end(), group) == groups.end()) groups.push_back(group);
    entries.push_back({i, g, group});
  }
  for (ProcessGroup* group : groups) {
    // Every rank's row count of each of this group's parameters (-1: no sparse gradient), in one all-gather and one
    // read on the host: the rows' all-gathers need one size.
    std::vector<const Entry*> mine;
    for (const Entry& e : entries) {
      if (e.group == group) mine.push_back(&e);
    }
    const int world = group->size();
    const auto n = static_cast<int64_t>(mine.size());
    Tensor count = internal::empty({n}, {.dtype = DType::Int64, .device = Device::cpu()});
    for (int64_t j = 0; j < n; ++j) {
      const SparseRowGrad* g = mine[static_cast<size_t>(j)]->grad;
      count.data_ptr<int64_t>()[j] = g == nullptr ? -1 : g->nnz();
    }
    count = internal::to(count, group->device());
    const Tensor counts = internal::empty({world, n}, {.dtype = DType::Int64, .device = group->device()});
    group->all_gather(counts, count);
    const Tensor host = internal::contiguous(internal::to(counts, Device::cpu()));
    const int64_t* all = host.data_ptr<int64_t>();  // (world, n)
    std::vector<int64_t> k(static_cast<size_t>(world));
    for (int64_t j = 0; j < n; ++j) {
      for (int r = 0; r < world; ++r) k[static_cast<size_t>(r)] = all[r * n + j];
      const Entry& e = *mine[static_cast<size_t>(j)];
      gather_one(params[e.index], e, k.data());
    }
  }
}

}  // namespace kiln::dist
