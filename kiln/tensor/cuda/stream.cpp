// Streams, events and the per-thread current stream.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "kiln/tensor/cuda.h"
#include "kiln/tensor/cuda/caching_allocator.h"
#include "kiln/tensor/cuda/cuda_backend.h"
#include "kiln/tensor/cuda/cuda_check.h"
#include "kiln/tensor/cuda/index_errors.h"

namespace kiln::cuda {
namespace {

int resolve_device(int device, const char* op) {
  const int n = device_count();
  KILN_CHECK(n > 0, op, ": no CUDA device is visible (check the driver with nvidia-smi, and CUDA_VISIBLE_DEVICES)");
  if (device < 0) return current_device();
  KILN_CHECK(device < n, op, ": device cuda:", device, " does not exist; ", n, " GPU(s) are visible");
  return device;
}

// The calling thread's current stream of every device, filled with the default streams on first use.
// thread_local: each thread chooses its streams independently, as in CUDA itself.
std::vector<Stream>& current_streams() {
  thread_local std::vector<Stream> streams = [] {
    std::vector<Stream> s;
    const int n = device_count();
    s.reserve(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) s.push_back(Stream::default_stream(d));
    return s;
  }();
  return streams;
}

// cudaStreamQuery/cudaEventQuery report "not finished" as cudaErrorNotReady, which also lands in the
// runtime's last-error slot; clear it so the next KILN_CUDA_CHECK_LAUNCH does not see it.
bool ready(cudaError_t err, const char* op) {
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  KILN_CUDA_CHECK(err, op);
  return false;
}

}  // namespace

// ---- Stream ----

Stream Stream::create(int device, bool high_priority) {
  device = resolve_device(device, "Stream::create");
  DeviceGuard guard(device);
  int least = 0, greatest = 0;  // numerically lower is higher priority: greatest <= least
  KILN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), "Stream::create");
  // Streams are recycled, never destroyed: the caching allocator keeps the streams that record_stream() named
  // until each tensor is freed, which can be after the last Stream copy is gone; a destroyed stream there would
  // be a dangling handle. A recycled stream may still hold its earlier owner's work: its next owner then only
  // waits a little longer.
  struct Pool {
    std::mutex mutex;
    std::map<std::pair<int, bool>, std::vector<cudaStream_t>> free;
  };
  static auto* pool = new Pool;  // never destroyed (streams are in use until the process ends)
  const std::pair<int, bool> key{device, high_priority};
  cudaStream_t s = nullptr;
  {
    std::lock_guard lock(pool->mutex);
    auto& list = pool->free[key];
    if (!list.empty()) {
      s = list.back();
      list.pop_back();
    }
  }
  if (s == nullptr) {
    // Non-blocking: kiln's streams do not serialise with the legacy default stream, so work on them
    // overlaps with whatever other code queues there.
    KILN_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? greatest : least),
                    "Stream::create");
  }
  std::shared_ptr<void> owner(static_cast<void*>(s), [key](void* p) {
    std::lock_guard lock(pool->mutex);
    pool->free[key].push_back(static_cast<cudaStream_t>(p));
  });
  return Stream(device, static_cast<void*>(s), std::move(owner));
}

Stream Stream::default_stream(int device) {
  device = resolve_device(device, "Stream::default_stream");
  return Stream(device, nullptr, nullptr);
}

void Stream::synchronize() const {
  DeviceGuard guard(device_);  // the legacy default stream (null handle) means the current device's
  KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)), "Stream::synchronize");
  detail::throw_index_error(device_);
}

bool Stream::query() const {
  DeviceGuard guard(device_);
  return ready(cudaStreamQuery(static_cast<cudaStream_t>(handle_)), "Stream::query");
}

Stream current_stream(int device) {
  device = resolve_device(device, "current_stream");
  return current_streams()[static_cast<size_t>(device)];
}

