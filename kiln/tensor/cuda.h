// kiln/tensor/cuda.h — GPUs as kiln sees them: devices, streams, events and the caching allocator.
//
//   if (kiln::cuda::is_available()) {
//     kiln::cuda::DeviceGuard guard(1);                  // current device 1 in this scope
//     auto s = kiln::cuda::Stream::create(1);
//     { kiln::cuda::StreamGuard sg(s); y = x.to(Device::cuda(1), /*non_blocking=*/true); }
//     kiln::cuda::Event done;  done.record(s);  done.synchronize();
//     std::cout << kiln::cuda::memory_summary(1);
//   }
//
// No CUDA header is included: streams and events are opaque handles, so programs that use kiln compile
// with a plain C++ compiler. On a build without CUDA, or a machine without a GPU, is_available() is
// false and device_count() is 0; everything else throws a kiln::Error that says so.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kiln/tensor/tensor.h"

namespace kiln::cuda {

bool is_available();                // built with CUDA, a driver loaded, and at least one GPU visible
int device_count();                 // 0 when unavailable (never throws)
int current_device();               // of the calling thread
void set_device(int device);        // the calling thread's current device; throws for a bad index
void synchronize(int device = -1);  // -1: the current device; waits for all its streams
// The range a profiler attached to the process records when told to (cudaProfilerStart / cudaProfilerStop: Nsight
// Systems' --capture-range=cudaProfilerApi, Nsight Compute's --profile-from-start off, bench/kernel_trace.cpp). Without
// one attached they do nothing.
void profiler_start();
void profiler_stop();  // cudaProfilerStop (see above)
// The PCI bus id of `device`, as the CUDA runtime writes it ("0000:3B:00.0": domain:bus:device.function in
// hex). It names the GPU the same way in every process and tool (NVML, nvidia-smi), whatever
// CUDA_VISIBLE_DEVICES renumbered kiln's device indices to.
std::string pci_bus_id(int device);
// The compute capability of `device` as major * 10 + minor (90 for an H100/H200, 89 for Ada, 80 for an A100).
int compute_capability(int device);

// Makes `device` current for the scope (restores the previous one on exit).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);  // makes device current, remembering the previous
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
};

// A CUDA stream. Copies of a Stream refer to the same stream. When the last copy of a stream made by create()
// goes, the stream returns to a pool that later create() calls take from (it is never destroyed: the caching
// allocator may still refer to it). The default stream of each device is the legacy default stream.
class Stream {
 public:
  // A non-blocking stream on `device` (-1: the current one), taken from the pool when one is free there.
  static Stream create(int device = -1, bool high_priority = false);
  static Stream default_stream(int device = -1);  // the legacy default stream; -1: current device

  // The device index the stream belongs to.
  int device() const { return device_; }
  // The raw stream handle (null for a default stream).
  void* handle() const { return handle_; }  // a cudaStream_t
  void synchronize() const;                 // the host waits for all work queued on it
  bool query() const;                       // true when all work on it has finished
  // Same stream handle on the same device.
  friend bool operator==(const Stream& a, const Stream& b) { return a.handle_ == b.handle_ && a.device_ == b.device_; }

 private:
  Stream(int device, void* handle, std::shared_ptr<void> owner)
      : device_(device), handle_(handle), owner_(std::move(owner)) {}
  int device_ = 0;
  void* handle_ = nullptr;
  std::shared_ptr<void> owner_;  // destroys created streams
};

// The stream kiln's ops on `device` launch on, for the calling thread (the default stream until set).
Stream current_stream(int device = -1);
void set_current_stream(const Stream& stream);  // on stream's device, for the calling thread

// Makes `stream` current on its device for the scope.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);  // restores the previous stream on exit
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// A CUDA event: record it on a stream, make another stream wait for it, or time between two events.
class Event {
 public:
  explicit Event(bool enable_timing = false);  // created at its first record(); timing for elapsed_ms
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);         // marks the point reached on `stream`; one device per event
  void record();                             // on the current stream of the current device
  void wait(const Stream& stream);           // `stream` waits (on the GPU) until this event has happened
  void synchronize() const;                  // the host waits
  bool query() const;                        // true when it has happened (or was never recorded)
  float elapsed_ms(const Event& end) const;  // both recorded with enable_timing

 private:
  void* handle_ = nullptr;  // a cudaEvent_t, created at the first record
  int device_ = -1;
  bool timing_;
};

// Whether float32 matmuls may use TF32 tensor cores (10-bit mantissa inputs, float32 accumulation), as
// PyTorch's torch.backends.cuda.matmul.allow_tf32. On by default; turn it off for full float32 products.
void set_allow_tf32(bool allow);
bool allow_tf32();  // the current setting (true on a build without CUDA)

