// cuDNN's fused scaled dot-product attention through the cudnn-frontend graph API (attention_cudnn.h).
#include "kiln/layers/cuda/attention_cudnn.h"
#include "kiln/tensor/trace.h"  // a range per kernel entry

#if KILN_WITH_CUDNN_FRONTEND
#include <cudnn_frontend.h>  // cudnn_frontend::graph::Graph, SDPA_attributes, SDPA_backward_attributes

#include "kiln/layers/cuda/cudnn_frontend_util.h"  // check_frontend, frontend_build_step
#endif

#include <bit>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kiln/layers/cuda/cudnn_util.h"       // cudnn_handle, workspace
#include "kiln/layers/cuda/short_attention.h"  // empty_bxhd, packed_qkv, empty_attention_grads
#include "kiln/tensor/cuda.h"                  // cuda::Graph::capturing
#include "kiln/tensor/determinism.h"           // kiln::deterministic
#include "kiln/tensor/error.h"                 // KILN_CHECK, CudaError, NotImplementedError
#include "kiln/tensor/internal_ops.h"          // internal::empty, internal::full

namespace kiln::nn::cuda_impl {

#if !KILN_WITH_CUDNN_FRONTEND

bool fused_attention_compiled() { return false; }

bool fused_attention_supported(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const FusedAttentionConfig&,
                               std::string* why_not) {
  if (why_not != nullptr) *why_not = "kiln was built without cudnn-frontend (run scripts/setup.sh and reconfigure)";
  return false;
}

FusedAttentionForward fused_attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                              const FusedAttentionConfig&, FusedAttentionDropout) {
  throw NotImplementedError("scaled_dot_product_attention: kiln was built without cudnn-frontend");
}

FusedAttentionGrads fused_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                             const Tensor&, const Tensor&, const FusedAttentionConfig&,
                                             FusedAttentionDropout) {
  throw NotImplementedError("scaled_dot_product_attention: kiln was built without cudnn-frontend");
}

#else

namespace fe = cudnn_frontend;

namespace {

constexpr const char* kOp = "scaled_dot_product_attention (cuDNN fused)";
constexpr int64_t kMaxHeadDim = 128;  // forward and backward on Ampere and later with every cuDNN 9
constexpr uintptr_t kAlignment = 16;  // cuDNN's SDPA kernels move rows with 16-byte vector loads and TMA

// Fixed tensor ids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kBias, kSeed, kOffset, kDO, kDQ, kDK, kDV };

using Dims = std::vector<int64_t>;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

Dims dims_of(const Tensor& t) { return Dims(t.shape().begin(), t.shape().end()); }
Dims strides_of(const Tensor& t) { return Dims(t.strides().begin(), t.strides().end()); }

// (B, X, H, D) row-major memory seen as (B, H, X, D): the layout of O, dO, dQ, dK and dV (empty_bxhd), so that
// merging the heads afterwards ((B, H, L, D) -> (B, L, H * D)) is a view.
Dims bxhd_strides(int64_t H, int64_t X, int64_t D) { return {X * H * D, D, H * D, 1}; }

bool aligned(const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % kAlignment != 0 || t.stride(-1) != 1) return false;
  const auto elem = static_cast<int64_t>(t.element_size());
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) > 1 && (t.stride(d) * elem) % static_cast<int64_t>(kAlignment) != 0) return false;
  }
  return true;
}

fe::DataType_t fe_dtype(DType dtype) {
  return dtype == DType::BFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

void check(fe::error_t status, const char* step) { check_frontend(status, kOp, step); }
bool build_step(fe::error_t status, const char* step, std::string& why_not) {
  return frontend_build_step(status, kOp, step, &why_not);
}

TensorAttr add_tensor(fe::graph::Graph& g, const char* name, int64_t uid, const Dims& dims, const Dims& strides) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(strides));
}

TensorAttr add_int64_scalar(fe::graph::Graph& g, const char* name, int64_t uid) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT64));
}

struct GraphEntry {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN cannot run this case
  std::string why_not;
  int64_t workspace_bytes = 0;
};

