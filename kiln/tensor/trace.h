// kiln/tensor/trace.h — the ranges kiln marks while it works (ops, modules, backward nodes, steps), for the
// profiler and NVTX to listen to.
//
//   {
//     kiln::trace::Scope range(kiln::trace::Kind::User, "augment");  // a range of your own
//     ...
//   }
//   kiln::trace::mark_step(step);  // closes the previous step's range and opens this one's
//
// Nothing is recorded unless a listener is installed (profiler::Profile, profiler::enable_nvtx): a Scope then
// costs one relaxed atomic load. kiln opens ranges itself around every backend op (with the op's tensors),
// every cuDNN/fused kernel entry, every Module call and every backward node.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>

#include "kiln/tensor/device.h"

namespace kiln {
class Tensor;
}

namespace kiln::trace {

enum class Kind : uint8_t {
  Op,        // a tensor op or kernel entry: what launches work on a device
  Module,    // an nn::Module call (its type name)
  Backward,  // one autograd node's backward ("MulBackward")
  Step,      // a training step (mark_step)
  User,      // a range the program opened itself
};
std::string_view kind_name(Kind kind);  // "op", "module", "backward", "step", "user"

// What a listener is told when a range begins. `name` lives as long as the range. `device` is where the
// range's work runs (CPU for host-only ranges): a listener may time it there. `tensors` are the op's
// operands (outputs first where the op has them), only at begin.
struct Range {
  Kind kind;                               // what the range covers
  std::string_view name;                   // the op's, module's, node's or step's name
  Device device;                           // where the range's work runs
  std::span<const Tensor* const> tensors;  // the op's operands at begin; empty at end
  const void* object = nullptr;            // Module ranges: the nn::Module called (at begin)
};

// Receives every range's begin and end on the thread that opened it, in LIFO order per thread. A listener
// installed while a range is open sees that range's end without its begin: ignore such ends.
class Listener {
 public:
  virtual ~Listener() = default;
  virtual void begin(const Range& range) = 0;  // a range opened on this thread
  virtual void end(const Range& range) = 0;    // the innermost open range of this thread closed
};

// Listeners stay alive while a range on another thread may still call them (the list holds them).
void add_listener(std::shared_ptr<Listener> listener);
void remove_listener(const std::shared_ptr<Listener>& listener);

namespace detail {
extern std::atomic<int> g_listener_count;
void dispatch_begin(const Range& range);
void dispatch_end(const Range& range);
}  // namespace detail

// True while at least one listener is installed.
inline bool active() { return detail::g_listener_count.load(std::memory_order_relaxed) != 0; }

// A range for the lifetime of the object. `name` must outlive it (string literals, type names).
class Scope {
 public:
  // Opens the range when a listener is installed; the destructor closes it.
  Scope(Kind kind, std::string_view name, Device device = Device::cpu(),
        std::initializer_list<const Tensor*> tensors = {}, const void* object = nullptr) {
    if (active()) open(kind, name, device, tensors, object);
  }
  ~Scope() {
    if (open_) detail::dispatch_end(Range{kind_, name_, device_, {}});
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void open(Kind kind, std::string_view name, Device device, std::initializer_list<const Tensor*> tensors,
            const void* object);
  std::string_view name_;
  Device device_ = Device::cpu();
  Kind kind_ = Kind::User;
  bool open_ = false;
};

// Steps: ends the calling thread's open step range (if any) and opens "step <step>"; `device` is where the
// step's work runs (a listener may time the step there). end_step() closes it without opening another.
// profiler::Profile::step() calls mark_step itself: a program calls one or the other once per step.
void mark_step(int64_t step, Device device = Device::cpu());
void end_step();

}  // namespace kiln::trace
