// kiln/layers/hybrid_embedding.cpp — nn::HybridEmbedding: placement (slot), the two-tier lookup and its row-sparse
// backward, rebalancing, and the one-table state dict.
#include "kiln/layers/hybrid_embedding.h"

#include <algorithm>  // std::nth_element, std::sort
#include <cmath>      // std::llround, std::isfinite
#include <cstdint>
#include <cstring>  // std::memcpy: rows of the host tiers
#include <limits>   // std::numeric_limits: the device placement's Int32 rows
#include <memory>   // std::shared_ptr: a lookup's index lists, kept for its backward
#include <numeric>  // std::iota
#include <utility>
#include <vector>

#include "kiln/autograd/function.h"     // autograd::Function: the lookup's node
#include "kiln/autograd/grad_mode.h"    // NoGradGuard: moving rows of parameters
#include "kiln/autograd/sparse_grad.h"  // accumulate_sparse_grad, has_sparse_grad
#include "kiln/layers/init.h"           // init::normal_
#include "kiln/tensor/backend.h"        // detail::IndexOpScope: a bad id names the table
#include "kiln/tensor/checked_size.h"   // checked_nbytes: the table's size
#include "kiln/tensor/cuda.h"           // cuda::synchronize: waiting for mapped reads of the cold tier
#include "kiln/tensor/error.h"          // KILN_CHECK
#include "kiln/tensor/internal_ops.h"   // internal::index_select, cat, scatter_, ... (no autograd recording)
#if KILN_WITH_CUDA
#include "kiln/layers/cuda/hybrid_rows.h"  // gather_host_rows: cold rows read by a kernel (no CUDA header)
#endif

namespace kiln::nn {

namespace {

// Where the lookups of one call go, by the placement at the time: output position i reads hot row hot_slots[j]
// (hot_pos[j] == i) or cold row cold_slots[j] (cold_pos[j] == i).
struct Partition {
  std::vector<int64_t> hot_pos, hot_slots, cold_pos, cold_slots;
};

// How far ahead of the id at hand the per-row arrays (slot, counts) are prefetched. A table of 10^8 rows has 800 MB
// arrays, so nearly every lookup of a rare row misses the caches and the TLB; with the next ids' rows already on
// their way the misses overlap instead of following one another.
constexpr int64_t kPrefetchAhead = 16;

// A lookup's ids as the host holds them: (N) Int64 at a stride (a column of a batch's (B, F) ids needs no copy).
struct IdView {
  const int64_t* data;
  int64_t n, stride;
  int64_t operator[](int64_t i) const { return data[i * stride]; }
};

// ids: (N) Int64 on the CPU, contiguous or not.
IdView view_of(const Tensor& ids) {
  return {ids.data_ptr<int64_t>(), ids.numel(), ids.numel() > 1 ? ids.stride(0) : 1};
}

// The split of ids (all in [0, V)) by the placement slot (V) Int64 on the CPU, and, when counts (V) is given,
// ++counts[id] for each.
Partition partition(IdView id, const Tensor& slot, int64_t* counts = nullptr) {
  const int64_t n = id.n;
  const int64_t* s = slot.data_ptr<int64_t>();
  Partition p;
  for (auto* v : {&p.hot_pos, &p.hot_slots, &p.cold_pos, &p.cold_slots}) v->reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) {
      const int64_t ahead = id[i + kPrefetchAhead];
      __builtin_prefetch(s + ahead);
      if (counts != nullptr) __builtin_prefetch(counts + ahead, 1);
    }
    const int64_t row = id[i];
    if (counts != nullptr) ++counts[row];
    const int64_t where = s[row];
    if (where >= 0) {
      p.hot_pos.push_back(i);
      p.hot_slots.push_back(where);
    } else {
      p.cold_pos.push_back(i);
      p.cold_slots.push_back(-where - 1);
    }
  }
  return p;
}

// (K) Int64 on device, its values written by fill(int64_t* dst). For a GPU they are written to page-locked memory and
// copied without waiting: the caching pinned allocator keeps the staging buffer until the copy is done, so a lookup
// and its backward queue their index lists without a host synchronisation each.
template <typename Fill>
Tensor staged_index_tensor(int64_t k, Device device, Fill fill) {
  Tensor staged = internal::empty({k}, {.dtype = DType::Int64, .pinned_memory = device.is_cuda()});
  if (k > 0) fill(staged.data_ptr<int64_t>());
  return device.is_cuda() ? internal::to(staged, device, {}, /*non_blocking=*/true) : internal::to(staged, device);
}

Tensor index_tensor(const std::vector<int64_t>& v, Device device) {
  return staged_index_tensor(static_cast<int64_t>(v.size()), device,
                             [&](int64_t* dst) { std::memcpy(dst, v.data(), v.size() * sizeof(int64_t)); });
}

// One lookup's partition and its index lists where they are used, made by one copy (make_lists): hot_slots, hot_pos,
// cold_pos and order (output position i reads row order[i] of [hot rows; cold rows]) on the device, and cold_slots
// there too when the cold tier is mapped (read, and its gradients kept, on the device).
struct LookupLists {
  Partition p;
  uint64_t slot_version = 0;                   // the placement's (slot's storage's) version they were made from
  Tensor hot_slots, hot_pos, cold_pos, order;  // (Nh), (Nh), (Nc), (N) Int64 on the device
  Tensor cold_slots;                           // (Nc) Int64 on the device when mapped, else undefined
};