std::shared_ptr<fe::graph::Graph> new_graph(DType dtype) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_dtype(dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// validate -> operation graph -> heuristics -> support -> plans -> workspace size.
GraphEntry finish(std::shared_ptr<fe::graph::Graph> g, cudnnHandle_t handle) {
  GraphEntry e;
  if (!build_step(g->validate(), "validate", e.why_not) ||
      !build_step(g->build_operation_graph(handle), "build_operation_graph", e.why_not) ||
      !build_step(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", e.why_not) ||
      !build_step(g->check_support(), "check_support", e.why_not) ||
      !build_step(g->build_plans(), "build_plans", e.why_not)) {
    return e;
  }
  check(g->get_workspace_size(e.workspace_bytes), "get_workspace_size");
  e.graph = std::move(g);
  return e;
}

// The bias as the graph sees it: (B|1, H|1, L, S). One row per batch and head (L|1 = 1) is read for every query
// through a zero stride. Described instead as a size-1 dim with its contiguous stride, the forward is right but
// cuDNN 9.14's backward gives wrong gradients (CudaAttentionFused.AdditiveBias and the key padding tests catch it).
void add_bias(auto& attributes, fe::graph::Graph& g, const Tensor& bias, int64_t L) {
  Dims dims = dims_of(bias), strides = strides_of(bias);
  if (dims[2] == 1) {
    dims[2] = L;
    strides[2] = 0;
  }
  attributes.set_bias(add_tensor(g, "bias", kBias, dims, strides));
}

void set_mask_and_dropout(auto& attributes, fe::graph::Graph& g, const Tensor& bias, int64_t L,
                          const FusedAttentionConfig& cfg) {
  attributes.set_attn_scale(static_cast<float>(cfg.scale));
  // kiln's causal mask: query i sees keys j <= i, counted from the top-left corner even when L != S.
  if (cfg.causal) attributes.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  if (bias.defined()) add_bias(attributes, g, bias, L);
  if (cfg.dropout_p > 0) {
    attributes.set_dropout(static_cast<float>(cfg.dropout_p), add_int64_scalar(g, "seed", kSeed),
                           add_int64_scalar(g, "offset", kOffset));
  }
}

// q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev) -> O (B, H, L, Ev) [+ stats (B, H, L, 1) Float32].
GraphEntry build_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                         const FusedAttentionConfig& cfg, cudnnHandle_t handle) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Ev = v.size(3);
  auto g = new_graph(q.dtype());
  TensorAttr Q = add_tensor(*g, "q", kQ, dims_of(q), strides_of(q));
  TensorAttr K = add_tensor(*g, "k", kK, dims_of(k), strides_of(k));
  TensorAttr V = add_tensor(*g, "v", kV, dims_of(v), strides_of(v));
  fe::graph::SDPA_attributes attributes;
  attributes.set_name("sdpa").set_generate_stats(cfg.with_stats);
  set_mask_and_dropout(attributes, *g, bias, L, cfg);
  auto [O, stats] = g->sdpa(Q, K, V, std::move(attributes));
  O->set_output(true).set_uid(kO).set_dim({B, H, L, Ev}).set_stride(bxhd_strides(H, L, Ev));
  if (cfg.with_stats) {
    KILN_CHECK(stats != nullptr, kOp, ": cudnn-frontend gave no softmax statistics output");
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({B, H, L, 1})
        .set_stride({H * L, L, 1, 1});
  }
  return finish(std::move(g), handle);
}

// The same case's backward: (q, k, v, O, dO, stats) -> dQ, dK, dV, with O, dO, dQ, dK, dV in (B, X, H, D) memory.
// deterministic: the frontend's deterministic backward (kiln/tensor/determinism.h), which on Hopper sums dQ
// through a dP workspace instead of atomics.
// packed: dQ, dK and dV get q's, k's and v's strides (the thirds of one buffer, see packed_qkv) instead of their own
// (B, X, H, D) memory.
GraphEntry build_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                          const FusedAttentionConfig& cfg, bool deterministic, bool packed, cudnnHandle_t handle) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2), E = q.size(3), Ev = v.size(3);
  auto g = new_graph(q.dtype());
  TensorAttr Q = add_tensor(*g, "q", kQ, dims_of(q), strides_of(q));
  TensorAttr K = add_tensor(*g, "k", kK, dims_of(k), strides_of(k));
  TensorAttr V = add_tensor(*g, "v", kV, dims_of(v), strides_of(v));
  TensorAttr O = add_tensor(*g, "o", kO, {B, H, L, Ev}, bxhd_strides(H, L, Ev));
  TensorAttr dO = add_tensor(*g, "d_o", kDO, {B, H, L, Ev}, bxhd_strides(H, L, Ev));
  TensorAttr stats = add_tensor(*g, "stats", kStats, {B, H, L, 1}, {H * L, L, 1, 1});
  stats->set_data_type(fe::DataType_t::FLOAT);
  fe::graph::SDPA_backward_attributes attributes;
  attributes.set_name("sdpa_backward").set_deterministic_algorithm(deterministic);
  set_mask_and_dropout(attributes, *g, bias, L, cfg);
  auto grads = g->sdpa_backward(Q, K, V, O, dO, stats, std::move(attributes));
  grads[0]
      ->set_output(true)
      .set_uid(kDQ)
      .set_dim({B, H, L, E})
      .set_stride(packed ? strides_of(q) : bxhd_strides(H, L, E));
  grads[1]
      ->set_output(true)
      .set_uid(kDK)
      .set_dim({B, H, S, E})
      .set_stride(packed ? strides_of(k) : bxhd_strides(H, S, E));
  grads[2]
      ->set_output(true)
      .set_uid(kDV)
      .set_dim({B, H, S, Ev})
      .set_stride(packed ? strides_of(v) : bxhd_strides(H, S, Ev));
  return finish(std::move(g), handle);
}

