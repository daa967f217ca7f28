// kernel_trace — which GPU kernels a program runs inside its profiler ranges, and for how long: a CUPTI injection
// library that any CUDA program loads without being rebuilt, kiln's and PyTorch's alike.
//
//   CUDA_INJECTION64_PATH=build/bench/libkernel_trace.so build/bench/bench_train --case resnet18_cifar_bf16
//   CUDA_INJECTION64_PATH=build/bench/libkernel_trace.so python3 bench/pytorch_train.py --mode eager --case ...
//
// The CUDA driver loads the library named by CUDA_INJECTION64_PATH when the program initialises CUDA and calls its
// InitializeInjection(). From then on CUPTI records every kernel's start and end on the GPU (kernels replayed from
// CUDA graphs included), and the program's cudaProfilerStart / cudaProfilerStop calls (kiln::cuda::profiler_start,
// torch.cuda.profiler.start; bench_train and pytorch_train.py put them around their timed steps) delimit the ranges
// reported. At each range's end the kernels that ran wholly inside it are summed by name and printed to standard
// error: the range's wall time on the GPU, the time kernels ran (overlapping kernels counted once each), and the
// kernels by total time, with calls and a share. KILN_KERNEL_TRACE_TOP (30) sets how many kernels are listed;
// KILN_KERNEL_TRACE_BY_LAUNCH=1 sums by name and launch configuration (grid and block dimensions) instead, which
// splits one kernel's time by the shapes it ran on.
//
// Kernel durations here are the GPU's own timestamps: unlike timing each op between two events, host work between
// launches is not counted, so the sums show where a step's GPU time goes. Kernel records are CUpti_ActivityKernel10,
// the layout of CUDA 13.0's CUPTI (later CUPTI versions keep that struct and its fields' order).
#include <cupti_activity.h>      // activity records (kernels)
#include <cupti_callbacks.h>     // API callbacks (the profiler ranges)
#include <cupti_driver_cbid.h>   // CUPTI_DRIVER_TRACE_CBID_*
#include <cupti_runtime_cbid.h>  // CUPTI_RUNTIME_TRACE_CBID_*
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelRun {
  std::string name;
  uint64_t start = 0, end = 0;  // ns, CUPTI's timestamps
};

std::mutex mutex;                // guards everything below: CUPTI hands buffers over on its own thread
std::vector<KernelRun> kernels;  // completed records not yet reported
bool in_range = false;
uint64_t range_start = 0;
int range_index = 0;
bool by_launch = false;  // KILN_KERNEL_TRACE_BY_LAUNCH: kernels keyed by name and launch configuration

constexpr size_t kBufferBytes = 8u << 20;