std::shared_ptr<const LookupLists> make_lists(Partition p, Device device, bool mapped, const Tensor& slot) {
  const auto nh = static_cast<int64_t>(p.hot_pos.size()), nc = static_cast<int64_t>(p.cold_pos.size());
  // [hot_slots | hot_pos | cold_pos | order | cold_slots (mapped)], one buffer, one copy to the device.
  const Tensor all = staged_index_tensor(3 * (nh + nc) + (mapped ? nc : 0), device, [&](int64_t* dst) {
    const auto put = [&dst](const std::vector<int64_t>& v) { dst = std::copy(v.begin(), v.end(), dst); };
    put(p.hot_slots);
    put(p.hot_pos);
    put(p.cold_pos);
    for (int64_t j = 0; j < nh; ++j) dst[p.hot_pos[j]] = j;
    for (int64_t j = 0; j < nc; ++j) dst[p.cold_pos[j]] = nh + j;
    dst += nh + nc;
    if (mapped) put(p.cold_slots);
  });
  auto lists = std::make_shared<LookupLists>();
  int64_t at = 0;
  const auto next = [&](int64_t k) {
    const Tensor t = internal::narrow(all, 0, at, k);
    at += k;
    return t;
  };
  lists->hot_slots = next(nh);
  lists->hot_pos = next(nh);
  lists->cold_pos = next(nc);
  lists->order = next(nh + nc);
  if (mapped) lists->cold_slots = next(nc);
  lists->p = std::move(p);
  lists->slot_version = slot.impl().storage()->version();
  return lists;
}

// dst[i] = src[rows[i]] for every i: below, with the table's other host row copies.
void copy_rows_in_chunks(const Tensor& dst, const Tensor& src, const std::vector<int64_t>& rows);

// t[rows[i]] = values[i] in place (t (R, ...), rows (K) on t's device, values (K, ...)).
void write_rows(Tensor t, const Tensor& rows, const Tensor& values) {
  const int64_t k = rows.numel();
  if (k == 0) return;
  Shape expected = t.shape();
  expected[0] = k;
  Shape one(static_cast<size_t>(t.dim()), 1);
  one[0] = k;
  const Tensor index = internal::expand(internal::reshape(rows, one), expected);  // stride 0 beyond dim 0
  internal::scatter_(t, 0, index, internal::cast(values, t.dtype()));
}

// Both tiers take a gradient on every call, empty when no row of theirs was looked up, as one table would: the
// rows of g (N, D) at hot_pos for hot's rows hot_slots, those at cold_pos for cold's rows cold_slots (on the device
// when the cold tier's gradients are device-held, else on the host).
void give_tier_grads(const Tensor& hot, const Tensor& cold, const Tensor& g, const Tensor& hot_pos,
                     const Tensor& hot_slots, const Tensor& cold_pos, const Tensor& cold_slots) {
  if (hot.requires_grad()) {
    const Tensor rows = internal::index_select(g, 0, hot_pos);
    autograd::accumulate_sparse_grad(hot, {hot_slots, internal::to(rows, hot.device(), hot.dtype()), hot.shape()});
  }
  if (cold.requires_grad()) {
    const Tensor rows = internal::index_select(g, 0, cold_pos);
    autograd::accumulate_sparse_grad(cold,
                                     {cold_slots, internal::to(rows, cold_slots.device(), cold.dtype()), cold.shape()});
  }
}

// The lookup as one node: forward reads the rows gathered from both tiers (hot ones, then cold ones) in output order;
// backward gives each tier the gradients of its own rows, sparse: the hot tier's on its device, the cold tier's on
// the host, or left on the device when device_held (ColdReads::Mapped on a GPU: the optimizer then updates them
// through the mapping). While the placement is the forward's (slot's version unchanged: the usual case) backward
// reuses the forward's index lists on the device, so it neither reads the ids again nor copies an index list; after
// a rebalance or a load between the two it redoes the split from the ids and the placement of its own time, so that
// each gradient still reaches its row.
struct HybridLookupFunction : autograd::Function<HybridLookupFunction> {
  static Tensor forward(autograd::Context& ctx, const Tensor& hot, const Tensor& cold, const Tensor& rows,
                        const Tensor& ids, const Tensor& slot, std::shared_ptr<const LookupLists> lists,
                        bool device_held) {
    ctx.set("hot", hot);  // the leaves the rows' gradients accumulate into
    ctx.set("cold", cold);
    ctx.set("ids", ids);    // (N) Int64 on the CPU, contiguous or not
    ctx.set("slot", slot);  // (V) the module's placement (a handle: rebalance changes it in place)
    ctx.set("device_held", device_held);
    const Tensor order = lists->order;
    ctx.set("lists", std::move(lists));
    return internal::index_select(rows, 0, order);  // (N, D)
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const Tensor hot = ctx.get<Tensor>("hot"), cold = ctx.get<Tensor>("cold");
    const bool device_held = ctx.get<bool>("device_held");
    const Tensor g = internal::contiguous(grads[0]);  // (N, D)
    auto lists = ctx.get<std::shared_ptr<const LookupLists>>("lists");
    const Tensor& slot = ctx.get<Tensor>("slot");
    if (slot.impl().storage()->version() != lists->slot_version)  // a rebalance or a load moved rows
      lists = make_lists(partition(view_of(ctx.get<Tensor>("ids")), slot), g.device(), device_held, slot);
    give_tier_grads(hot, cold, g, lists->hot_pos, lists->hot_slots, lists->cold_pos,
                    device_held ? lists->cold_slots : index_tensor(lists->p.cold_slots, cold.device()));
    return {Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};  // one per Tensor argument
  }
};

