// An NVTX injection library for the tests: loaded by NVTX itself when NVTX_INJECTION64_PATH names it (as
// Nsight Systems' is), it takes over the domain range calls and writes one line per call to the file named
// by KILN_TEST_NVTX_LOG: "push <domain> <message>", "pop <domain>", "start <domain> <message>",
// "end <domain>". The test then reads what kiln sent to NVTX.
#include <nvtx3/nvToolsExt.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

std::mutex g_mutex;
FILE* g_log = nullptr;
nvtxRangeId_t g_next_range = 1;

void log_line(const std::string& line) {
  std::lock_guard lock(g_mutex);
  if (g_log == nullptr) return;
  std::fprintf(g_log, "%s\n", line.c_str());
  std::fflush(g_log);
}

// Domain handles are the domain's name, copied.
nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  return reinterpret_cast<nvtxDomainHandle_t>(new std::string(name != nullptr ? name : ""));
}
const std::string& name_of(nvtxDomainHandle_t d) {
  static const std::string kNone = "(default)";
  return d != nullptr ? *reinterpret_cast<const std::string*>(d) : kNone;
}
std::string message_of(const nvtxEventAttributes_t* a) {
  if (a == nullptr || a->messageType != NVTX_MESSAGE_TYPE_ASCII || a->message.ascii == nullptr) return "?";
  return a->message.ascii;
}

int NVTX_API push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  log_line("push " + name_of(d) + " " + message_of(a));
  return 0;
}
int NVTX_API pop(nvtxDomainHandle_t d) {
  log_line("pop " + name_of(d));
  return 0;
}
nvtxRangeId_t NVTX_API start(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  log_line("start " + name_of(d) + " " + message_of(a));
  std::lock_guard lock(g_mutex);
  return g_next_range++;
}
void NVTX_API end(nvtxDomainHandle_t d, nvtxRangeId_t) { log_line("end " + name_of(d)); }

}  // namespace

extern "C" NVTX_DYNAMIC_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  const char* path = std::getenv("KILN_TEST_NVTX_LOG");
  if (path == nullptr || (g_log = std::fopen(path, "w")) == nullptr) return 0;
  auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == nullptr) return 0;
  auto set = [&](unsigned int id, NvtxFunctionPointer f) {
    if (id < size && table[id] != nullptr) *table[id] = f;
  };
  set(NVTX_CBID_CORE2_DomainCreateA, reinterpret_cast<NvtxFunctionPointer>(&domain_create));
  set(NVTX_CBID_CORE2_DomainRangePushEx, reinterpret_cast<NvtxFunctionPointer>(&push));
  set(NVTX_CBID_CORE2_DomainRangePop, reinterpret_cast<NvtxFunctionPointer>(&pop));
  set(NVTX_CBID_CORE2_DomainRangeStartEx, reinterpret_cast<NvtxFunctionPointer>(&start));
  set(NVTX_CBID_CORE2_DomainRangeEnd, reinterpret_cast<NvtxFunctionPointer>(&end));
  return 1;
}