// Everything a built graph depends on: device, dtype, shapes and strides of q, k, v, the bias's broadcast
// dims (it is always contiguous), and the flags (deterministic mode's included).
using Key = std::vector<int64_t>;
Key make_key(bool backward, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
             const FusedAttentionConfig& cfg, bool deterministic, bool packed) {
  Key key{backward, q.device().index(), static_cast<int64_t>(q.dtype()), deterministic, packed};
  for (const Tensor* t : {&q, &k, &v}) {
    for (int64_t d = 0; d < 4; ++d) key.insert(key.end(), {t->size(d), t->stride(d)});
  }
  key.insert(key.end(), {bias.defined() ? bias.size(0) : -1, bias.defined() ? bias.size(1) : -1,
                         bias.defined() ? bias.size(2) : -1, cfg.causal, cfg.with_stats,
                         std::bit_cast<int64_t>(cfg.scale), std::bit_cast<int64_t>(cfg.dropout_p)});
  return key;
}

// Built graphs (and the cases cuDNN refused) for the life of the process. Never destroyed: at exit the
// cuDNN library may be unloaded before static destructors would run.
struct GraphCache {
  std::mutex mutex;
  std::map<Key, std::shared_ptr<const GraphEntry>> entries;
};
GraphCache& graph_cache() {
  static auto* cache = new GraphCache;
  return *cache;
}

std::shared_ptr<const GraphEntry> graph_for(bool backward, const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& bias, const FusedAttentionConfig& cfg, bool packed = false) {
  const bool deterministic = backward && ::kiln::deterministic();  // the forward has no atomics either way
  Key key = make_key(backward, q, k, v, bias, cfg, deterministic, packed);
  GraphCache& cache = graph_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto it = cache.entries.find(key);
  if (it != cache.entries.end()) return it->second;
  cudnnHandle_t handle = cudnn_handle(q);
  auto entry =
      std::make_shared<const GraphEntry>(backward ? build_backward(q, k, v, bias, cfg, deterministic, packed, handle)
                                                  : build_forward(q, k, v, bias, cfg, handle));
  cache.entries.emplace(std::move(key), entry);
  return entry;
}