#if KILN_WITH_CUDA
// A lookup whose placement is on the device (HybridEmbedding::places_on_device): what its backward needs.
struct PlacedLookup {
  Tensor ids;   // (N) Int64 on the device
  Tensor slot;  // (V) the module's placement on the host (a handle: its version tells of a rebalance)
  uint64_t slot_version = 0;
  Tensor where;        // (N) Int32 on the device: each id's place (cuda_impl::placed_lookup)
  Tensor tiers;        // (2) Int64 in page-locked memory: the ids in each tier, copied from the device ...
  cuda::Event copied;  // ... once this has happened
};

// The placed lookup as one node: forward is one kernel (cuda_impl::placed_lookup); backward splits the positions by
// tier on the device, so it reads only the two tier sizes back (copied after the forward's kernel, long done by
// then). After a rebalance or a load between the two it splits on the host by the placement of its own time.
struct PlacedLookupFunction : autograd::Function<PlacedLookupFunction> {
  static Tensor forward(autograd::Context& ctx, const Tensor& hot, const Tensor& cold,
                        std::shared_ptr<PlacedLookup> lookup, const Tensor* device_slot, const Tensor* counts) {
    const int64_t n = lookup->ids.numel();
    const Device dev = hot.device();
    Tensor out = internal::empty({n, hot.size(1)}, {.dtype = hot.dtype(), .device = dev});
    lookup->where = internal::empty({n}, {.dtype = DType::Int32, .device = dev});
    const Tensor tiers = internal::empty({2}, {.dtype = DType::Int64, .device = dev});
    cuda_impl::placed_lookup(out, lookup->where, tiers, lookup->ids, *device_slot, hot.detach(), cold.detach(),
                             counts != nullptr ? *counts : Tensor());
    lookup->tiers = internal::empty({2}, {.dtype = DType::Int64, .pinned_memory = true});
    lookup->tiers.copy_(tiers, /*non_blocking=*/true);
    lookup->copied.record(cuda::current_stream(dev.index()));
    ctx.set("hot", hot);
    ctx.set("cold", cold);
    ctx.set("lookup", std::move(lookup));
    return out;  // (N, D)
  }
  static autograd::TensorList backward(autograd::Context& ctx, const autograd::TensorList& grads) {
    const Tensor hot = ctx.get<Tensor>("hot"), cold = ctx.get<Tensor>("cold");
    const auto& lookup = ctx.get<std::shared_ptr<PlacedLookup>>("lookup");
    const Tensor g = internal::contiguous(grads[0]);  // (N, D)
    const Device dev = g.device();
    if (lookup->slot.impl().storage()->version() != lookup->slot_version) {  // a rebalance or a load moved rows
      const Tensor ids = internal::to(lookup->ids, Device::cpu());
      const auto lists = make_lists(partition(view_of(ids), lookup->slot), dev, /*mapped=*/true, lookup->slot);
      give_tier_grads(hot, cold, g, lists->hot_pos, lists->hot_slots, lists->cold_pos, lists->cold_slots);
      return {Tensor(), Tensor()};
    }
    lookup->copied.synchronize();
    const int64_t* sizes = lookup->tiers.data_ptr<int64_t>();
    const TensorOptions i64{.dtype = DType::Int64, .device = dev};
    const Tensor hot_pos = internal::empty({sizes[0]}, i64), hot_slots = internal::empty({sizes[0]}, i64);
    const Tensor cold_pos = internal::empty({sizes[1]}, i64), cold_slots = internal::empty({sizes[1]}, i64);
    cuda_impl::split_by_tier(lookup->where, hot_pos, hot_slots, cold_pos, cold_slots);
    give_tier_grads(hot, cold, g, hot_pos, hot_slots, cold_pos, cold_slots);
    return {Tensor(), Tensor()};  // one per Tensor argument
  }
};
#endif

}  // namespace

HybridEmbedding::HybridEmbedding(int64_t num_embeddings, int64_t embedding_dim, HybridEmbeddingOptions options)
    : Module("HybridEmbedding"),
      num_embeddings(num_embeddings),
      embedding_dim(embedding_dim),
      hot_rows(0),
      device(options.device),
      count_batches(options.count_batches),
      cold_reads(options.cold_reads) {
  const int64_t v = num_embeddings;
  KILN_CHECK(v > 0 && embedding_dim > 0, "HybridEmbedding: num_embeddings and embedding_dim must be positive, got ", v,
             " and ", embedding_dim);
  // The table's element and byte counts must fit in int64 (a wrapped count would allocate too little).
  (void)checked_nbytes({v, embedding_dim}, 4, "HybridEmbedding (num_embeddings, embedding_dim) table");
  if (options.hot_rows == -1) {
    KILN_CHECK(options.hot_fraction >= 0 && options.hot_fraction <= 1, "HybridEmbedding: hot_fraction ",
               options.hot_fraction, " is outside [0, 1]");
    hot_rows = std::llround(options.hot_fraction * static_cast<double>(v));
  } else {
    KILN_CHECK(options.hot_rows >= 0 && options.hot_rows <= v, "HybridEmbedding: hot_rows ", options.hot_rows,
               " is out of range for ", v, " rows; use a value in [0, ", v, "], or -1 for hot_fraction of them");
    hot_rows = options.hot_rows;
  }
  KILN_CHECK(count_batches >= 0, "HybridEmbedding: count_batches must be >= 0, got ", count_batches);
  if (options.frequencies.defined()) {
    const Tensor& f = options.frequencies;
    KILN_CHECK(f.dim() == 1 && f.numel() == v, "HybridEmbedding: frequencies of shape ", f.shape(), " for a table of ",
               v, " rows; give one number per row, shape [", v, "]");
    KILN_CHECK(f.dtype() != DType::Bool, "HybridEmbedding: frequencies must be numbers, got ", f.dtype());
    const Tensor host = internal::contiguous(internal::to(f.detach(), Device::cpu(), DType::Float64));
    const double* d = host.data_ptr<double>();
    frequencies_.assign(d, d + v);
    for (int64_t r = 0; r < v; ++r)
      KILN_CHECK(std::isfinite(frequencies_[r]) && frequencies_[r] >= 0, "HybridEmbedding: frequencies[", r, "] is ",
                 frequencies_[r], "; frequencies must be finite and non-negative");
  }
  const int64_t h = hot_rows;
  hot = register_parameter("hot", internal::empty({h, embedding_dim}, {.device = device}));
  cold = register_parameter("cold", internal::empty({v - h, embedding_dim}, {.pinned_memory = device.is_cuda()}));
  slot = register_buffer("slot", internal::zeros({v}, {.dtype = DType::Int64}));
  counts = register_buffer("counts", internal::zeros({v}, {.dtype = DType::Int64}));
  if (!frequencies_.empty()) {
    place_by(frequencies_);
  } else {
    int64_t* s = slot.data_ptr<int64_t>();  // rows 0..H-1 hot, in order; the rest cold, in order
    for (int64_t r = 0; r < v; ++r) s[r] = r < h ? r : -(r - h) - 1;
  }
  counting_ = count_batches > 0;
  reset_parameters();
}