// Whether the first run of a large matrix product (at least 2^31 multiply-adds) times the first 8 algorithms cuBLASLt's
// heuristic offers for it and keeps the fastest for the rest of the process (the heuristic's own choice unless another
// is more than 2% faster), as XLA does and PyTorch's TunableOp can. On by default. The timing happens once per problem
// (shape, dtypes, layouts, alignments), in an eager call: the host waits for it, and a problem first met while a CUDA
// graph is being captured keeps the heuristic's choice until an eager call times it. Off in deterministic mode
// (kiln::set_deterministic), where every product keeps the heuristic's choice: two processes could time differently
// and pick algorithms that round differently. Turn it off for results that do not depend on timing without
// deterministic mode's other costs. The environment variable KILN_MATMUL_TUNING=0 makes it start off.
void set_matmul_tuning(bool enabled);
bool matmul_tuning();             // the current setting (true on a build without CUDA)
int64_t matmul_problems_timed();  // how many problems this process has timed so far (for tests and diagnostics)

// Marks that `t`'s memory is in use on `stream` (besides the stream it was allocated on): the caching
// allocator will not hand it out again before the work queued on `stream` so far has finished.
void record_stream(const Tensor& t, const Stream& stream);

// ---- CUDA graphs ----
// A training step recorded once and replayed with one launch: no host work per kernel, no launch gaps.
//
//   Tensor x = ..., y = ...;                  // static inputs: copy each batch into them
//   Tensor loss;
//   cuda::Graph graph;
//   graph.capture([&] {
//     opt.zero_grad();
//     loss = nn::cross_entropy((*model)(x), y);
//     loss.backward();
//     opt.step();
//   });
//   for (auto& batch : loader) {
//     x.copy_(batch.input);  y.copy_(batch.target);
//     graph.replay();                         // loss now holds this step's value
//   }
//
// capture() runs the step `warmup` times on the graph's own stream first, so that what a first step makes
// lazily (optimizer states, .grad tensors, cuBLAS and cuDNN plans) exists, then records one more run: its
// kernels are queued into the graph and not run. replay() runs the recorded kernels on the same addresses,
// ordered after the work queued on the current stream so far (and before what is queued after). Tensors
// made during the capture (loss, gradients) keep their memory, which each replay rewrites; tensors the step
// reads (parameters, inputs) must stay alive and in place. The memory of the capture is the graph's own
// (the caching allocator keeps it for its replays) until the graph is destroyed.
//
// What the step must not do: synchronise with the host (item(), .cpu(), printing a tensor, a data loader),
// change shapes between replays, or depend on host values that change: the optimizers refresh their learning
// rates before each replay (LR schedulers work), but other options must stay as captured. Random ops (dropout,
// rand, the fused attention's dropout) take fresh draws from their generator at every replay (the numbers eager
// ops would draw from the same state); refused are draws after the generator was rewound in the capture
// (gradient checkpointing with dropout) and a generator seeded again after the capture. capture() then throws,
// naming the cause when CUDA gives one.
class Graph {
 public:
  Graph();
  ~Graph();  // waits for the last replay
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void capture(const std::function<void()>& step, int warmup = 3);  // once per Graph (see above)
  void replay();          // after the work on the current stream; throws before capture()
  bool captured() const;  // capture() has succeeded

  // Whether the calling thread is capturing a graph now (for code that must act differently then).
  static bool capturing();
  // For library code running inside a capture: `hook` runs before every replay of the graph being captured
  // on this thread (on the graph's stream), e.g. to write host values the captured kernels read. Throws
  // outside a capture.
  static void on_replay(std::function<void()> hook);
  // For library code running inside a capture: an uninitialised tensor on the captured device for a value that
  // a replay hook writes before every replay and captured kernels read (a learning rate, a random offset). Its
  // memory is shared with no other tensor of the capture. (Memory that an earlier temporary of the capture had
  // would be rewritten on every replay by the graph's own kernels, after the hook and before the readers.) Keep
  // it alive as long as the graph, e.g. in the hook. Throws outside a capture.
  static Tensor replay_input(const Shape& shape, const TensorOptions& options);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- the caching allocator ----
struct MemoryStats {
  int64_t allocated_bytes = 0;       // in tensors now
  int64_t reserved_bytes = 0;        // obtained from cudaMalloc and not released
  int64_t peak_allocated_bytes = 0;  // since start or reset_peak_memory_stats()
  int64_t peak_reserved_bytes = 0;   // since start or reset_peak_memory_stats()
  int64_t active_blocks = 0;         // blocks handed out and not yet freed
  int64_t cached_blocks = 0;         // free blocks kept for reuse
  int64_t num_device_mallocs = 0;    // cudaMalloc calls so far
  int64_t num_device_frees = 0;      // cudaFree calls so far
  int64_t num_ooms = 0;              // allocations that failed even after the cache was released
  int64_t num_alloc_retries = 0;     // allocations that succeeded only after releasing the cache
};
MemoryStats memory_stats(int device = -1);      // of `device`'s caching allocator; -1: the current one
std::string memory_summary(int device = -1);    // a printable table of the stats
void reset_peak_memory_stats(int device = -1);  // peaks set to the current values
void empty_cache();                             // returns every cached, unused block to the driver (all devices)

}  // namespace kiln::cuda
