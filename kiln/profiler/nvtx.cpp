// NVTX ranges from trace ranges (nvtx.h). Nested kinds use push/pop; steps, which end at the next
// mark_step, use start/end ranges.
#include "kiln/profiler/nvtx.h"

#include <memory>
#include <mutex>
#include <string>

#include "kiln/tensor/error.h"  // KILN_FAIL
#include "kiln/tensor/trace.h"

#if defined(KILN_WITH_NVTX)
#include <nvtx3/nvToolsExt.h>  // header-only NVTX 3: loads the tool's library only when one is attached
#endif

namespace kiln::profiler {

#if defined(KILN_WITH_NVTX)
namespace {

uint32_t color_of(trace::Kind kind) {
  switch (kind) {
    case trace::Kind::Step: return 0xff4caf50;      // green
    case trace::Kind::Module: return 0xff2196f3;    // blue
    case trace::Kind::Backward: return 0xffff9800;  // orange
    case trace::Kind::Op: return 0xff9e9e9e;        // grey
    case trace::Kind::User: return 0xff9c27b0;      // purple
  }
  return 0xffffffff;
}

class NvtxListener final : public trace::Listener {
 public:
  explicit NvtxListener(NvtxOptions o) : options_(o), domain_(nvtxDomainCreateA("kiln")) {}

  void begin(const trace::Range& r) override {
    if (!wanted(r.kind)) return;
    name_.assign(r.name);
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = color_of(r.kind);
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name_.c_str();
    if (r.kind == trace::Kind::Step) {
      step_range_ = nvtxDomainRangeStartEx(domain_, &a);
    } else {
      nvtxDomainRangePushEx(domain_, &a);
      ++depth_;
    }
  }

  void end(const trace::Range& r) override {
    if (!wanted(r.kind)) return;
    if (r.kind == trace::Kind::Step) {
      if (step_range_ != 0) nvtxDomainRangeEnd(domain_, step_range_);
      step_range_ = 0;
    } else if (depth_ > 0) {  // not a range that began before NVTX was enabled
      nvtxDomainRangePop(domain_);
      --depth_;
    }
  }

 private:
  bool wanted(trace::Kind k) const {
    switch (k) {
      case trace::Kind::Step: return options_.steps;
      case trace::Kind::Module: return options_.modules;
      case trace::Kind::Backward: return options_.backward;
      case trace::Kind::Op: return options_.ops;
      case trace::Kind::User: return options_.user;
    }
    return false;
  }

  NvtxOptions options_;
  nvtxDomainHandle_t domain_;
  // Per thread: ranges nest per thread, and the message must live until the push returns.
  static thread_local std::string name_;
  static thread_local int depth_;
  static thread_local nvtxRangeId_t step_range_;
};

thread_local std::string NvtxListener::name_;
thread_local int NvtxListener::depth_ = 0;
thread_local nvtxRangeId_t NvtxListener::step_range_ = 0;

std::mutex g_mutex;
std::shared_ptr<NvtxListener> g_listener;

}  // namespace

void enable_nvtx(NvtxOptions options) {
  std::lock_guard lock(g_mutex);
  if (g_listener) trace::remove_listener(g_listener);
  g_listener = std::make_shared<NvtxListener>(options);
  trace::add_listener(g_listener);
}

void disable_nvtx() {
  std::lock_guard lock(g_mutex);
  if (g_listener) trace::remove_listener(g_listener);
  g_listener.reset();
}

bool nvtx_enabled() {
  std::lock_guard lock(g_mutex);
  return g_listener != nullptr;
}

bool nvtx_compiled() { return true; }

#else

void enable_nvtx(NvtxOptions) {
  KILN_FAIL("profiler::enable_nvtx: this build of kiln has no NVTX (it was built without CUDA); rebuild with "
            "-DKILN_CUDA=ON, or use profiler::Profile, which works on every build");
}
void disable_nvtx() {}
bool nvtx_enabled() { return false; }
bool nvtx_compiled() { return false; }

#endif

}  // namespace kiln::profiler