void HybridEmbedding::reset_parameters(Generator* gen) {
  wait_for_device_access();
  init::normal_(hot, 0, 1, gen);
  init::normal_(cold, 0, 1, gen);
}

void HybridEmbedding::place_by(const std::vector<double>& score) {
  const int64_t v = num_embeddings, h = hot_rows;
  // The H first rows by (score descending, row ascending): a strict total order, so the set is exact.
  std::vector<int64_t> order(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), int64_t{0});
  auto before = [&](int64_t a, int64_t b) { return score[a] != score[b] ? score[a] > score[b] : a < b; };
  if (h < v) std::nth_element(order.begin(), order.begin() + h, order.end(), before);
  std::vector<char> is_hot(static_cast<size_t>(v), 0);
  for (int64_t i = 0; i < h; ++i) is_hot[order[i]] = 1;
  int64_t* s = slot.data_ptr<int64_t>();  // hot and cold slots in row order
  int64_t next_hot = 0, next_cold = 0;
  for (int64_t r = 0; r < v; ++r) s[r] = is_hot[r] ? next_hot++ : -(next_cold++) - 1;
  slot.impl().storage()->bump_version();  // a lookup's backward sees that the placement changed (LookupLists)
}

std::vector<double> HybridEmbedding::scores() const {
  const int64_t v = num_embeddings;
  std::vector<double> score(static_cast<size_t>(v));
  const int64_t* c = counts.data_ptr<int64_t>();
  for (int64_t r = 0; r < v; ++r) score[r] = static_cast<double>(c[r]) + (frequencies_.empty() ? 0.0 : frequencies_[r]);
  return score;
}

int64_t HybridEmbedding::slot_of(int64_t row) const {
  KILN_CHECK(row >= 0 && row < num_embeddings, "HybridEmbedding (", num_embeddings, " rows): row ", row,
             " is out of range [0, ", num_embeddings, ")");
  return slot.data_ptr<int64_t>()[row];
}

bool HybridEmbedding::maps_cold() const {
  return device.is_cuda() && cold_reads == ColdReads::Mapped && cold.is_pinned();
}

Tensor HybridEmbedding::gather_cold(const std::vector<int64_t>& cold_slots, const Tensor& device_slots) {
  const auto n = static_cast<int64_t>(cold_slots.size());
#if KILN_WITH_CUDA
  if (maps_cold()) {
    device_access_ = device;  // this read, and the update of its rows' gradients, run on the device
    Tensor out = internal::empty({n, embedding_dim}, {.dtype = cold.dtype(), .device = device});
    cuda_impl::gather_host_rows(out, cold.detach(),
                                device_slots.defined() ? device_slots : index_tensor(cold_slots, device));
    return out;
  }
#else
  (void)device_slots;
#endif
  // index_select on the host table into page-locked memory, then one copy of the (N, D) rows to the device, which
  // the host does not wait for (the caching pinned allocator keeps the buffer until the copy is done).
  wait_for_device_access();
  if (!device.is_cuda()) return internal::index_select(cold.detach(), 0, index_tensor(cold_slots, Device::cpu()));
  Tensor staged = internal::empty({n, embedding_dim}, {.dtype = cold.dtype(), .pinned_memory = true});
  copy_rows_in_chunks(staged, cold.detach(), cold_slots);
  return internal::to(staged, device, {}, /*non_blocking=*/true);
}

void HybridEmbedding::wait_for_device_access() const {
  // While mapped, the device may be reading or writing the cold tier at any time (a step's update comes after the
  // lookup, with no call here in between): always wait. After a switch to Copy, wait once for the mapped steps.
  if (maps_cold()) {
    cuda::synchronize(device.index());
  } else if (device_access_) {
    cuda::synchronize(device_access_->index());
  }
  device_access_.reset();
}

