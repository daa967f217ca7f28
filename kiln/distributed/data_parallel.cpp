// kiln/distributed/data_parallel.cpp — the gradient reducer: buckets of flat gradient buffers, filled as the
// post-accumulate hooks of their parameters fire and all-reduced (average) in bucket order, then copied back
// into each parameter's grad() by a callback at the end of backward.
#include "kiln/distributed/data_parallel.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"  // NoGradGuard
#include "kiln/tensor/cuda.h"         // cuda::Graph::capturing
#include "kiln/tensor/internal_ops.h"

namespace kiln::dist {

struct DataParallel::State {
  struct Bucket {
    std::vector<size_t> params;    // indices into State::params
    std::vector<int64_t> offsets;  // where each parameter's gradient starts in flat
    Tensor flat;                   // (total elements) of the parameters' dtype, on their device
    size_t pending = 0;            // parameters whose gradient has not arrived in this backward
    bool launched = false;
    bool dirty = false;  // a gradient changed after the bucket was sent (a parameter reached twice)
    WorkPtr work;
  };

  ProcessGroup* group = nullptr;
  bool find_unused = false;
  std::vector<Tensor> params;
  std::vector<std::string> names;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;  // param -> its bucket
  std::vector<uint64_t> hooks;

  bool sync = true;     // false under no_sync()
  bool active = false;  // a backward that reaches the parameters is under way; finish() is queued
  std::vector<char> ready;
  size_t next_launch = 0;

  void begin_backward(const std::weak_ptr<State>& self) {
    active = true;
    std::fill(ready.begin(), ready.end(), 0);
    for (Bucket& b : buckets) {
      b.pending = b.params.size();
      b.launched = false;
      b.dirty = false;
    }
    next_launch = 0;
    autograd::queue_callback([self] {
      if (auto s = self.lock()) s->finish();
    });
  }

  void mark_ready(size_t p) {
    Bucket& bucket = buckets[bucket_of[p]];
    if (ready[p]) {  // accumulated again (a checkpointed segment recomputed, a weight shared across segments)
      if (bucket.launched) bucket.dirty = true;
      return;
    }
    ready[p] = 1;
    if (--bucket.pending == 0) launch_in_order();
  }

  // Buckets start in index order on every rank, whatever order their gradients complete in, so that all
  // ranks issue the same collectives in the same order.
  void launch_in_order() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(buckets[next_launch++]);
  }

  void launch(Bucket& bucket) {
    // The collectives run on a communication stream behind the watchdog, neither of which a capture records.
    KILN_CHECK_AS(NotImplementedError, !cuda::Graph::capturing(),
                  "dist::DataParallel: a backward under DataParallel cannot be captured in a CUDA graph yet; "
                  "run data-parallel steps eagerly");
    NoGradGuard no_grad;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const Tensor& p = params[bucket.params[k]];
      Tensor slice = bucket.flat.narrow(0, bucket.offsets[k], p.numel());
      const Tensor& g = p.grad();
      if (g.defined()) {
        slice.view(p.shape()).copy_(g);  // any layout of g (channels-last included)
      } else {
        slice.zero_();  // unused on this rank: counts as zero
      }
    }
    bucket.work = group->all_reduce_async(bucket.flat, ReduceOp::Average);
    bucket.launched = true;
  }

  // The end of backward: every bucket sent (or an error), then the averages copied into grad().
  void finish() {
    active = false;
    NoGradGuard no_grad;
    std::vector<std::string> missing;
    for (size_t p = 0; p < params.size(); ++p) {
      if (!ready[p]) missing.push_back(names[p]);
    }
    if (!missing.empty() && !find_unused) {
      // The buckets already sent must finish before their buffers are filled again.
      for (size_t b = 0; b < next_launch; ++b) buckets[b].work->wait();
      std::ostringstream s;
      s << "dist::DataParallel: rank " << group->rank() << ": " << missing.size() << " of " << params.size()
        << " parameters got no gradient in this backward:";
      for (size_t i = 0; i < missing.size() && i < 10; ++i) s << " " << missing[i];
      if (missing.size() > 10) s << " ...";
      s << ". Every parameter must take part in the loss on every rank (the other ranks now wait for this "
           "one's gradients); if some parameters are unused by design, construct DataParallel with "
           "{.find_unused_parameters = true}, or set requires_grad_(false) on the parameters you freeze.";
      throw DistributedError(s.str());
    }
    for (size_t p = 0; p < params.size(); ++p) {
      if (!ready[p]) mark_ready(p);  // find_unused: their gradients count as zero here
    }
    for (Bucket& b : buckets) {
      if (!b.dirty) continue;
      b.work->wait();  // the stale sum must be done before the buffer is refilled
      launch(b);
    }
    for (Bucket& b : buckets) {
      b.work->wait();
      for (size_t k = 0; k < b.params.size(); ++k) {
        Tensor& p = params[b.params[k]];
        Tensor avg = b.flat.narrow(0, b.offsets[k], p.numel()).view(p.shape());
        Tensor& g = p.mutable_grad();
        if (g.defined()) {
          g.copy_(avg);
        } else {
          g = avg.clone(MemoryFormat::Contiguous).contiguous(p.suggest_memory_format());
        }
      }
    }
  }
};