void set_current_stream(const Stream& stream) {
  const int device = resolve_device(stream.device(), "set_current_stream");
  current_streams()[static_cast<size_t>(device)] = stream;
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() { current_streams()[static_cast<size_t>(previous_.device())] = previous_; }

cudaStream_t stream_for(const Tensor& t) {
  const int device = t.device().index();
  auto& streams = current_streams();
  KILN_CHECK(t.is_cuda() && device >= 0 && static_cast<size_t>(device) < streams.size(),
             "stream_for: expected a tensor on a visible CUDA device, got one on ", t.device(), " (", streams.size(),
             " GPU(s) are visible)");
  // Called before every kernel: cudaGetDevice is cheap, cudaSetDevice is only paid when switching.
  int current = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&current), "stream_for");
  if (current != device) KILN_CUDA_CHECK(cudaSetDevice(device), "stream_for");
  return static_cast<cudaStream_t>(streams[static_cast<size_t>(device)].handle());
}

void record_stream(const Tensor& t, const Stream& stream) {
  KILN_CHECK(t.is_cuda(), "record_stream: the tensor is on ", t.device(), "; only CUDA tensors can be recorded");
  KILN_CHECK(stream.device() == t.device().index(), "record_stream: the tensor is on ", t.device(),
             " but the stream is on cuda:", stream.device());
  void* base = t.impl().storage() ? t.impl().storage()->data() : nullptr;
  if (base == nullptr) return;  // empty tensors own no memory
  detail::allocator_record_stream(stream.device(), base, static_cast<cudaStream_t>(stream.handle()));
}

// ---- Event ----

Event::Event(bool enable_timing) : timing_(enable_timing) {}

Event::~Event() {
  if (handle_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(handle_));  // no throwing here
}

void Event::record(const Stream& stream) {
  DeviceGuard guard(stream.device());
  if (handle_ == nullptr) {
    // Created lazily, on the device of the first stream: an event belongs to one device.
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing_ ? cudaEventDefault : cudaEventDisableTiming), "Event::record");
    handle_ = e;
    device_ = stream.device();
  }
  KILN_CHECK(stream.device() == device_, "Event::record: the event belongs to cuda:", device_,
             " (where it was first recorded) but the stream is on cuda:", stream.device(),
             "; use one event per device");
  KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream.handle())),
                  "Event::record");
}

void Event::record() { record(current_stream()); }

void Event::wait(const Stream& stream) {
  KILN_CHECK(handle_ != nullptr, "Event::wait: the event was never recorded; call record(stream) first");
  DeviceGuard guard(stream.device());  // waiting on another device's event is allowed
  KILN_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle()), static_cast<cudaEvent_t>(handle_), 0),
                  "Event::wait");
}

void Event::synchronize() const {
  KILN_CHECK(handle_ != nullptr, "Event::synchronize: the event was never recorded; call record(stream) first");
  KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)), "Event::synchronize");
  detail::throw_index_error(device_);
}

// An event never recorded has nothing pending, as in CUDA: query() is true.
bool Event::query() const {
  if (handle_ == nullptr) return true;
  return ready(cudaEventQuery(static_cast<cudaEvent_t>(handle_)), "Event::query");
}

float Event::elapsed_ms(const Event& end) const {
  KILN_CHECK(timing_ && end.timing_,
             "Event::elapsed_ms: both events must be created with enable_timing=true "
             "(Event(true)); timing is off by default because it costs");
  KILN_CHECK(handle_ != nullptr && end.handle_ != nullptr, "Event::elapsed_ms: both events must be recorded first (",
             handle_ ? "" : "the start ", end.handle_ ? "" : "the end ", "was not)");
  KILN_CHECK(device_ == end.device_, "Event::elapsed_ms: the events were recorded on different devices (cuda:", device_,
             " and cuda:", end.device_, ")");
  // cudaEventElapsedTime needs both completed; waiting here makes the call usable right after record.
  KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)), "Event::elapsed_ms");
  KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end.handle_)), "Event::elapsed_ms");
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_), static_cast<cudaEvent_t>(end.handle_)),
                  "Event::elapsed_ms");
  return ms;
}

}  // namespace kiln::cuda
