// kiln/tensor/cuda.h in a build without the CUDA backend (KILN_CUDA=OFF): no GPU is ever available,
// counting devices answers 0, and everything that needs a GPU throws a kiln::Error that says why.
#if defined(__clang__)
// The private fields of DeviceGuard and Event are used only by the CUDA implementation (cuda.cpp); clang
// sees every member defined here and would warn that they are unused.
#pragma clang diagnostic ignored "-Wunused-private-field"
#endif
#include "kiln/tensor/cuda.h"

namespace kiln::cuda {
namespace {
[[noreturn]] void no_cuda(const char* op) {
  KILN_FAIL(op,
            ": this build of kiln has no CUDA backend (configured with KILN_CUDA=OFF or without a CUDA "
            "toolkit); rebuild with -DKILN_CUDA=ON to use GPUs");
}
}  // namespace

bool is_available() { return false; }
int device_count() { return 0; }
int current_device() { no_cuda("current_device"); }
void set_device(int) { no_cuda("set_device"); }
void synchronize(int) { no_cuda("synchronize"); }
void profiler_start() {}  // no GPU: nothing to profile
void profiler_stop() {}
std::string pci_bus_id(int) { no_cuda("pci_bus_id"); }
int compute_capability(int) { no_cuda("compute_capability"); }

DeviceGuard::DeviceGuard(int) : previous_(0) { no_cuda("DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;

Stream Stream::create(int, bool) { no_cuda("Stream::create"); }
Stream Stream::default_stream(int) { no_cuda("Stream::default_stream"); }
void Stream::synchronize() const { no_cuda("Stream::synchronize"); }
bool Stream::query() const { no_cuda("Stream::query"); }
Stream current_stream(int) { no_cuda("current_stream"); }
void set_current_stream(const Stream&) { no_cuda("set_current_stream"); }
StreamGuard::StreamGuard(const Stream& s) : previous_(s) { no_cuda("StreamGuard"); }
StreamGuard::~StreamGuard() = default;

Event::Event(bool enable_timing) : timing_(enable_timing) {}
Event::~Event() = default;
void Event::record(const Stream&) { no_cuda("Event::record"); }
void Event::record() { no_cuda("Event::record"); }
void Event::wait(const Stream&) { no_cuda("Event::wait"); }
void Event::synchronize() const { no_cuda("Event::synchronize"); }
bool Event::query() const { no_cuda("Event::query"); }
float Event::elapsed_ms(const Event&) const { no_cuda("Event::elapsed_ms"); }

struct Graph::Impl {};
Graph::Graph() = default;
Graph::~Graph() = default;
void Graph::capture(const std::function<void()>&, int) { no_cuda("Graph::capture"); }
void Graph::replay() { no_cuda("Graph::replay"); }
bool Graph::captured() const { return false; }
bool Graph::capturing() { return false; }
void Graph::on_replay(std::function<void()>) { no_cuda("Graph::on_replay"); }
Tensor Graph::replay_input(const Shape&, const TensorOptions&) { no_cuda("Graph::replay_input"); }

void set_allow_tf32(bool) {}
bool allow_tf32() { return true; }
void set_matmul_tuning(bool) {}
bool matmul_tuning() { return true; }
int64_t matmul_problems_timed() { return 0; }
void record_stream(const Tensor&, const Stream&) { no_cuda("record_stream"); }
MemoryStats memory_stats(int) { no_cuda("memory_stats"); }
std::string memory_summary(int) { no_cuda("memory_summary"); }
void reset_peak_memory_stats(int) { no_cuda("reset_peak_memory_stats"); }
void empty_cache() {}

}  // namespace kiln::cuda
