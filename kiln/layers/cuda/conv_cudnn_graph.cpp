// One convolution pass through cuDNN's graph API (conv_cudnn_graph.h): a graph per problem, built once and cached
// with its chosen plan.
#include "kiln/layers/cuda/conv_cudnn_graph.h"

#include <atomic>

#include "kiln/tensor/error.h"  // KILN_CHECK, CudaError

#if KILN_WITH_CUDNN_FRONTEND
#include <cudnn_frontend.h>  // cudnn_frontend::graph::Graph, Conv_{fprop,dgrad,wgrad}_attributes

#include "kiln/layers/cuda/cudnn_frontend_util.h"  // check_frontend, frontend_build_step

#include <algorithm>
#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/layers/conv.h"             // nn::cudnn_benchmark
#include "kiln/layers/cuda/cudnn_util.h"  // cudnn_handle, workspace, reachable_workspace_bytes, ArrayHash
#include "kiln/tensor/cuda.h"             // cuda::Graph::capturing
#include "kiln/tensor/determinism.h"      // kiln::deterministic
#include "kiln/tensor/internal_ops.h"     // internal::empty_like
#endif

namespace kiln::nn::cuda_impl {

namespace {

std::atomic<bool> graph_api_enabled{true};
std::atomic<int64_t> passes_run{0};
std::atomic<int64_t> plans_built{0};
std::atomic<int64_t> accumulations_run{0};

// conv2d_graph_forward_with_sums' sums: contiguous float32 (C_out) tensors on y's device (with or without
// cudnn-frontend, so that a bad call fails the same everywhere).
void check_sums(const Tensor& y, const ConvChannelSums& sums) {
  const int64_t c = y.size(1);
  for (const Tensor* t : {&sums.sum, &sums.sum_of_squares}) {
    const char* name = t == &sums.sum ? "sum" : "sum_of_squares";
    KILN_CHECK(t->defined(), "conv2d_graph_forward_with_sums: sums.", name, " is undefined; pass a float32 tensor of ",
               c, " values (the output's channels) on ", y.device());
    KILN_CHECK(t->dtype() == DType::Float32 && t->numel() == c && t->is_contiguous() && t->device() == y.device(),
               "conv2d_graph_forward_with_sums: sums.", name, " must be a contiguous float32 tensor of ", c,
               " values (the output's channels) on ", y.device(), ", got ", t->dtype(), " ", t->shape(), " on ",
               t->device(), t->is_contiguous() ? "" : " (not contiguous)");
  }
}

// conv2d_graph_backward_data_accumulate's sum: dense, of dy's dtype and device (the other checks are the pass's).
void check_accumulate(const Tensor& dx_sum, const Tensor& w, const Tensor& dy) {
  KILN_CHECK(dx_sum.defined() && w.defined() && dy.defined() && dx_sum.dim() == 4,
             "conv2d_graph_backward_data_accumulate: the sum, weight and gradient must be defined, the sum 4-d "
             "(N, C_in, H, W)");
  KILN_CHECK(dx_sum.dtype() == dy.dtype() && dx_sum.device() == dy.device(),
             "conv2d_graph_backward_data_accumulate: the sum (", dx_sum.dtype(), " on ", dx_sum.device(),
             ") must have the gradient's dtype and device (", dy.dtype(), " on ", dy.device(), ")");
}

}  // namespace

void set_conv2d_graph_api(bool enabled) { graph_api_enabled.store(enabled, std::memory_order_relaxed); }
bool conv2d_graph_api() { return graph_api_enabled.load(std::memory_order_relaxed); }
int64_t conv2d_graph_passes_run() { return passes_run.load(std::memory_order_relaxed); }
int64_t conv2d_graph_plans_built() { return plans_built.load(std::memory_order_relaxed); }
int64_t conv2d_graph_accumulations_run() { return accumulations_run.load(std::memory_order_relaxed); }

#if !KILN_WITH_CUDNN_FRONTEND

bool conv2d_graph_api_compiled() { return false; }

bool conv2d_graph_pass(ConvPass, const Tensor&, const Tensor&, const Tensor&, const ConvGeometry&, bool) {
  return false;
}

bool conv2d_graph_forward_with_sums(const Tensor&, const Tensor&, const Tensor& y, const ConvChannelSums& sums,
                                    const ConvGeometry&, bool, std::string* why_not) {
  check_sums(y, sums);
  if (why_not != nullptr) *why_not = "kiln was built without cudnn-frontend";
  return false;
}

bool conv2d_graph_backward_data_accumulate(const Tensor& dx_sum, const Tensor& w, const Tensor& dy, const ConvGeometry&,
                                           bool, std::string* why_not) {
  check_accumulate(dx_sum, w, dy);
  if (why_not != nullptr) *why_not = "kiln was built without cudnn-frontend";
  return false;
}

#else

namespace fe = cudnn_frontend;

namespace {

constexpr const char* kOp = "conv2d (cuDNN graph API)";

// Fixed tensor ids of the variant packs: x (or dx), w (or dw), y (or dy), a forward's channel sums, and the sum a
// backward-data pass adds into (read as kAccumulate, written as kX: one buffer).
enum Uid : int64_t { kX = 1, kW, kY, kSum, kSumOfSquares, kAccumulate };

// The graphs the cache tells apart: the three passes, the forward with its channel sums in two forms (the sums of y
// as stored (16-bit), or of the float32 products, which a pointwise identity then rounds into y), and the
// backward-data pass whose float32 result a pointwise add puts into a gradient sum.
enum class GraphKind : int64_t {
  Forward,
  BackwardData,
  BackwardFilter,
  ForwardWithSums,
  ForwardWithSumsOfFloat,
  BackwardDataAccumulate
};

GraphKind kind_of(ConvPass pass) {
  switch (pass) {
    case ConvPass::Forward: return GraphKind::Forward;
    case ConvPass::BackwardData: return GraphKind::BackwardData;
    case ConvPass::BackwardFilter: return GraphKind::BackwardFilter;
  }
  return GraphKind::Forward;
}

using Dims = std::vector<int64_t>;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

Dims dims_of(const Tensor& t) { return Dims(t.shape().begin(), t.shape().end()); }

// The canonical strides of a dense (N, C, H, W) tensor in NCHW or NHWC order (a tensor contiguous in a format may
// carry any stride on its size-1 dims; these address the same elements).
Dims strides_of(const Tensor& t, bool channels_last) {
  const int64_t c = t.size(1), h = t.size(2), w = t.size(3);
  if (channels_last) return {h * w * c, 1, w * c, c};
  return {c * h * w, h * w, w, 1};
}

void check(fe::error_t status, const char* step) { check_frontend(status, kOp, step); }
// A failed build step sends the problem to the legacy API; why_not keeps the reason.
bool build_step(fe::error_t status, const char* step, std::string* why_not) {
  return frontend_build_step(status, kOp, step, why_not);
}

// Everything a graph and its plan depend on. Pointer alignment is in it because some engines need 16-byte aligned
// operands; whether the plan was timed (last), because a problem first met during a CUDA graph capture in benchmark
// mode is built from the heuristics alone (timing synchronises the device), and timed when met again outside one.
using Key = std::array<int64_t, 20>;

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN's graph API has no engine for this problem
  std::string why_not;                      // without a graph: the build step that failed, with cuDNN's message
  int64_t workspace_bytes = 0;
  std::mutex run;  // a built graph's execute prepares state on first use: one thread at a time
};

struct Cache {
  std::mutex mutex;
  std::unordered_map<Key, std::shared_ptr<Entry>, ArrayHash> entries;
};

// Never destroyed: threads may convolve until the process exits.
Cache& cache() {
  static auto* c = new Cache;
  return *c;
}

TensorAttr add_tensor(fe::graph::Graph& graph, const char* name, int64_t uid, const Tensor& t, bool channels_last) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim(dims_of(t))
                          .set_stride(strides_of(t, channels_last)));
}