Tensor HybridEmbedding::forward(const Tensor& ids) {
  KILN_CHECK(is_integral(ids.dtype()), "HybridEmbedding: expected integer ids (Int64), got ", ids.dtype(), " of shape ",
             ids.shape());
  // The ids on the host, where the placement and the counts are: (N) Int64, a view where the ids are Int64 on the
  // CPU already (a column of a batch's ids, say: read at its stride, not copied). A lookup placed on the device reads
  // ids given on the GPU there (its kernel checks them), and checks ids given on the host here.
  const bool placed = places_on_device();
  const int64_t n = ids.numel(), v = num_embeddings;
  Tensor host;
  if (!placed || ids.is_cpu()) {
    host = internal::reshape(internal::to(ids.detach(), Device::cpu(), DType::Int64), {n});
    const IdView id = view_of(host);
    for (int64_t i = 0; i < n; ++i)
      KILN_CHECK(id[i] >= 0 && id[i] < v, display_name(), " (", v, " x ", embedding_dim, " table): id ", id[i],
                 " at position ", i, " of the ids is out of range [0, ", v, ")");
  }

  // The automatic rebalance, once count_batches calls were counted, at a call with no pending gradient. With a
  // count_reduction the ranks decide together, at a training-mode call (one every rank makes: the same step).
  if (counting_ && calls_counted_ >= count_batches && (is_training() || !count_reduction) &&
      !on_any_rank(autograd::has_sparse_grad(hot) || autograd::has_sparse_grad(cold)))
    (void)place_and_swap();
#if KILN_WITH_CUDA
  if (placed) return placed_forward(ids, host);
#endif
  const IdView id = view_of(host);
  if (device_counted_ > 0) fold_device_counts();  // lookups counted on the device before a switch to Copy
  int64_t* count_into = nullptr;  // training: this rank's own pending counts, or counts (added by the split below)
  if (is_training()) {
    if (count_reduction && !pending_.defined()) pending_ = internal::zeros({v}, {.dtype = DType::Int64});
    count_into = (count_reduction ? pending_ : counts).data_ptr<int64_t>();
    if (counting_) ++calls_counted_;
  }

  const bool device_held = maps_cold();  // the cold rows' gradients stay on the device, updated through the mapping
  const std::shared_ptr<const LookupLists> lists =
      make_lists(partition(id, slot, count_into), device, device_held, slot);
  const Tensor hot_rows_got = internal::index_select(hot.detach(), 0, lists->hot_slots);      // (Nh, D)
  const Tensor cold_rows_got = gather_cold(lists->p.cold_slots, lists->cold_slots);           // (Nc, D)
  const Tensor rows = internal::cat({hot_rows_got, cold_rows_got}, 0);                        // (Nh + Nc, D)
  Tensor out = HybridLookupFunction::apply(hot, cold, rows, host, slot, lists, device_held);  // (N, D)
  Shape shape = ids.shape();
  shape.push_back(embedding_dim);
  return out.reshape(shape);  // (..., D)
}

bool HybridEmbedding::places_on_device() const {
#if KILN_WITH_CUDA
  return maps_cold() && num_embeddings <= std::numeric_limits<int32_t>::max();
#else
  return false;
#endif
}

int64_t HybridEmbedding::device_placement_bytes() const {
  int64_t bytes = 0;
  for (const Tensor* t : {&device_slot_, static_cast<const Tensor*>(&device_counts_)})
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  return bytes;
}

void HybridEmbedding::fold_device_counts() const {
  if (device_counted_ == 0 || !device_counts_.defined()) return;
  const Tensor counted = internal::to(device_counts_, Device::cpu());  // waits for the lookups
  const int32_t* d = counted.data_ptr<int32_t>();
  int64_t* c = (pending_.defined() ? pending_ : counts).data_ptr<int64_t>();  // this rank's own, or counts
  for (int64_t r = 0; r < num_embeddings; ++r) c[r] += d[r];
  device_counts_.zero_();
  device_counted_ = 0;
}

#if KILN_WITH_CUDA
const Tensor& HybridEmbedding::device_slot() {
  const uint64_t version = slot.impl().storage()->version();
  if (!device_slot_.defined() || device_slot_version_ != version || device_slot_.device() != device) {
    device_slot_ = Tensor();  // the old copy's memory first
    device_slot_ = internal::to(internal::cast(slot, DType::Int32), device);
    device_slot_version_ = version;
  }
  return device_slot_;
}

Tensor HybridEmbedding::placed_forward(const Tensor& ids, const Tensor& host_ids) {
  const int64_t n = ids.numel(), v = num_embeddings;
  const Tensor* count_into = nullptr;
  if (is_training()) {
    if (count_reduction && !pending_.defined()) pending_ = internal::zeros({v}, {.dtype = DType::Int64});
    if (!device_counts_.defined() || device_counts_.device() != device) {
      fold_device_counts();
      device_counts_ = internal::zeros({v}, {.dtype = DType::Int32, .device = device});
    }
    // An Int32 count cannot pass 2^31 - 1 while at most that many ids were counted since the last fold.
    if (device_counted_ > std::numeric_limits<int32_t>::max() - n) fold_device_counts();
    device_counted_ += n;
    count_into = &device_counts_;
    if (counting_) ++calls_counted_;
  }
  auto lookup = std::make_shared<PlacedLookup>();
  if (host_ids.defined()) {  // staged in page-locked memory and copied without waiting
    const IdView id = view_of(host_ids);
    lookup->ids = staged_index_tensor(n, device, [&](int64_t* dst) {
      for (int64_t i = 0; i < n; ++i) dst[i] = id[i];
    });
  } else {
    lookup->ids = internal::contiguous(internal::reshape(internal::to(ids.detach(), device, DType::Int64), {n}));
  }
  lookup->slot = slot;
  lookup->slot_version = slot.impl().storage()->version();
  device_access_ = device;  // this lookup, and the update of its rows' gradients, read and write the cold tier
  // A bad id on the GPU is reported later, under this table's name (as nn::Embedding's are).
  kiln::detail::IndexOpScope scope(
      [](const void* self) {
        const auto& e = *static_cast<const HybridEmbedding*>(self);
        return ::kiln::detail::str_cat(e.display_name(), " (", e.num_embeddings, " x ", e.embedding_dim, " table)");
      },
      this);
  Tensor out = PlacedLookupFunction::apply(hot, cold, std::move(lookup), &device_slot(), count_into);  // (N, D)
  Shape shape = ids.shape();
  shape.push_back(embedding_dim);
  return out.reshape(shape);  // (..., D)
}
#endif