// The checks that need no graph; the reason when one fails.
std::string static_why_not(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                           const FusedAttentionConfig& cfg) {
  using ::kiln::detail::str_cat;
  if (!q.defined() || !k.defined() || !v.defined()) return "query, key and value must be defined";
  if (!q.is_cuda()) return "not on a GPU";
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return "query, key and value must be 4-d (B, H, L, E)";
  if (q.dtype() != DType::Float16 && q.dtype() != DType::BFloat16) {
    return str_cat("cuDNN's fused attention takes Float16 or BFloat16, not ", q.dtype());
  }
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) return "query, key and value dtypes differ";
  if (k.device() != q.device() || v.device() != q.device()) return "query, key and value devices differ";
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), S = k.size(2), E = q.size(3), Ev = v.size(3);
  if (k.size(0) != B || v.size(0) != B || k.size(1) != H || v.size(1) != H) {
    return "key and value must have query's batch and head dims (no broadcasting or grouped heads)";
  }
  if (v.size(2) != S || k.size(3) != E) return "inconsistent shapes";
  if (B == 0 || H == 0 || L == 0 || S == 0) return "empty input";
  if (E % 8 != 0 || Ev % 8 != 0 || E > kMaxHeadDim || Ev > kMaxHeadDim) {
    return str_cat("head dims E = ", E, " and Ev = ", Ev, " must be multiples of 8 and at most ", kMaxHeadDim);
  }
  if (!aligned(q) || !aligned(k) || !aligned(v)) return "rows not contiguous or not 16-byte aligned";
  if (!(cfg.dropout_p >= 0 && cfg.dropout_p < 1)) return "dropout_p outside [0, 1)";
  if (bias.defined()) {
    if (bias.dtype() != q.dtype() || bias.device() != q.device() || bias.dim() != 4) return "bias type or rank";
    if ((bias.size(0) != 1 && bias.size(0) != B) || (bias.size(1) != 1 && bias.size(1) != H) ||
        (bias.size(2) != 1 && bias.size(2) != L) || bias.size(3) != S) {
      return str_cat("bias of shape ", bias.shape(), " is not (B|1, H|1, L|1, S)");
    }
    if (!bias.is_contiguous() || !aligned(bias)) return "bias not contiguous or its rows not 16-byte aligned";
  }
  return {};
}

}  // namespace

bool fused_attention_compiled() { return true; }

bool fused_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                               const FusedAttentionConfig& cfg, std::string* why_not) {
  std::string why = static_why_not(q, k, v, bias, cfg);
  if (why.empty()) {
    auto forward = graph_for(false, q, k, v, bias, cfg);
    if (!forward->graph) {
      why = "forward: " + forward->why_not;
    } else if (cfg.with_stats) {
      auto backward = graph_for(true, q, k, v, bias, cfg);
      if (!backward->graph) why = "backward: " + backward->why_not;
    }
  }
  if (why_not != nullptr) *why_not = why;
  return why.empty();
}

namespace {

// A (1, 1, 1, 1) Int64 zero on `device`, made once (outside CUDA graph captures, whose memory belongs to the graph)
// and never written: the offset of every dropout draw whose offset is 0 (kiln mixes its generator's position into
// the seed), so that no call fills one. Undefined where it does not exist yet and a capture is running.
Tensor zero_offset(Device device) {
  static std::mutex mutex;
  static auto* zeros = new std::map<int, Tensor>();  // never destroyed: used until exit
  std::lock_guard<std::mutex> lock(mutex);
  Tensor& z = (*zeros)[device.index()];
  if (!z.defined() && !cuda::Graph::capturing()) {
    z = internal::zeros({1, 1, 1, 1}, {.dtype = DType::Int64, .device = device});
  }
  return z;
}

// The seed and offset of the dropout draw as (1, 1, 1, 1) Int64 GPU tensors: the draw's seed tensor (which the
// forward and backward of a call share), or one filled by a kernel on the current stream (no host synchronization,
// nothing to keep alive on the host); the offset's shared zero, or a filled one.
void add_dropout_tensors(std::unordered_map<int64_t, void*>& pack, std::vector<Tensor>& keep, const Tensor& like,
                         FusedAttentionDropout dropout) {
  const TensorOptions options{.dtype = DType::Int64, .device = like.device()};
  keep.push_back(dropout.seed_device.defined() ? dropout.seed_device
                                               : internal::full({1, 1, 1, 1}, dropout.seed, options));
  const Tensor zero = dropout.offset == 0 ? zero_offset(like.device()) : Tensor();
  keep.push_back(zero.defined() ? zero : internal::full({1, 1, 1, 1}, dropout.offset, options));
  pack[kSeed] = keep[keep.size() - 2].data_ptr();
  pack[kOffset] = keep.back().data_ptr();
}

void execute(const GraphEntry& entry, const Tensor& like, std::unordered_map<int64_t, void*>& pack) {
  cudnnHandle_t handle = cudnn_handle(like);  // like's device current, handle on its current kiln stream
  Tensor ws = workspace(like, static_cast<size_t>(entry.workspace_bytes));
  check(entry.graph->execute(handle, pack, workspace_ptr(ws)), "execute");
}

const GraphEntry& runnable(const std::shared_ptr<const GraphEntry>& entry, const char* direction) {
  KILN_CHECK(entry->graph != nullptr, kOp, ": cuDNN cannot run this case (", direction, ": ", entry->why_not,
             "); check fused_attention_supported() first");
  return *entry;
}

}  // namespace