namespace {

// Packs tensors of one dtype and device into one buffer, broadcasts it from rank 0, and unpacks.
void broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors) {
  std::map<DType, std::vector<Tensor>> by_dtype;
  for (const Tensor& t : tensors) by_dtype[t.dtype()].push_back(t.detach());
  NoGradGuard no_grad;
  for (auto& [dtype, list] : by_dtype) {
    int64_t total = 0;
    for (const Tensor& t : list) total += t.numel();
    Tensor flat = internal::empty({total}, {.dtype = dtype, .device = list[0].device()});
    int64_t off = 0;
    for (const Tensor& t : list) {
      flat.narrow(0, off, t.numel()).view(t.shape()).copy_(t);
      off += t.numel();
    }
    group.broadcast(flat, 0);
    off = 0;
    for (Tensor& t : list) {
      t.copy_(flat.narrow(0, off, t.numel()).view(t.shape()));
      off += t.numel();
    }
  }
}

// Every rank must hold the same model: the number of parameters and their sizes are compared by an all-reduce
// of (count, elements, a hash of the shapes) under Max and Min.
void check_same_model(ProcessGroup& group, Device device, const std::vector<Tensor>& params) {
  int64_t elements = 0;
  uint64_t hash = 1469598103934665603ull;
  for (const Tensor& p : params) {
    elements += p.numel();
    for (int64_t d : p.shape()) hash = (hash ^ static_cast<uint64_t>(d)) * 1099511628211ull;
    hash = (hash ^ static_cast<uint64_t>(p.dtype())) * 1099511628211ull;
  }
  const std::vector<int64_t> mine = {static_cast<int64_t>(params.size()), elements, static_cast<int64_t>(hash >> 1)};
  Tensor hi = internal::from_vector(mine, {3}, device);
  Tensor lo = hi.clone();
  group.all_reduce(hi, ReduceOp::Max);
  group.all_reduce(lo, ReduceOp::Min);
  const std::vector<int64_t> h = hi.to_vector<int64_t>(), l = lo.to_vector<int64_t>();
  KILN_CHECK_AS(DistributedError, h == l, "dist::DataParallel: rank ", group.rank(), "'s model has ", mine[0],
                " trainable parameters (", mine[1], " elements), but the ranks disagree (between ", l[0], " and ", h[0],
                " parameters, ", l[1], " and ", h[1],
                " elements, or different shapes/dtypes); every rank must build the same model");
}

}  // namespace

