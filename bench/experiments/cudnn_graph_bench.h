// bench/experiments/cudnn_graph_bench.h — what the cuDNN graph experiments share: a handle on kiln's current stream,
// graph and tensor builders, building every plan of a graph and autotuning it, and comparisons of results.
// Header-only; the experiments include it after kiln/kiln.h and cudnn_frontend.h.
#pragma once

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

namespace kiln::bench::cudnn_graph {

namespace fe = cudnn_frontend;
using Attr = std::shared_ptr<fe::graph::Tensor_attributes>;
using Pack = std::unordered_map<int64_t, void*>;

inline cudnnHandle_t handle() {
  static cudnnHandle_t h = [] {
    cudnnHandle_t x = nullptr;
    if (cudnnCreate(&x) != CUDNN_STATUS_SUCCESS) {
      std::fprintf(stderr, "cudnnCreate failed\n");
      std::exit(1);
    }
    return x;
  }();
  cudnnSetStream(h, static_cast<cudaStream_t>(cuda::current_stream(0).handle()));
  return h;
}

// A graph tensor with a name, uid, extents and strides (elements).
inline Attr tensor(fe::graph::Graph& g, const char* name, int64_t uid, std::vector<int64_t> dim,
                   std::vector<int64_t> stride) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

// bf16 in and out, float in between and for the arithmetic.
inline std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  Tensor workspace;
  std::string why_not;   // the step that failed, and cuDNN's message, when graph is null
  int64_t plans = 0;     // the candidate plans built
  double build_s = 0.0;  // building them and timing them (runtime compilation included)
};

// Validates and builds `g`, then every plan of heuristics A and FALLBACK (runtime-compiled ones included), and
// autotunes them over `pack`: the graph keeps the fastest.
inline Built finish(std::shared_ptr<fe::graph::Graph> g, Pack& pack, const Device& dev) {
  Built b;
  const auto start = std::chrono::steady_clock::now();
  auto step = [&](fe::error_t s, const char* what) {
    if (s.is_good()) return true;
    b.why_not = std::string(what) + ": " + s.get_message();
    return false;
  };
  cudnnHandle_t h = handle();
  if (!step(g->validate(), "validate") || !step(g->build_operation_graph(h), "build_operation_graph") ||
      !step(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans") ||
      !step(g->check_support(), "check_support") || !step(g->build_plans(fe::BuildPlanPolicy_t::ALL), "build_plans")) {
    return b;
  }
  Tensor ws = zeros({std::max<int64_t>(g->get_autotune_workspace_size(), 1)}, {.dtype = DType::UInt8, .device = dev});
  if (!step(g->autotune(h, pack, ws.data_ptr()), "autotune")) return b;
  int64_t bytes = 0;
  if (!step(g->get_workspace_size(bytes), "get_workspace_size")) return b;
  b.workspace = zeros({std::max<int64_t>(bytes, 1)}, {.dtype = DType::UInt8, .device = dev});
  b.plans = g->get_execution_plan_count();
  b.build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  b.graph = std::move(g);
  return b;
}

// Runs a built graph once on the current stream; prints cuDNN's message where it fails.
inline void execute(const Built& b, Pack& pack) {
  auto s = b.graph->execute(handle(), pack, b.workspace.data_ptr());
  if (s.is_bad()) std::printf("  execute failed: %s\n", s.get_message().c_str());
}

inline std::string plan_name(const fe::graph::Graph& g) {
  std::string name;
  (void)g.get_plan_name(name);
  return name;
}

inline double max_abs(const Tensor& t) { return abs(t.to(DType::Float32)).max().item<double>(); }
inline double max_diff(const Tensor& a, const Tensor& b) {
  return abs(sub(a.to(DType::Float32), b.to(DType::Float32))).max().item<double>();
}

}  // namespace kiln::bench::cudnn_graph