void report_error(CUptiResult r, const char* call) {
  if (r == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", call, text != nullptr ? text : "unknown CUPTI error");
}

std::string demangled(const char* name) {
  if (name == nullptr) return "(unnamed)";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : name;
  std::free(d);
  // Template arguments make names run long: drop the namespaces that say nothing, then keep the function's own
  // name and the start of its arguments.
  for (const char* noise : {"(anonymous namespace)::", "kiln::nn::cuda_impl::", "kiln::cuda::"}) {
    for (size_t at = out.find(noise); at != std::string::npos; at = out.find(noise, at)) {
      out.erase(at, std::strlen(noise));
    }
  }
  if (out.size() > 110) out = out.substr(0, 107) + "...";
  return out;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<KernelRun> runs;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::string name = demangled(k->name);
    if (by_launch) {
      char launch[96];
      std::snprintf(launch, sizeof launch, " <<<(%d,%d,%d),(%d,%d,%d)>>>", k->gridX, k->gridY, k->gridZ, k->blockX,
                    k->blockY, k->blockZ);
      name += launch;
    }
    runs.push_back({std::move(name), k->start, k->end});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(mutex);
  kernels.insert(kernels.end(), runs.begin(), runs.end());
}

// The kernels of [from, to] summed by name, printed; every record up to `to` is then dropped.
void report_range(uint64_t from, uint64_t to) {
  std::vector<KernelRun> inside;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const KernelRun& k : kernels) {
      if (k.start >= from && k.end <= to) inside.push_back(k);
    }
    kernels.erase(std::remove_if(kernels.begin(), kernels.end(), [&](const KernelRun& k) { return k.start <= to; }),
                  kernels.end());
  }
  struct Sum {
    uint64_t ns = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Sum> by_name;
  uint64_t total = 0, first = UINT64_MAX, last = 0;
  for (const KernelRun& k : inside) {
    Sum& s = by_name[k.name];
    s.ns += k.end - k.start;
    s.calls += 1;
    total += k.end - k.start;
    first = std::min(first, k.start);
    last = std::max(last, k.end);
  }
  std::vector<std::pair<std::string, Sum>> sorted(by_name.begin(), by_name.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  const char* top_env = std::getenv("KILN_KERNEL_TRACE_TOP");
  const size_t top = top_env != nullptr ? static_cast<size_t>(std::max(0, std::atoi(top_env))) : 30;
  std::fprintf(stderr,
               "kernel_trace range %d: %.3f ms on the GPU from the range's start to its end, first to last kernel "
               "%.3f ms, kernels %.3f ms, %zu kernel runs, %zu kernels\n",
               range_index, static_cast<double>(to - from) / 1e6,
               inside.empty() ? 0.0 : static_cast<double>(last - first) / 1e6, static_cast<double>(total) / 1e6,
               inside.size(), sorted.size());
  std::fprintf(stderr, "%10s %8s %7s  %s\n", "ms", "calls", "share", "kernel");
  for (size_t i = 0; i < sorted.size() && i < top; ++i) {
    std::fprintf(stderr, "%10.3f %8lld %6.1f%%  %s\n", static_cast<double>(sorted[i].second.ns) / 1e6,
                 static_cast<long long>(sorted[i].second.calls),
                 total > 0 ? 100.0 * static_cast<double>(sorted[i].second.ns) / static_cast<double>(total) : 0.0,
                 sorted[i].first.c_str());
  }
  ++range_index;
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  const bool start =
      (domain == CUPTI_CB_DOMAIN_RUNTIME_API && id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000) ||
      (domain == CUPTI_CB_DOMAIN_DRIVER_API && id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStart);
  const bool stop = (domain == CUPTI_CB_DOMAIN_RUNTIME_API && id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000) ||
                    (domain == CUPTI_CB_DOMAIN_DRIVER_API && id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStop);
  uint64_t now = 0;
  if (start && info->callbackSite == CUPTI_API_ENTER) {
    std::lock_guard<std::mutex> lock(mutex);
    if (in_range) return;  // the runtime's call and the driver's call it makes: one range
    cuptiGetTimestamp(&now);
    in_range = true;
    range_start = now;
  } else if (stop && info->callbackSite == CUPTI_API_EXIT) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!in_range) return;
      in_range = false;
    }
    // The programs synchronise before they stop the range, so every kernel of it has ended.
    cuptiGetTimestamp(&now);
    report_error(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    report_range(range_start, now);
  }
}

}  // namespace

extern "C" int InitializeInjection(void) {
  static CUpti_SubscriberHandle subscriber = nullptr;
  const char* by_launch_env = std::getenv("KILN_KERNEL_TRACE_BY_LAUNCH");
  by_launch = by_launch_env != nullptr && std::strcmp(by_launch_env, "0") != 0;
  report_error(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  report_error(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  report_error(cuptiSubscribe(&subscriber, reinterpret_cast<CUpti_CallbackFunc>(on_api), nullptr), "cuptiSubscribe");
  report_error(
      cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000),
      "cuptiEnableCallback");
  report_error(
      cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000),
      "cuptiEnableCallback");
  report_error(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStart),
               "cuptiEnableCallback");
  report_error(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStop),
               "cuptiEnableCallback");
  std::fprintf(stderr, "kernel_trace: recording kernels; ranges from cudaProfilerStart to cudaProfilerStop\n");
  return 1;
}
