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
// KILN_KERNEL_TRACE_API=1 also records copies, memsets and every CUDA runtime and driver call, and adds to each
// range's report: the GPU's busy and idle time (the union of kernels, copies and memsets, on any stream), the time each
// stream spent in kernels and in copies, each thread's time inside CUDA calls (the thread that started the range,
// then the 3 busiest others, with their costliest calls), and every call that took KILN_KERNEL_TRACE_SLOW_MS (5) ms or
// more, in the order they began. That shows where a host thread waits on the driver, and which call of which thread
// held the others up. Recording every call slows the program down a little.
//
// Kernel durations here are the GPU's own timestamps: unlike timing each op between two events, host work between
// launches is not counted, so the sums show where a step's GPU time goes. Kernel records are CUpti_ActivityKernel10,
// the layout of CUDA 13.0's CUPTI (later CUPTI versions keep that struct and its fields' order).
#include <cupti_activity.h>      // activity records (kernels)
#include <cupti_callbacks.h>     // API callbacks (the profiler ranges)
#include <cupti_driver_cbid.h>   // CUPTI_DRIVER_TRACE_CBID_*
#include <cupti_runtime_cbid.h>  // CUPTI_RUNTIME_TRACE_CBID_*
#include <cxxabi.h>
#include <unistd.h>  // gettid

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace {

struct KernelRun {
  std::string name;
  uint64_t start = 0, end = 0;  // ns, CUPTI's timestamps
  uint32_t stream = 0;
};

// KILN_KERNEL_TRACE_API: a copy or memset on the GPU, and a CUDA call on the host.
struct CopyRun {
  uint64_t start = 0, end = 0;
  uint32_t stream = 0;
};
struct ApiCall {
  uint64_t start = 0, end = 0;
  uint32_t thread = 0;  // the system's thread id (gettid)
  uint32_t cbid = 0;
  bool driver = false;  // a driver API call (else the runtime's)
};

std::mutex mutex;                // guards everything below: CUPTI hands buffers over on its own thread
std::vector<KernelRun> kernels;  // completed records not yet reported
std::vector<CopyRun> copies;
std::vector<ApiCall> calls;
bool in_range = false;
uint64_t range_start = 0;
uint32_t range_thread = 0;  // the thread that started the range
int range_index = 0;
bool by_launch = false;  // KILN_KERNEL_TRACE_BY_LAUNCH: kernels keyed by name and launch configuration
bool api = false;        // KILN_KERNEL_TRACE_API: copies, memsets and CUDA calls too

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
  std::vector<CopyRun> copy_runs;
  std::vector<ApiCall> api_calls;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      copy_runs.push_back({m->start, m->end, m->streamId});
      continue;
    }
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      copy_runs.push_back({m->start, m->end, m->streamId});
      continue;
    }
    if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME || record->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      api_calls.push_back({a->start, a->end, a->threadId, a->cbid, record->kind == CUPTI_ACTIVITY_KIND_DRIVER});
      continue;
    }
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::string name = demangled(k->name);
    if (by_launch) {
      char launch[96];
      std::snprintf(launch, sizeof launch, " <<<(%d,%d,%d),(%d,%d,%d)>>>", k->gridX, k->gridY, k->gridZ, k->blockX,
                    k->blockY, k->blockZ);
      name += launch;
    }
    runs.push_back({std::move(name), k->start, k->end, k->streamId});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(mutex);
  kernels.insert(kernels.end(), runs.begin(), runs.end());
  copies.insert(copies.end(), copy_runs.begin(), copy_runs.end());
  calls.insert(calls.end(), api_calls.begin(), api_calls.end());
}

// A CUDA call's name: `driver` says which API's callback ids `cbid` is of.
std::string call_name(bool driver, uint32_t cbid) {
  const char* name = nullptr;
  cuptiGetCallbackName(driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name);
  return std::string(name != nullptr ? name : "(unnamed call)") + (driver ? " (driver)" : "");
}