FusedAttentionForward fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                                              const FusedAttentionConfig& cfg, FusedAttentionDropout dropout) {
  trace::Scope range(trace::Kind::Op, "cudnn_attention_forward", q.device(), {&q, &k, &v, &bias});
  const std::string why = static_why_not(q, k, v, bias, cfg);
  KILN_CHECK(why.empty(), kOp, ": unsupported input (", why, "); shapes ", q.shape(), ", ", k.shape(), ", ", v.shape());
  auto entry = graph_for(false, q, k, v, bias, cfg);
  const GraphEntry& graph = runnable(entry, "forward");
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Ev = v.size(3);
  FusedAttentionForward result;
  result.out = empty_bxhd(B, H, L, Ev, q.options());  // (B, H, L, Ev) over (B, L, H, Ev) memory
  std::unordered_map<int64_t, void*> pack{
      {kQ, q.data_ptr()}, {kK, k.data_ptr()}, {kV, v.data_ptr()}, {kO, result.out.data_ptr()}};
  if (cfg.with_stats) {
    result.stats = internal::empty({B, H, L, 1}, TensorOptions{.dtype = DType::Float32, .device = q.device()});
    pack[kStats] = result.stats.data_ptr();
  }
  if (bias.defined()) pack[kBias] = bias.data_ptr();
  std::vector<Tensor> keep;
  if (cfg.dropout_p > 0) add_dropout_tensors(pack, keep, q, dropout);
  execute(graph, q, pack);
  return result;
}

FusedAttentionGrads fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& d_out, const Tensor& stats, const Tensor& bias,
                                             const FusedAttentionConfig& cfg, FusedAttentionDropout dropout) {
  trace::Scope range(trace::Kind::Op, "cudnn_attention_backward", q.device(), {&q, &k, &v, &bias});
  const std::string why = static_why_not(q, k, v, bias, cfg);
  KILN_CHECK(why.empty(), kOp, ": unsupported input (", why, ")");
  KILN_CHECK(cfg.with_stats && stats.defined() && stats.dtype() == DType::Float32, kOp,
             ": backward needs the Float32 softmax statistics of a forward run with with_stats");
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Ev = v.size(3);
  const Dims o_strides = bxhd_strides(H, L, Ev);
  KILN_CHECK(out.shape() == (Shape{B, H, L, Ev}) && strides_of(out) == o_strides && out.dtype() == q.dtype(), kOp,
             ": backward needs the output of fused_attention_forward, got shape ", out.shape());
  KILN_CHECK(d_out.shape() == out.shape(), kOp, ": the output gradient has shape ", d_out.shape(), ", expected ",
             out.shape());
  // Gradients in one (B, L, 3, H, E) buffer when q, k and v are the thirds of one; the separate layout where
  // cuDNN cannot write that one.
  bool packed = packed_qkv(q, k, v);
  std::shared_ptr<const GraphEntry> entry;
  if (packed) {
    entry = graph_for(true, q, k, v, bias, cfg, /*packed=*/true);
    if (!entry->graph) packed = false;
  }
  if (!packed) entry = graph_for(true, q, k, v, bias, cfg);
  const GraphEntry& graph = runnable(entry, "backward");

  // dO in O's layout (the one the backward graph was built for).
  Tensor d_o = d_out;
  if (d_o.dtype() != q.dtype() || strides_of(d_o) != o_strides ||
      reinterpret_cast<uintptr_t>(d_o.data_ptr()) % kAlignment != 0) {
    d_o = empty_bxhd(B, H, L, Ev, q.options());
    d_o.copy_(d_out);
  }
  FusedAttentionGrads grads = empty_attention_grads(q, k, v, packed);
  std::unordered_map<int64_t, void*> pack{
      {kQ, q.data_ptr()},         {kK, k.data_ptr()},         {kV, v.data_ptr()},
      {kO, out.data_ptr()},       {kDO, d_o.data_ptr()},      {kStats, stats.data_ptr()},
      {kDQ, grads.dq.data_ptr()}, {kDK, grads.dk.data_ptr()}, {kDV, grads.dv.data_ptr()}};
  if (bias.defined()) pack[kBias] = bias.data_ptr();
  std::vector<Tensor> keep;
  if (cfg.dropout_p > 0) add_dropout_tensors(pack, keep, q, dropout);
  execute(graph, q, pack);
  return grads;
}

#endif  // KILN_WITH_CUDNN_FRONTEND

}  // namespace kiln::nn::cuda_impl