void mark_output(const TensorAttr& out, int64_t uid, const Tensor& t, bool channels_last) {
  out->set_output(true).set_uid(uid).set_dim(dims_of(t)).set_stride(strides_of(t, channels_last));
}

// A (C) float32 output of the graph (a channel sum), as genstats lays it out: (1, C, 1, 1).
void mark_channel_output(const TensorAttr& out, int64_t uid, int64_t channels) {
  out->set_output(true)
      .set_uid(uid)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({1, channels, 1, 1})
      .set_stride({channels, 1, channels, channels});
}

// A convolution node's attributes (Conv_fprop_attributes, Conv_dgrad_attributes, Conv_wgrad_attributes): its name
// and the geometry.
template <typename Attributes>
Attributes conv_attributes(const char* name, const ConvGeometry& g) {
  Attributes a;
  a.set_name(name)
      .set_padding({g.padding[0], g.padding[1]})
      .set_stride({g.stride[0], g.stride[1]})
      .set_dilation({g.dilation[0], g.dilation[1]});
  return a;
}

// The graph over x, w and y (see conv2d_graph_pass for which one a pass writes; the forward with sums writes y and
// the sums).
std::shared_ptr<fe::graph::Graph> make_graph(GraphKind kind, const Tensor& x, const Tensor& w, const Tensor& y,
                                             const ConvGeometry& g, bool channels_last) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(x.dtype() == DType::BFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  switch (kind) {
    case GraphKind::Forward:
    case GraphKind::ForwardWithSums:
    case GraphKind::ForwardWithSumsOfFloat: {
      TensorAttr X = add_tensor(*graph, "x", kX, x, channels_last);
      TensorAttr W = add_tensor(*graph, "w", kW, w, channels_last);
      TensorAttr Y = graph->conv_fprop(X, W, conv_attributes<fe::graph::Conv_fprop_attributes>("fprop", g));
      TensorAttr summed = Y;  // what genstats reads
      if (kind == GraphKind::ForwardWithSumsOfFloat) {
        Y->set_data_type(fe::DataType_t::FLOAT);  // a virtual float32 intermediate
        Y = graph->pointwise(
            Y, fe::graph::Pointwise_attributes().set_name("round").set_mode(fe::PointwiseMode_t::IDENTITY));
      }
      mark_output(Y, kY, y, channels_last);
      if (kind != GraphKind::Forward) {
        auto [sum, sum_of_squares] = graph->genstats(summed, fe::graph::Genstats_attributes().set_name("sums"));
        mark_channel_output(sum, kSum, y.size(1));
        mark_channel_output(sum_of_squares, kSumOfSquares, y.size(1));
      }
      break;
    }
    case GraphKind::BackwardData:
    case GraphKind::BackwardDataAccumulate: {
      TensorAttr DY = add_tensor(*graph, "dy", kY, y, channels_last);
      TensorAttr W = add_tensor(*graph, "w", kW, w, channels_last);
      TensorAttr DX = graph->conv_dgrad(DY, W, conv_attributes<fe::graph::Conv_dgrad_attributes>("dgrad", g));
      if (kind == GraphKind::BackwardDataAccumulate) {
        // A virtual float32 intermediate; a dgrad's output shape cannot be inferred, so it is given.
        DX->set_data_type(fe::DataType_t::FLOAT).set_dim(dims_of(x)).set_stride(strides_of(x, channels_last));
        TensorAttr SUM = add_tensor(*graph, "sum", kAccumulate, x, channels_last);
        DX = graph->pointwise(
            DX, SUM, fe::graph::Pointwise_attributes().set_name("accumulate").set_mode(fe::PointwiseMode_t::ADD));
      }
      mark_output(DX, kX, x, channels_last);
      break;
    }
    case GraphKind::BackwardFilter: {
      TensorAttr DY = add_tensor(*graph, "dy", kY, y, channels_last);
      TensorAttr X = add_tensor(*graph, "x", kX, x, channels_last);
      TensorAttr DW = graph->conv_wgrad(DY, X, conv_attributes<fe::graph::Conv_wgrad_attributes>("wgrad", g));
      mark_output(DW, kW, w, channels_last);
      break;
    }
  }
  return graph;
}

