// A profile's result: per-name totals, the table, and the Chrome trace (profiler.h).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>  // the trace file
#include <set>

#include "kiln/profiler/profiler.h"
#include "kiln/tensor/error.h"  // KILN_CHECK

namespace kiln::profiler {

std::vector<OpStats> Result::stats(trace::Kind kind) const {
  // Self time: an event's own time less its direct children's (children on the GPU of the same device).
  std::vector<int64_t> child_host(events_.size(), 0), child_gpu(events_.size(), 0);
  for (const Event& e : events_) {
    if (e.parent < 0) continue;
    const auto p = static_cast<size_t>(e.parent);
    child_host[p] += e.host_ns();
    if (e.gpu_device >= 0 && e.gpu_device == events_[p].gpu_device) child_gpu[p] += e.gpu_ns();
  }
  std::map<std::string, OpStats> by_name;
  for (size_t i = 0; i < events_.size(); ++i) {
    const Event& e = events_[i];
    if (e.kind != kind) continue;
    OpStats& s = by_name[e.name];
    s.kind = kind;
    s.name = e.name;
    s.calls += 1;
    s.host_total_ns += e.host_ns();
    s.host_self_ns += std::max<int64_t>(0, e.host_ns() - child_host[i]);
    s.gpu_total_ns += e.gpu_ns();
    s.gpu_self_ns += std::max<int64_t>(0, e.gpu_ns() - child_gpu[i]);
  }
  std::vector<OpStats> out;
  out.reserve(by_name.size());
  for (auto& [name, s] : by_name) out.push_back(std::move(s));
  std::stable_sort(out.begin(), out.end(), [](const OpStats& a, const OpStats& b) {
    if (a.gpu_self_ns != b.gpu_self_ns) return a.gpu_self_ns > b.gpu_self_ns;
    return a.host_self_ns > b.host_self_ns;
  });
  return out;
}

namespace {
std::string ms(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) / 1e6);
  return buf;
}
}  // namespace

std::string Result::table(int rows) const {
  const std::vector<OpStats> all = stats(trace::Kind::Op);
  int64_t gpu_sum = 0, host_sum = 0;
  for (const OpStats& s : all) {
    gpu_sum += s.gpu_self_ns;
    host_sum += s.host_self_ns;
  }
  size_t width = 2;
  for (size_t i = 0; i < all.size() && static_cast<int>(i) < rows; ++i) width = std::max(width, all[i].name.size());
  // Without GPU times (a CPU run) the GPU columns are left out and the ops sort by host self time.
  const bool gpu = gpu_sum > 0;
  std::string out;
  char line[512];
  if (gpu) {
    std::snprintf(line, sizeof line, "%-*s %8s %12s %12s %7s %12s %12s\n", static_cast<int>(width), "op", "calls",
                  "GPU self ms", "GPU total ms", "GPU %", "host self ms", "host tot ms");
  } else {
    std::snprintf(line, sizeof line, "%-*s %8s %12s %12s %7s\n", static_cast<int>(width), "op", "calls",
                  "host self ms", "host tot ms", "host %");
  }
  out += line;
  for (size_t i = 0; i < all.size() && static_cast<int>(i) < rows; ++i) {
    const OpStats& s = all[i];
    const int64_t self = gpu ? s.gpu_self_ns : s.host_self_ns;
    const int64_t sum = gpu ? gpu_sum : host_sum;
    const double share = sum > 0 ? 100.0 * static_cast<double>(self) / static_cast<double>(sum) : 0;
    if (gpu) {
      std::snprintf(line, sizeof line, "%-*s %8lld %12s %12s %6.1f%% %12s %12s\n", static_cast<int>(width),
                    s.name.c_str(), static_cast<long long>(s.calls), ms(s.gpu_self_ns).c_str(),
                    ms(s.gpu_total_ns).c_str(), share, ms(s.host_self_ns).c_str(), ms(s.host_total_ns).c_str());
    } else {
      std::snprintf(line, sizeof line, "%-*s %8lld %12s %12s %6.1f%%\n", static_cast<int>(width), s.name.c_str(),
                    static_cast<long long>(s.calls), ms(s.host_self_ns).c_str(), ms(s.host_total_ns).c_str(), share);
    }
    out += line;
  }
  if (gpu) {
    std::snprintf(line, sizeof line, "%zu ops in %lld steps; all ops: GPU self %s ms, host self %s ms\n", all.size(),
                  static_cast<long long>(steps_), ms(gpu_sum).c_str(), ms(host_sum).c_str());
  } else {
    std::snprintf(line, sizeof line, "%zu ops in %lld steps; all ops: host self %s ms (no GPU times)\n", all.size(),
                  static_cast<long long>(steps_), ms(host_sum).c_str());
  }
  out += line;
  return out;
}

std::string Result::chrome_trace_json() const {
  using nlohmann::json;
  // Chrome's trace event format: "X" (complete) events in microseconds; the host is process 0, each GPU
  // process 1 + its index with one row per stream; "M" events name the processes and rows.
  json events = json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"args", {{"name", "host"}}}});
  for (size_t t = 0; t < thread_names_.size(); ++t)
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", t}, {"args", {{"name", thread_names_[t]}}}});
  std::set<std::pair<int, int>> gpu_rows;
  for (const Event& e : events_) {
    json args = {{"step", e.step}};
    if (!e.shapes.empty()) args["shapes"] = e.shapes;
    const std::string cat(trace::kind_name(e.kind));
    events.push_back({{"ph", "X"}, {"cat", cat}, {"name", e.name}, {"pid", 0}, {"tid", e.thread},
                      {"ts", static_cast<double>(e.host_begin_ns) / 1e3},
                      {"dur", static_cast<double>(e.host_ns()) / 1e3}, {"args", args}});
    if (e.gpu_device >= 0) {
      gpu_rows.insert({e.gpu_device, e.gpu_stream});
      events.push_back({{"ph", "X"}, {"cat", "gpu_" + cat}, {"name", e.name}, {"pid", 1 + e.gpu_device},
                        {"tid", e.gpu_stream}, {"ts", static_cast<double>(e.gpu_begin_ns) / 1e3},
                        {"dur", static_cast<double>(e.gpu_ns()) / 1e3}, {"args", args}});
    }
  }
  std::set<int> devices;
  for (auto [device, stream] : gpu_rows) {
    if (devices.insert(device).second)
      events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 1 + device},
                        {"args", {{"name", "cuda:" + std::to_string(device)}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1 + device}, {"tid", stream},
                      {"args", {{"name", "stream " + std::to_string(stream)}}}});
  }
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump();
}

void Result::write_chrome_trace(const std::string& path) const {
  const std::string text = chrome_trace_json();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(f.good(), "profiler: cannot write the trace file '", tmp,
               "': check that its folder exists and is writable");
    f << text;
    f.flush();
    KILN_CHECK(f.good(), "profiler: writing the trace file '", tmp, "' failed (disk full?)");
  }
  KILN_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "profiler: cannot rename '", tmp, "' to '", path, "'");
}

}  // namespace kiln::profiler
