// The listener list and the dispatch of ranges to it.
#include "kiln/tensor/trace.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::trace {

namespace detail {
std::atomic<int> g_listener_count{0};
}

namespace {

using ListenerList = std::vector<std::shared_ptr<Listener>>;

// Readers take a snapshot of the list; writers replace it. Changes are rare (a profiler starts or stops),
// ranges are many, so the snapshot is an atomic shared_ptr to an immutable vector.
std::mutex g_write_mutex;
std::atomic<std::shared_ptr<const ListenerList>> g_listeners{std::make_shared<const ListenerList>()};

struct StepState {
  bool open = false;
  std::string name;
  Device device = Device::cpu();
};
thread_local StepState t_step;

}  // namespace

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::Op: return "op";
    case Kind::Module: return "module";
    case Kind::Backward: return "backward";
    case Kind::Step: return "step";
    case Kind::User: return "user";
  }
  return "?";
}

void add_listener(std::shared_ptr<Listener> listener) {
  if (!listener) return;
  std::lock_guard lock(g_write_mutex);
  auto next = std::make_shared<ListenerList>(*g_listeners.load());
  next->push_back(std::move(listener));
  detail::g_listener_count.store(static_cast<int>(next->size()), std::memory_order_relaxed);
  g_listeners.store(std::move(next));
}

void remove_listener(const std::shared_ptr<Listener>& listener) {
  std::lock_guard lock(g_write_mutex);
  auto next = std::make_shared<ListenerList>(*g_listeners.load());
  next->erase(std::remove(next->begin(), next->end(), listener), next->end());
  detail::g_listener_count.store(static_cast<int>(next->size()), std::memory_order_relaxed);
  g_listeners.store(std::move(next));
}

namespace detail {

void dispatch_begin(const Range& range) {
  const auto listeners = g_listeners.load();
  for (const auto& l : *listeners) l->begin(range);
}

void dispatch_end(const Range& range) {
  const auto listeners = g_listeners.load();
  // Ends in the reverse order of begins, so listeners nest like the ranges themselves.
  for (auto it = listeners->rbegin(); it != listeners->rend(); ++it) (*it)->end(range);
}

}  // namespace detail

void Scope::open(Kind kind, std::string_view name, Device device, std::initializer_list<const Tensor*> tensors,
                 const void* object) {
  kind_ = kind;
  name_ = name;
  device_ = device;
  open_ = true;
  detail::dispatch_begin(
      Range{kind, name, device, std::span<const Tensor* const>(tensors.begin(), tensors.size()), object});
}

void end_step() {
  if (!t_step.open) return;
  t_step.open = false;
  detail::dispatch_end(Range{Kind::Step, t_step.name, t_step.device, {}});
}

void mark_step(int64_t step, Device device) {
  end_step();
  if (!active()) return;
  t_step.name = "step " + std::to_string(step);
  t_step.device = device;
  t_step.open = true;
  detail::dispatch_begin(Range{Kind::Step, t_step.name, device, {}});
}

}  // namespace kiln::trace