// Builds the problem's graph and chooses its plan: with `timed`, every candidate plan (engines compiled at run time
// left out, except for the fused graphs, whose engines may all be; and those wanting more workspace than could be
// had) runs on the problem's own buffers and the fastest is kept (the outputs' contents are overwritten; the
// accumulating backward-data pass runs on a scratch copy of its sum instead, which timing would add into many
// times); otherwise the heuristics' first plan that builds. Returns an entry without a graph when cuDNN has no engine
// for the problem.
std::shared_ptr<Entry> build(GraphKind kind, const Tensor& x, const Tensor& w, const Tensor& y, const ConvGeometry& g,
                             bool channels_last, bool timed, std::unordered_map<int64_t, void*>& pack) {
  auto entry = std::make_shared<Entry>();
  const cudnnHandle_t handle = cudnn_handle(x);
  std::shared_ptr<fe::graph::Graph> graph = make_graph(kind, x, w, y, g, channels_last);
  if (!build_step(graph->validate(), "validate", &entry->why_not) ||
      !build_step(graph->build_operation_graph(handle), "build_operation_graph", &entry->why_not) ||
      !build_step(graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
                  "create_execution_plans", &entry->why_not)) {
    return entry;
  }
  const bool fused = kind == GraphKind::ForwardWithSums || kind == GraphKind::ForwardWithSumsOfFloat ||
                     kind == GraphKind::BackwardDataAccumulate;
  if (!fused) graph->deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
  graph->deselect_workspace_greater_than(static_cast<int64_t>(reachable_workspace_bytes(x, kOp)));
  if (!build_step(graph->check_support(), "check_support", &entry->why_not) ||
      !build_step(graph->build_plans(timed ? fe::BuildPlanPolicy_t::ALL : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE),
                  "build_plans", &entry->why_not)) {
    return entry;
  }
  if (timed) {
    const Tensor ws = workspace(x, static_cast<size_t>(graph->get_autotune_workspace_size()));
    std::unordered_map<int64_t, void*> timing_pack = pack;
    Tensor scratch;
    if (kind == GraphKind::BackwardDataAccumulate) {
      scratch = internal::empty_like(x);
      timing_pack[kX] = timing_pack[kAccumulate] = scratch.data_ptr();
    }
    if (!build_step(graph->autotune(handle, timing_pack, workspace_ptr(ws)), "autotune", &entry->why_not)) {
      return entry;
    }
  }
  check(graph->get_workspace_size(entry->workspace_bytes), "get_workspace_size");
  entry->graph = std::move(graph);
  return entry;
}

}  // namespace

