// CUDA graphs (kiln/tensor/cuda.h): a step captured on a stream of its own, into a private memory pool of the
// caching allocator, and replayed on that stream between two events that order it with the caller's stream.
#include <cuda_runtime.h>

#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "kiln/tensor/cuda.h"
#include "kiln/tensor/cuda/caching_allocator.h"
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/internal_ops.h"  // empty: replay inputs

namespace kiln::cuda {
namespace {
// The replay hooks of the capture running on this thread; null outside a capture.
thread_local std::vector<std::function<void()>>* t_hooks = nullptr;

cudaStream_t raw(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }
}  // namespace

struct Graph::Impl {
  int device = -1;
  std::optional<Stream> stream;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  uint64_t pool = 0;  // the caching allocator's private pool of this graph
  std::vector<std::function<void()>> hooks;
  Event fork, join;
};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}

Graph::~Graph() {
  Impl& g = *impl_;
  if (g.pool == 0) return;
  // No throwing here: a failing call leaves the memory to the driver's clean-up at exit.
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  (void)cudaSetDevice(g.device);
  if (cudaStreamSynchronize(raw(*g.stream)) == cudaSuccess) {  // the last replay has finished
    if (g.exec != nullptr) (void)cudaGraphExecDestroy(g.exec);
    if (g.graph != nullptr) (void)cudaGraphDestroy(g.graph);
    g.hooks.clear();  // frees the replay inputs they hold, so that their segments go back with the pool
    try {
      detail::allocator_release_pool(g.device, g.pool);
    } catch (...) {
    }
  }
  (void)cudaGetLastError();
  if (previous >= 0) (void)cudaSetDevice(previous);
}

bool Graph::captured() const { return impl_->exec != nullptr; }

bool Graph::capturing() { return t_hooks != nullptr; }

void Graph::on_replay(std::function<void()> hook) {
  KILN_CHECK(t_hooks != nullptr, "Graph::on_replay: no CUDA graph is being captured on this thread");
  t_hooks->push_back(std::move(hook));
}

Tensor Graph::replay_input(const Shape& shape, const TensorOptions& options) {
  KILN_CHECK(t_hooks != nullptr, "Graph::replay_input: no CUDA graph is being captured on this thread");
  KILN_CHECK(options.device.is_cuda(), "Graph::replay_input: a replay input is a CUDA tensor, got device ",
             options.device);
  detail::ReplayInputAllocation from_inputs_pool;
  return internal::empty(shape, options);
}

void Graph::capture(const std::function<void()>& step, int warmup) {
  Impl& g = *impl_;
  KILN_CHECK(g.pool == 0, "Graph::capture: this graph holds a capture already; make a new Graph for another one");
  KILN_CHECK(t_hooks == nullptr,
             "Graph::capture: another graph is being captured on this thread (captures do not "
             "nest)");
  KILN_CHECK(warmup >= 0, "Graph::capture: warmup must be >= 0, got ", warmup);
  KILN_CHECK(static_cast<bool>(step), "Graph::capture: the step is empty");
  const int device = current_device();
  const Stream caller = current_stream(device);
  const Stream stream = Stream::create(device);
  g.device = device;
  g.stream = stream;
  g.fork.record(caller);  // the capture stream starts after the work queued so far
  g.fork.wait(stream);
  {
    StreamGuard on(stream);
    for (int i = 0; i < warmup; ++i) step();
  }

  const cudaStream_t s = raw(stream);
  g.pool = detail::allocator_begin_capture(device, s);
  const cudaError_t begun = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (begun != cudaSuccess) {
    detail::allocator_end_capture(device, s);
    detail::allocator_release_pool(device, g.pool);
    g.pool = 0;
    KILN_CUDA_CHECK(begun, "Graph::capture");
  }
  std::vector<std::function<void()>> hooks;
  std::exception_ptr failure;
  t_hooks = &hooks;
  try {
    StreamGuard on(stream);
    step();
  } catch (...) {
    failure = std::current_exception();
  }
  t_hooks = nullptr;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  detail::allocator_end_capture(device, s);
  cudaGraphExec_t exec = nullptr;
  cudaError_t made = cudaSuccess;
  if (!failure && ended == cudaSuccess && graph != nullptr) made = cudaGraphInstantiate(&exec, graph, 0);
  if (failure || ended != cudaSuccess || graph == nullptr || made != cudaSuccess) {
    (void)cudaGetLastError();
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    hooks.clear();                                   // and the replay inputs they hold
    detail::allocator_release_pool(device, g.pool);  // nothing of the capture ran
    g.pool = 0;
    if (failure) {
      try {
        std::rethrow_exception(failure);
      } catch (const OutOfMemoryError& e) {
        throw OutOfMemoryError(
            ::kiln::detail::str_cat("Graph::capture: the step ran out of memory while it was "
                                    "being captured: ",
                                    e.what()));
      } catch (const std::exception& e) {
        KILN_FAIL("Graph::capture: the step failed while it was being captured: ", e.what(),
                  (ended == cudaSuccess ? ""
                                        : "; a step that is captured must not synchronise with the host (item(), "
                                          ".cpu(), printing a tensor, cuda::synchronize()) or use other streams"));
      }
    }
    if (made != cudaSuccess) KILN_CUDA_CHECK(made, "Graph::capture (instantiating the graph)");
    KILN_FAIL("Graph::capture: CUDA ended the capture with '", cudaGetErrorString(ended),
              "': the step synchronised with the host or used another stream (item(), .cpu(), printing a tensor, "
              "cuda::synchronize(), a copy from pageable host memory); keep such calls out of the captured step");
  }
  g.graph = graph;
  g.exec = exec;
  g.hooks = std::move(hooks);
  KILN_CUDA_CHECK(cudaGraphUpload(exec, s), "Graph::capture (uploading the graph)");
  g.join.record(stream);  // the caller's later work comes after the warm-up steps
  g.join.wait(caller);
}

void Graph::replay() {
  Impl& g = *impl_;
  KILN_CHECK(g.exec != nullptr, "Graph::replay: nothing was captured; call capture(step) first");
  KILN_CHECK(t_hooks == nullptr, "Graph::replay: called while a graph is being captured on this thread");
  DeviceGuard on_device(g.device);
  const Stream caller = current_stream(g.device);
  const Stream& stream = *g.stream;
  g.fork.record(caller);
  g.fork.wait(stream);
  {
    StreamGuard on(stream);
    for (auto& hook : g.hooks) hook();
  }
  KILN_CUDA_CHECK(cudaGraphLaunch(g.exec, raw(stream)), "Graph::replay");
  g.join.record(stream);
  g.join.wait(caller);
}

}  // namespace kiln::cuda