void HybridEmbedding::sum_over_ranks(Tensor& t, const char* what) const {
  const Shape shape = t.shape();
  Tensor reduced = t;  // the hook may reduce in place or assign its result
  count_reduction(reduced);
  KILN_CHECK(reduced.defined() && reduced.shape() == shape && reduced.dtype() == DType::Int64 && reduced.is_cpu(),
             display_name(), " (", num_embeddings, " rows): count_reduction was given the ", what, ", shape ", shape,
             " Int64 on the CPU, and gave back ",
             reduced.defined()
                 ? ::kiln::detail::str_cat("shape ", reduced.shape(), " ", reduced.dtype(), " on ", reduced.device())
                 : std::string("an undefined tensor"),
             "; it must sum the tensor over the ranks in place (dist::share_placement sets one that does)");
  if (!reduced.is_same(t)) t.copy_(reduced);
}

bool HybridEmbedding::on_any_rank(bool mine) const {
  if (!count_reduction) return mine;
  Tensor flag = internal::full({1}, mine ? 1 : 0, {.dtype = DType::Int64});  // (1): the ranks where it holds
  sum_over_ranks(flag, "flag of the ranks whose tiers hold a gradient");
  return flag.data_ptr<int64_t>()[0] > 0;
}

void HybridEmbedding::agree_counts() {
  fold_device_counts();
  const int64_t v = num_embeddings;
  if (!count_reduction && !pending_.defined()) return;  // the lookups went to counts directly
  // Every rank reduces, whether or not it counted anything (a collective), so every rank has a pending count.
  if (!pending_.defined()) pending_ = internal::zeros({v}, {.dtype = DType::Int64});
  if (count_reduction) sum_over_ranks(pending_, "counts pending since the last agreement");
  int64_t* c = counts.data_ptr<int64_t>();
  int64_t* p = pending_.data_ptr<int64_t>();
  for (int64_t r = 0; r < v; ++r) c[r] += p[r];
  if (count_reduction) {
    std::fill(p, p + v, int64_t{0});
  } else {
    pending_ = Tensor();  // count_reduction was unset: forward counts into counts again
  }
}

RowSwaps HybridEmbedding::rebalance() {
  const bool mine = autograd::has_sparse_grad(hot) || autograd::has_sparse_grad(cold) || hot.grad().defined() ||
                    cold.grad().defined();
  const bool anywhere = on_any_rank(mine);  // every rank takes the same branch: raises, or rebalances
  KILN_CHECK(!anywhere, "HybridEmbedding::rebalance: a tier still holds a gradient", mine ? "" : " on another rank",
             ", whose rows would no longer match; call rebalance after the optimizer step and zero_grad()",
             count_reduction ? " on every rank" : "");
  return place_and_swap();
}

RowSwaps HybridEmbedding::place_and_swap() {
  agree_counts();
  const int64_t v = num_embeddings;
  // The placement the scores ask for, then the rows that must change tier, each side in slot order.
  const std::vector<int64_t> before(slot.data_ptr<int64_t>(), slot.data_ptr<int64_t>() + v);
  place_by(scores());
  int64_t* s = slot.data_ptr<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> leaving, entering;  // (old slot index, row)
  for (int64_t r = 0; r < v; ++r) {
    if (before[r] >= 0 && s[r] < 0) leaving.emplace_back(before[r], r);
    if (before[r] < 0 && s[r] >= 0) entering.emplace_back(-before[r] - 1, r);
  }
  // place_by renumbered every slot; keep the old ones and pair the movers instead, so that only they move.
  std::copy(before.begin(), before.end(), s);
  std::sort(leaving.begin(), leaving.end());
  std::sort(entering.begin(), entering.end());
  const size_t m = leaving.size();  // == entering.size(): the tiers keep their sizes
  std::vector<int64_t> hot_slots(m), cold_slots(m);
  for (size_t i = 0; i < m; ++i) {
    hot_slots[i] = leaving[i].first;
    cold_slots[i] = entering[i].first;
    s[entering[i].second] = hot_slots[i];
    s[leaving[i].second] = -cold_slots[i] - 1;
  }
  slot.impl().storage()->bump_version();
  RowSwaps swaps{index_tensor(hot_slots, Device::cpu()), index_tensor(cold_slots, Device::cpu())};
  wait_for_device_access();
  {
    NoGradGuard no_grad;
    swap_rows(swaps, hot, cold);
  }
  counting_ = false;
  if (on_rebalance) on_rebalance(swaps);
  return swaps;
}

void HybridEmbedding::swap_rows(const RowSwaps& swaps, const Tensor& hot_like, const Tensor& cold_like) {
  KILN_CHECK(hot_like.defined() && cold_like.defined() && hot_like.dim() >= 1 && cold_like.dim() >= 1,
             "HybridEmbedding::swap_rows: needs two defined tensors of at least one dim");
  Shape a = hot_like.shape(), b = cold_like.shape();
  a.erase(a.begin());
  b.erase(b.begin());
  KILN_CHECK(a == b, "HybridEmbedding::swap_rows: rows of shape ", a, " and ", b, " cannot trade places");
  if (swaps.size() == 0) return;
  const Tensor hs = internal::to(swaps.hot_slots, hot_like.device());
  const Tensor cs = internal::to(swaps.cold_slots, cold_like.device());
  const Tensor from_hot = internal::index_select(hot_like.detach(), 0, hs);  // (M, ...): new copies
  const Tensor from_cold = internal::index_select(cold_like.detach(), 0, cs);
  write_rows(hot_like.detach(), hs, internal::to(from_cold, hot_like.device()));
  write_rows(cold_like.detach(), cs, internal::to(from_hot, cold_like.device()));
}