DataParallel::DataParallel(nn::ModulePtr module, DataParallelOptions options)
    : module_(std::move(module)), options_(options) {
  KILN_CHECK(module_ != nullptr, "dist::DataParallel: the module is null");
  KILN_CHECK(options_.bucket_mb > 0, "dist::DataParallel: bucket_mb must be positive, got ", options_.bucket_mb);
  const auto named = module_->named_parameters();
  KILN_CHECK(!named.empty(), "dist::DataParallel: the module has no parameters");
  const Device device = named.front().second.device();
  for (const auto& [name, p] : named) {
    KILN_CHECK(p.device() == device, "dist::DataParallel: parameter ", name, " is on ", p.device(), " but ",
               named.front().first, " is on ", device, "; move the whole model to one device (model->to(dev)) first");
  }
  group_ = options_.group != nullptr ? options_.group : &group(device);
  if (group_->size() == 1) return;  // one process: a plain wrapper

  auto s = std::make_shared<State>();
  s->group = group_;
  s->find_unused = options_.find_unused_parameters;
  for (const auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    s->params.push_back(p);
    s->names.push_back(name);
  }
  check_same_model(*group_, device, s->params);

  std::vector<Tensor> to_broadcast = module_->parameters();
  if (options_.broadcast_buffers) {
    for (const Tensor& b : module_->buffers()) to_broadcast.push_back(b);
  }
  broadcast_coalesced(*group_, to_broadcast);

  // Buckets: parameters in reverse order (backward reaches the last layers first), split by dtype and by size.
  const auto cap = static_cast<int64_t>(options_.bucket_mb * 1024 * 1024);
  s->bucket_of.resize(s->params.size());
  std::map<DType, size_t> open;  // dtype -> the bucket being filled
  std::vector<int64_t> bytes;
  for (size_t i = s->params.size(); i-- > 0;) {
    const Tensor& p = s->params[i];
    auto it = open.find(p.dtype());
    if (it == open.end() || bytes[it->second] + static_cast<int64_t>(p.nbytes()) > cap) {
      s->buckets.emplace_back();
      bytes.push_back(0);
      it = open.insert_or_assign(p.dtype(), s->buckets.size() - 1).first;
    }
    State::Bucket& b = s->buckets[it->second];
    s->bucket_of[i] = it->second;
    b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + s->params[b.params.back()].numel());
    b.params.push_back(i);
    bytes[it->second] += static_cast<int64_t>(p.nbytes());
  }
  for (State::Bucket& b : s->buckets) {
    const Tensor& last = s->params[b.params.back()];
    b.flat = internal::empty({b.offsets.back() + last.numel()}, {.dtype = last.dtype(), .device = device});
  }
  s->ready.assign(s->params.size(), 0);

  std::weak_ptr<State> weak = s;
  for (size_t i = 0; i < s->params.size(); ++i) {
    s->hooks.push_back(s->params[i].register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      auto st = weak.lock();
      if (!st || !st->sync) return;
      if (!st->active) st->begin_backward(st);
      st->mark_ready(i);
    }));
  }
  state_ = std::move(s);
}

DataParallel::~DataParallel() {
  if (!state_) return;
  for (size_t i = 0; i < state_->params.size(); ++i) state_->params[i].remove_hook(state_->hooks[i]);
}

std::vector<std::vector<size_t>> DataParallel::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  if (!state_) return out;
  // Indices into module().parameters(): the trainable ones are a subsequence of it.
  const auto all = module_->parameters();
  for (const State::Bucket& b : state_->buckets) {
    std::vector<size_t> ids;
    for (size_t p : b.params) {
      for (size_t k = 0; k < all.size(); ++k) {
        if (all[k].is_same(state_->params[p])) ids.push_back(k);
      }
    }
    out.push_back(std::move(ids));
  }
  return out;
}

DataParallel::NoSyncGuard::NoSyncGuard(DataParallel& ddp) : ddp_(ddp), previous_(ddp.state_ ? ddp.state_->sync : true) {
  if (ddp_.state_) ddp_.state_->sync = false;
}
DataParallel::NoSyncGuard::~NoSyncGuard() {
  if (ddp_.state_) ddp_.state_->sync = previous_;
}

}  // namespace kiln::dist