bool conv2d_graph_api_compiled() { return true; }

namespace {

// Runs the graph of `kind` (its plan built and cached on first use); sums only for the forwards with sums. The
// accumulating backward-data pass reads and writes x (the sum).
bool run_graph(GraphKind kind, const Tensor& x, const Tensor& w, const Tensor& y, const ConvChannelSums* sums,
               const ConvGeometry& g, bool channels_last, std::string* why_not) {
  if (!conv2d_graph_api() || g.groups != 1 || ::kiln::deterministic()) return false;
  if (x.dtype() != DType::Float16 && x.dtype() != DType::BFloat16) return false;
  // Benchmark mode times every candidate, which synchronises the device: inside a CUDA graph capture a problem takes
  // the plan timed before the capture (the eager warm-up steps), else the heuristics' plan.
  const bool benchmark = nn::cudnn_benchmark();
  const bool can_time = benchmark && !cuda::Graph::capturing();
  Key key = join_key(std::array<int64_t, 5>{static_cast<int64_t>(kind), x.device().index(),
                                            static_cast<int64_t>(x.dtype()), channels_last ? 1 : 0,
                                            std::min({pointer_alignment(x.data_ptr()), pointer_alignment(w.data_ptr()),
                                                      pointer_alignment(y.data_ptr())})},
                     conv_key_dims(x.shape(), w.shape(), g), std::array<int64_t, 1>{benchmark ? 1 : 0});
  std::unordered_map<int64_t, void*> pack{{kX, x.data_ptr()}, {kW, w.data_ptr()}, {kY, y.data_ptr()}};
  if (sums != nullptr) {
    pack[kSum] = sums->sum.data_ptr();
    pack[kSumOfSquares] = sums->sum_of_squares.data_ptr();
  }
  if (kind == GraphKind::BackwardDataAccumulate) pack[kAccumulate] = x.data_ptr();

  Cache& c = cache();
  auto find = [&c](const Key& k) {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.entries.find(k);
    return it != c.entries.end() ? it->second : std::shared_ptr<Entry>();
  };
  std::shared_ptr<Entry> entry = find(key);
  if (entry == nullptr && benchmark && !can_time) {
    key.back() = 0;  // capturing, and not timed before: the heuristics' plan, kept apart from the timed ones
    entry = find(key);
  }
  if (entry == nullptr) {
    // Built outside the cache's lock (timing takes a while); a graph another thread built meanwhile wins.
    std::shared_ptr<Entry> built = build(kind, x, w, y, g, channels_last, key.back() == 1, pack);
    plans_built.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(c.mutex);
    entry = c.entries.emplace(key, std::move(built)).first->second;
  }
  if (entry->graph == nullptr) {
    if (why_not != nullptr) *why_not = entry->why_not;
    return false;
  }

  const cudnnHandle_t handle = cudnn_handle(x);
  const Tensor ws = workspace(x, static_cast<size_t>(entry->workspace_bytes));
  {
    std::lock_guard<std::mutex> lock(entry->run);
    check(entry->graph->execute(handle, pack, workspace_ptr(ws)), "execute");
  }
  passes_run.fetch_add(1, std::memory_order_relaxed);
  if (kind == GraphKind::BackwardDataAccumulate) accumulations_run.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

bool conv2d_graph_pass(ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y, const ConvGeometry& g,
                       bool channels_last) {
  return run_graph(kind_of(pass), x, w, y, nullptr, g, channels_last, nullptr);
}

bool conv2d_graph_forward_with_sums(const Tensor& x, const Tensor& w, const Tensor& y, const ConvChannelSums& sums,
                                    const ConvGeometry& g, bool channels_last, std::string* why_not) {
  check_sums(y, sums);
  // The sums of y as stored first; where cuDNN has no engine for that graph, the sums of the float32 products.
  std::string first, second;
  if (run_graph(GraphKind::ForwardWithSums, x, w, y, &sums, g, channels_last, &first)) return true;
  if (run_graph(GraphKind::ForwardWithSumsOfFloat, x, w, y, &sums, g, channels_last, &second)) return true;
  if (why_not != nullptr && !first.empty()) {
    *why_not = ::kiln::detail::str_cat("sums of y: ", first, "; sums of the float32 products: ", second);
  }
  return false;
}

bool conv2d_graph_backward_data_accumulate(const Tensor& dx_sum, const Tensor& w, const Tensor& dy,
                                           const ConvGeometry& g, bool channels_last, std::string* why_not) {
  check_accumulate(dx_sum, w, dy);
  return run_graph(GraphKind::BackwardDataAccumulate, dx_sum, w, dy, nullptr, g, channels_last, why_not);
}

#endif

}  // namespace kiln::nn::cuda_impl
