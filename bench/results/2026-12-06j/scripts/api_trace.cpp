// CUPTI injection (CUDA_INJECTION64_PATH): kernels, copies and CUDA API calls between the program's cudaProfilerStart
// and cudaProfilerStop, summarised at exit: per stream the kernels' time and count, the GPU's busy time (union of
// kernels and copies), the top kernels, per thread the API calls' time (the thread that called Start marked), and
// the calls of TRACE_SLOW_MS or more in the order they began (that timeline is new since the 2026-12-06 (j) runs).
//   g++ -O2 -std=c++20 -shared -fPIC api_trace.cpp -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcupti
//       -o libapi_trace.so
#include <cupti.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {
struct K { uint64_t s, e; uint32_t stream; std::string name; };
struct M { uint64_t s, e; uint32_t stream; uint64_t bytes; int kind; };
struct A { uint64_t s, e; uint32_t thread; uint32_t cbid; int domain; };
std::mutex mu;
std::vector<K> ks; std::vector<M> ms; std::vector<A> as;
std::atomic<uint64_t> t_start{0}, t_stop{0};
uint32_t start_thread = 0;
bool registered = false;

void CUPTIAPI requested(uint8_t** buf, size_t* size, size_t* max) {
  *size = 8 << 20; *buf = static_cast<uint8_t*>(aligned_alloc(8, *size)); *max = 0;
}
void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  std::lock_guard<std::mutex> l(mu);
  while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(r);
      ks.push_back({k->start, k->end, k->streamId, std::string(k->name ? k->name : "?").substr(0, 90)});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(r);
      ms.push_back({m->start, m->end, m->streamId, m->bytes, m->copyKind});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(r);
      ms.push_back({m->start, m->end, m->streamId, m->bytes, 100});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME || r->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      auto* a = reinterpret_cast<CUpti_ActivityAPI*>(r);
      as.push_back({a->start, a->end, a->threadId, a->cbid, r->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? 0 : 1});
    }
  }
  free(buf);
}

std::string api_name(int domain, uint32_t cbid) {
  const char* n = nullptr;
  cuptiGetCallbackName(domain == 0 ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, cbid, &n);
  return n ? n : "?";
}

