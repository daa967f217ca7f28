// kiln/tensor/capture.cpp — the thread's recorder and the records ops hand it.
#include "kiln/tensor/capture.h"

#include "kiln/tensor/error.h"

namespace kiln::capture {

namespace detail {
std::atomic<int> g_sessions{0};
constinit thread_local Recorder* t_recorder = nullptr;
constinit thread_local int t_depth = 0;
}  // namespace detail

const Attr* OpRecord::attr(std::string_view name) const {
  for (const Attr& a : attrs) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

Session::Session(Recorder& recorder) {
  KILN_CHECK(detail::t_recorder == nullptr,
             "capture::Session: a recorder is already installed on this thread (one export or trace at a time)");
  detail::t_recorder = &recorder;
  detail::t_depth = 0;
  detail::g_sessions.fetch_add(1, std::memory_order_relaxed);
}

Session::~Session() {
  detail::g_sessions.fetch_sub(1, std::memory_order_relaxed);
  detail::t_recorder = nullptr;
  detail::t_depth = 0;
}

void Op::record(std::vector<Tensor> inputs, std::vector<Tensor> outputs, std::vector<Attr> attrs) const {
  if (!*this) return;
  detail::t_recorder->record(OpRecord{name_, std::move(inputs), std::move(outputs), std::move(attrs)});
}

}  // namespace kiln::capture