void HybridEmbedding::swap_state_rows(const RowSwaps& swaps, std::map<std::string, Tensor>& hot_state,
                                      std::map<std::string, Tensor>& cold_state) const {
  for (const auto& [name, h] : hot_state)
    KILN_CHECK(cold_state.count(name) != 0, "HybridEmbedding::swap_state_rows: the hot tier's optimizer state \"", name,
               "\" has no counterpart in the cold tier's; its rows could not follow the swap");
  for (const auto& [name, c] : cold_state) {
    auto it = hot_state.find(name);
    KILN_CHECK(it != hot_state.end(), "HybridEmbedding::swap_state_rows: the cold tier's optimizer state \"", name,
               "\" has no counterpart in the hot tier's; its rows could not follow the swap");
    const Tensor& h = it->second;
    const bool per_row =
        h.dim() >= 1 && c.dim() >= 1 && h.size(0) == hot_rows && c.size(0) == num_embeddings - hot_rows;
    if (per_row) swap_rows(swaps, h, c);
  }
}

namespace {

// Row r of the logical table for each slot: hot_rows_of[s] and cold_rows_of[s] (the inverse of slot).
struct SlotRows {
  std::vector<int64_t> hot, cold;
};
SlotRows rows_by_slot(const Tensor& slot, int64_t hot_rows) {
  const int64_t v = slot.numel();
  const int64_t* s = slot.data_ptr<int64_t>();
  SlotRows out{std::vector<int64_t>(static_cast<size_t>(hot_rows)),
               std::vector<int64_t>(static_cast<size_t>(v - hot_rows))};
  for (int64_t r = 0; r < v; ++r) (s[r] >= 0 ? out.hot[s[r]] : out.cold[-s[r] - 1]) = r;
  return out;
}

// dst[i] = src[rows[i]] for every i (dst (K, D) on any device and dtype, src (V, D)), a bounded number of rows at a
// time, so that no (K, D) temporary the size of the table is made.
void copy_rows_in_chunks(const Tensor& dst, const Tensor& src, const std::vector<int64_t>& rows) {
  const int64_t k = static_cast<int64_t>(rows.size());
  if (k == 0) return;
  const int64_t row_bytes = std::max<int64_t>(1, src.numel() / std::max<int64_t>(1, src.size(0))) *
                            static_cast<int64_t>(element_size(src.dtype()));
  if (dst.is_cpu() && src.is_cpu() && dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    auto* d = static_cast<char*>(dst.data_ptr());  // host rows by memcpy, at memory speed
    const auto* from = static_cast<const char*>(src.data_ptr());
    for (int64_t i = 0; i < k; ++i)
      std::memcpy(d + i * row_bytes, from + rows[i] * row_bytes, static_cast<size_t>(row_bytes));
    dst.impl().storage()->bump_version();
    return;
  }
  const int64_t chunk = std::max<int64_t>(1, (int64_t{64} << 20) / row_bytes);  // about 64 MiB of rows
  for (int64_t start = 0; start < k; start += chunk) {
    const int64_t n = std::min(chunk, k - start);
    const std::vector<int64_t> part(rows.begin() + start, rows.begin() + start + n);
    Tensor piece = internal::narrow(dst, 0, start, n);
    piece.copy_(internal::index_select(src, 0, index_tensor(part, src.device())));
  }
}

}  // namespace

Tensor HybridEmbedding::table() const {
  wait_for_device_access();  // the device's reads and writes of the cold tier
  // One (V, D) tensor, each tier's rows written to their rows in place: at most the table and a host copy of the
  // hot tier beside the tiers, never a second table.
  Tensor out = internal::empty({num_embeddings, embedding_dim}, {.dtype = cold.dtype()});
  const Tensor h = internal::contiguous(internal::to(hot.detach(), Device::cpu(), cold.dtype()));
  const Tensor c = internal::contiguous(cold.detach());
  const int64_t row_bytes = embedding_dim * static_cast<int64_t>(element_size(out.dtype()));
  const int64_t* s = slot.data_ptr<int64_t>();
  auto* o = static_cast<char*>(out.data_ptr());
  const auto* hp = static_cast<const char*>(h.data_ptr());
  const auto* cp = static_cast<const char*>(c.data_ptr());
  for (int64_t r = 0; r < num_embeddings; ++r) {
    const char* from = s[r] >= 0 ? hp + s[r] * row_bytes : cp + (-s[r] - 1) * row_bytes;
    std::memcpy(o + r * row_bytes, from, static_cast<size_t>(row_bytes));
  }
  return out;
}

Tensor HybridEmbedding::calls_state() const {
  return internal::full({}, counting_ ? calls_counted_ : -1, {.dtype = DType::Int64});
}

StateDict HybridEmbedding::own_state() const {
  fold_device_counts();  // the counts saved hold every lookup so far
  return {{"weight", table()}, {"slot", slot.detach()}, {"counts", counts.detach()}, {"calls_counted", calls_state()}};
}