// KILN_KERNEL_TRACE_API's part of a range's report: the GPU's busy time, each stream's, each thread's CUDA calls and
// the slow calls. `ks`, `cs` and `as` are the range's records, clipped to [from, to] here.
void report_api(uint64_t from, uint64_t to, const std::vector<KernelRun>& ks, const std::vector<CopyRun>& cs,
                const std::vector<ApiCall>& as) {
  const auto ms = [](uint64_t ns) { return static_cast<double>(ns) / 1e6; };
  const auto clipped = [&](uint64_t a, uint64_t b) -> std::pair<uint64_t, uint64_t> {
    return {std::max(a, from), std::min(b, to)};
  };
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> per_stream;  // kernels' ns, copies' ns
  for (const KernelRun& k : ks) {
    const auto [a, b] = clipped(k.start, k.end);
    if (b <= a) continue;
    spans.push_back({a, b});
    per_stream[k.stream].first += b - a;
  }
  for (const CopyRun& c : cs) {
    const auto [a, b] = clipped(c.start, c.end);
    if (b <= a) continue;
    spans.push_back({a, b});
    per_stream[c.stream].second += b - a;
  }
  std::sort(spans.begin(), spans.end());
  uint64_t busy = 0, open_start = 0, open_end = 0;
  for (const auto& [a, b] : spans) {
    if (a > open_end) {
      busy += open_end - open_start;
      open_start = a;
      open_end = b;
    } else {
      open_end = std::max(open_end, b);
    }
  }
  busy += open_end - open_start;
  std::fprintf(stderr,
               "kernel_trace range %d: GPU busy %.3f ms (kernels, copies, memsets on any stream), idle %.3f ms\n",
               range_index, ms(busy), ms(to - from) - ms(busy));
  for (const auto& [stream, t] : per_stream) {
    std::fprintf(stderr, "  stream %u: kernels %.3f ms, copies and memsets %.3f ms\n", stream, ms(t.first),
                 ms(t.second));
  }
  // Each thread's calls, by (driver, callback id), named only when printed: total, count, longest.
  std::map<uint32_t, std::map<std::pair<bool, uint32_t>, std::tuple<uint64_t, int64_t, uint64_t>>> per_thread;
  std::map<uint32_t, uint64_t> thread_total;
  const char* slow_env = std::getenv("KILN_KERNEL_TRACE_SLOW_MS");
  const double slow_ms = slow_env != nullptr ? std::atof(slow_env) : 5.0;
  std::vector<const ApiCall*> slow;
  for (const ApiCall& c : as) {
    const auto [a, b] = clipped(c.start, c.end);
    if (b <= a) continue;
    auto& [total, count, longest] = per_thread[c.thread][{c.driver, c.cbid}];
    total += b - a;
    count += 1;
    longest = std::max(longest, c.end - c.start);
    thread_total[c.thread] += b - a;
    if (ms(c.end - c.start) >= slow_ms) slow.push_back(&c);
  }
  std::vector<std::pair<uint64_t, uint32_t>> threads;
  for (const auto& [thread, total] : thread_total) threads.push_back({total, thread});
  std::sort(threads.rbegin(), threads.rend());
  std::fprintf(stderr, "kernel_trace range %d: %zu threads made CUDA calls\n", range_index, threads.size());
  int others = 0;
  for (const auto& [total, thread] : threads) {
    const bool starter = thread == range_thread;
    if (!starter && others++ >= 3) continue;
    std::fprintf(stderr, "  thread %u%s: %.3f ms in CUDA calls\n", thread, starter ? " (started the range)" : "",
                 ms(total));
    std::vector<std::pair<std::tuple<uint64_t, int64_t, uint64_t>, std::pair<bool, uint32_t>>> by_call;
    for (const auto& [call, t] : per_thread[thread]) by_call.push_back({t, call});
    std::sort(by_call.rbegin(), by_call.rend());
    for (size_t i = 0; i < by_call.size() && i < 8; ++i) {
      const auto& [t, call] = by_call[i];
      std::fprintf(stderr, "    %-44s %10.3f ms %8lld calls, longest %.3f ms\n",
                   call_name(call.first, call.second).c_str(), ms(std::get<0>(t)),
                   static_cast<long long>(std::get<1>(t)), ms(std::get<2>(t)));
    }
  }
  // The call that holds the others up begins first.
  std::sort(slow.begin(), slow.end(), [](const ApiCall* a, const ApiCall* b) { return a->start < b->start; });
  std::fprintf(stderr, "kernel_trace range %d: %zu calls of %.1f ms or more, in the order they began\n", range_index,
               slow.size(), slow_ms);
  for (size_t i = 0; i < slow.size() && i < 100; ++i) {
    const ApiCall& c = *slow[i];
    std::fprintf(stderr, "  +%10.3f ms %10.3f ms  thread %u%s  %s\n",
                 (static_cast<double>(c.start) - static_cast<double>(from)) / 1e6, ms(c.end - c.start), c.thread,
                 c.thread == range_thread ? " (started the range)" : "", call_name(c.driver, c.cbid).c_str());
  }
}

// The kernels of [from, to] summed by name, printed; every record up to `to` is then dropped.
void report_range(uint64_t from, uint64_t to) {
  std::vector<KernelRun> inside;
  std::vector<KernelRun> overlapping;  // KILN_KERNEL_TRACE_API: every record that overlaps the range
  std::vector<CopyRun> range_copies;
  std::vector<ApiCall> range_calls;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const KernelRun& k : kernels) {
      if (k.start >= from && k.end <= to) inside.push_back(k);
      if (api && k.end > from && k.start < to) overlapping.push_back(k);
    }
    kernels.erase(std::remove_if(kernels.begin(), kernels.end(), [&](const KernelRun& k) { return k.start <= to; }),
                  kernels.end());
    for (const CopyRun& c : copies) {
      if (c.end > from && c.start < to) range_copies.push_back(c);
    }
    std::erase_if(copies, [&](const CopyRun& c) { return c.start <= to; });
    for (const ApiCall& c : calls) {
      if (c.end > from && c.start < to) range_calls.push_back(c);
    }
    std::erase_if(calls, [&](const ApiCall& c) { return c.start <= to; });
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
  if (api) report_api(from, to, overlapping, range_copies, range_calls);
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
    range_thread = static_cast<uint32_t>(gettid());
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
  const char* api_env = std::getenv("KILN_KERNEL_TRACE_API");
  api = api_env != nullptr && std::strcmp(api_env, "0") != 0;
  report_error(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  report_error(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  if (api) {
    // Threads named as the system names them (gettid), so that the range's own thread is recognised.
    report_error(cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM), "cuptiSetThreadIdType");
    for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME,
                                    CUPTI_ACTIVITY_KIND_DRIVER}) {
      report_error(cuptiActivityEnable(kind), "cuptiActivityEnable");
    }
  }
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
  std::fprintf(stderr, "kernel_trace: recording kernels%s; ranges from cudaProfilerStart to cudaProfilerStop\n",
               api ? ", copies, memsets and CUDA calls" : "");
  return 1;
}