void report() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> l(mu);
  const uint64_t t0 = t_start, t1 = t_stop;
  if (!t0 || !t1) { std::fprintf(stderr, "trace: no profiler start/stop seen\n"); return; }
  const double win = (t1 - t0) / 1e6;
  const int steps = std::getenv("TRACE_STEPS") ? std::atoi(std::getenv("TRACE_STEPS")) : 30;
  std::fprintf(stderr, "trace: window %.2f ms (%d steps: %.2f ms a step); %zu kernels, %zu copies, %zu API records in all\n", win, steps, win / steps, ks.size(), ms.size(), as.size());
  auto clip = [&](uint64_t s, uint64_t e) { s = std::max(s, t0); e = std::min(e, t1); return e > s ? e - s : 0; };
  std::vector<std::pair<uint64_t, uint64_t>> iv;
  std::map<uint32_t, std::pair<double, int>> per_stream;
  std::map<std::string, std::pair<double, int>> per_name;
  for (auto& k : ks) {
    uint64_t d = clip(k.s, k.e);
    if (!d) continue;
    iv.push_back({std::max(k.s, t0), std::min(k.e, t1)});
    per_stream[k.stream].first += d / 1e6; per_stream[k.stream].second++;
    per_name[k.name].first += d / 1e6; per_name[k.name].second++;
  }
  std::map<uint32_t, std::pair<double, int>> copy_stream;
  for (auto& m : ms) {
    uint64_t d = clip(m.s, m.e);
    if (!d) continue;
    iv.push_back({std::max(m.s, t0), std::min(m.e, t1)});
    copy_stream[m.stream].first += d / 1e6; copy_stream[m.stream].second++;
  }
  std::sort(iv.begin(), iv.end());
  double busy = 0; uint64_t cs = 0, ce = 0;
  for (auto& p : iv) {
    if (p.first > ce) { busy += (ce - cs) / 1e6; cs = p.first; ce = p.second; } else ce = std::max(ce, p.second);
  }
  busy += (ce - cs) / 1e6;
  std::fprintf(stderr, "trace: GPU busy %.2f ms a step, idle %.2f ms a step\n", busy / steps, (win - busy) / steps);
  for (auto& [s, v] : per_stream) std::fprintf(stderr, "trace: stream %u kernels %.3f ms a step, %.1f a step\n", s, v.first / steps, double(v.second) / steps);
  for (auto& [s, v] : copy_stream) std::fprintf(stderr, "trace: stream %u copies/memsets %.3f ms a step, %.1f a step\n", s, v.first / steps, double(v.second) / steps);
  std::vector<std::pair<double, std::string>> top;
  for (auto& [n, v] : per_name) top.push_back({v.first, n + " x" + std::to_string(v.second)});
  std::sort(top.rbegin(), top.rend());
  for (size_t i = 0; i < std::min<size_t>(top.size(), 12); ++i) std::fprintf(stderr, "trace: kernel %.3f ms a step: %s\n", top[i].first / steps, top[i].second.c_str());
  // API: per thread, total time in calls inside the window; top calls by time for each of the busiest threads.
  std::map<uint32_t, std::map<std::string, std::tuple<double, int, double>>> per_thread;
  std::map<uint32_t, double> thread_total;
  for (auto& a : as) {
    uint64_t d = clip(a.s, a.e);
    if (!d) continue;
    auto& t = per_thread[a.thread][api_name(a.domain, a.cbid) + (a.domain ? "(drv)" : "")];
    std::get<0>(t) += d / 1e6; std::get<1>(t)++; std::get<2>(t) = std::max(std::get<2>(t), d / 1e6);
    thread_total[a.thread] += d / 1e6;
  }
  // Calls of TRACE_SLOW_MS (5) ms or more, in the order they began: the call that holds the driver begins first.
  {
    const double slow_ms = std::getenv("TRACE_SLOW_MS") ? std::atof(std::getenv("TRACE_SLOW_MS")) : 5.0;
    std::vector<const A*> slow;
    for (auto& a : as) {
      if (clip(a.s, a.e) && (a.e - a.s) / 1e6 >= slow_ms) slow.push_back(&a);
    }
    std::sort(slow.begin(), slow.end(), [](const A* x, const A* y) { return x->s < y->s; });
    std::fprintf(stderr, "trace: %zu calls of %.1f ms or more, in the order they began\n", slow.size(), slow_ms);
    for (size_t i = 0; i < std::min<size_t>(slow.size(), 80); ++i) {
      const A& a = *slow[i];
      std::fprintf(stderr, "trace:    +%9.3f ms  %8.3f ms  thread %u%s  %s\n", (double(a.s) - double(t0)) / 1e6,
                   (a.e - a.s) / 1e6, a.thread, a.thread == start_thread ? " (training)" : "",
                   (api_name(a.domain, a.cbid) + (a.domain ? "(drv)" : "")).c_str());
    }
  }
  std::vector<std::pair<double, uint32_t>> threads;
  for (auto& [t, v] : thread_total) threads.push_back({v, t});
  std::sort(threads.rbegin(), threads.rend());
  std::fprintf(stderr, "trace: %zu threads made CUDA calls in the window\n", threads.size());
  int shown = 0;
  for (auto& [tot, t] : threads) {
    bool main_thread = t == start_thread;
    if (!main_thread && shown >= 3) continue;
    if (!main_thread) shown++;
    std::fprintf(stderr, "trace: thread %u%s: %.2f ms a step in CUDA calls\n", t, main_thread ? " (the training thread)" : "", tot / steps);
    std::vector<std::tuple<double, std::string, int, double>> calls;
    for (auto& [n, v] : per_thread[t]) calls.push_back({std::get<0>(v), n, std::get<1>(v), std::get<2>(v)});
    std::sort(calls.rbegin(), calls.rend());
    for (size_t i = 0; i < std::min<size_t>(calls.size(), main_thread ? 10 : 6); ++i)
      std::fprintf(stderr, "trace:    %-40s %.3f ms a step, %d calls, max %.3f ms\n", std::get<1>(calls[i]).c_str(), std::get<0>(calls[i]) / steps, std::get<2>(calls[i]), std::get<3>(calls[i]));
  }
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain, CUpti_CallbackId cbid, const void* data) {
  auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_ENTER) return;
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000) {
    t_start = t;
    start_thread = static_cast<uint32_t>(gettid());
  } else if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000) {
    t_stop = t;
    if (!registered) { registered = true; std::atexit(report); }
  }
}
}  // namespace

extern "C" int InitializeInjection(void) {
  cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);
  cuptiActivityRegisterCallbacks(requested, completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
  CUpti_SubscriberHandle sub;
  cuptiSubscribe(&sub, on_api, nullptr);
  cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000);
  cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000);
  return 1;
}