StateDict HybridEmbedding::own_load_targets(const std::function<const Tensor*(const std::string&)>& given) {
  const int64_t v = num_embeddings, h = hot_rows;
  const Tensor* s = given("slot");
  slot_given_ = s != nullptr;
  counts_given_ = given("counts") != nullptr;
  if (s != nullptr && s->shape() == Shape{v}) {  // another shape is reported as a mismatch by load_state_dict
    KILN_CHECK(is_integral(s->dtype()), "HybridEmbedding.load_state_dict: \"slot\" must hold integers, got ",
               s->dtype());
    const Tensor host = internal::contiguous(internal::to(s->detach(), Device::cpu(), DType::Int64));
    const int64_t* p = host.data_ptr<int64_t>();
    int64_t saved_hot = 0;
    for (int64_t r = 0; r < v; ++r) saved_hot += p[r] >= 0 ? 1 : 0;
    KILN_CHECK(saved_hot == h, "HybridEmbedding.load_state_dict: the saved table has ", saved_hot,
               " hot rows, this one ", h, "; construct it with hot_rows = ", saved_hot);
    std::vector<char> hot_taken(static_cast<size_t>(h), 0), cold_taken(static_cast<size_t>(v - h), 0);
    for (int64_t r = 0; r < v; ++r) {
      const bool is_hot = p[r] >= 0;
      const int64_t i = is_hot ? p[r] : -p[r] - 1;
      std::vector<char>& taken = is_hot ? hot_taken : cold_taken;
      KILN_CHECK(i < static_cast<int64_t>(taken.size()) && !taken[i], "HybridEmbedding.load_state_dict: \"slot\" ",
                 "is not a placement of ", v, " rows with ", h, " hot: row ", r, " has slot ", p[r],
                 (i < static_cast<int64_t>(taken.size()) ? ", taken twice" : ", out of range"), " (hot slots are 0..",
                 h - 1, ", cold ones -1..", -(v - h));
      taken[i] = 1;
    }
  }
  // The given table itself is the target when it is whole (nothing is copied: finish_load_state scatters it into the
  // tiers); otherwise a staging copy of the current values, so that what the state lacks (strict = false) stays.
  const Tensor* w = given("weight");
  const Shape table_shape{v, embedding_dim};
  staged_weight_ = w != nullptr && w->shape() == table_shape ? *w
                   : w != nullptr ? internal::empty(table_shape)  // a mismatch: nothing loads
                                  : table();
  staged_slot_ = slot.clone();
  staged_counts_ = counts.clone();
  staged_calls_ = calls_state();
  const Tensor* calls = given("calls_counted");
  calls_given_ = calls != nullptr;
  if (calls != nullptr && calls->shape() == Shape{}) {  // another shape is reported as a mismatch
    KILN_CHECK(is_integral(calls->dtype()),
               "HybridEmbedding.load_state_dict: \"calls_counted\" must be an integer, got ", calls->dtype());
    const int64_t n = internal::to(calls->detach(), Device::cpu(), DType::Int64).item<int64_t>();
    KILN_CHECK(n >= -1, "HybridEmbedding.load_state_dict: \"calls_counted\" is ", n,
               "; it is the number of forward calls counted so far, or -1 once the counting phase is over");
  }
  return {
      {"weight", staged_weight_}, {"slot", staged_slot_}, {"counts", staged_counts_}, {"calls_counted", staged_calls_}};
}

void HybridEmbedding::finish_load_state() {
  if (!staged_weight_.defined()) return;
  wait_for_device_access();
  NoGradGuard no_grad;
  slot.copy_(staged_slot_);  // (a new version: a lookup's backward redoes its split)
  counts.copy_(staged_counts_);
  const SlotRows rows = rows_by_slot(slot, hot_rows);  // slot -> row
  copy_rows_in_chunks(hot.detach(), staged_weight_, rows.hot);
  copy_rows_in_chunks(cold.detach(), staged_weight_, rows.cold);
  if (calls_given_) {  // the saved counting phase: a resumed run rebalances at the same call as the one that saved
    const int64_t n = staged_calls_.item<int64_t>();
    counting_ = n >= 0 && count_batches > 0;
    calls_counted_ = std::max<int64_t>(n, 0);
  } else if (slot_given_) {
    counting_ = false;  // the saved placement stands
  }
  if (counts_given_ && pending_.defined()) pending_.zero_();  // the loaded counts stand for every rank's
  if (counts_given_ && device_counted_ > 0) {                 // and for the lookups not yet added from the device
    device_counts_.zero_();
    device_counted_ = 0;
  }
  staged_weight_ = staged_slot_ = staged_counts_ = staged_calls_ = Tensor();
}

void HybridEmbedding::abandon_load_state() {
  staged_weight_ = staged_slot_ = staged_counts_ = staged_calls_ = Tensor();
}

void HybridEmbedding::to_own(const MoveRequest& request) {
  wait_for_device_access();  // the cold tier may be moved (a new dtype) or freed below
  fold_device_counts();      // the device's placement and counts are made again where the table goes
  device_slot_ = device_counts_ = Tensor();
  if (request.device) device = *request.device;
  set_data_in_place(hot, request.moved(hot));
  if (hot.grad().defined()) set_data_in_place(hot.grad(), request.moved(hot.grad()));
  const MoveRequest host_only{std::nullopt, request.dtype, std::nullopt, request.non_blocking};
  Tensor c = host_only.moved(cold);
  if (device.is_cuda() && !c.is_pinned()) c = c.pin_memory();
  set_data_in_place(cold, c);
  if (cold.grad().defined()) set_data_in_place(cold.grad(), host_only.moved(cold.grad()));
}

}  // namespace kiln::nn
