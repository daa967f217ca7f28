// kiln/autograd/grad_mode.h — whether ops record the graph, per thread.
//
//   {
//     kiln::NoGradGuard no_grad;          // optimizer steps, evaluation, weight init
//     w.sub_(w.grad() * lr);
//   }
//   kiln::EnableGradGuard on;             // switch recording back on inside a NoGradGuard region
//
// Grad mode is thread-local: a data-loader thread or a second training thread has its own.
#pragma once

namespace kiln {

namespace autograd::detail {
inline thread_local bool grad_mode_enabled = true;
}  // namespace autograd::detail

// Whether autograd records ops on this thread (on by default); the guards below set it for a scope.
struct GradMode {
  // Whether ops record the graph on this thread.
  static bool is_enabled() { return autograd::detail::grad_mode_enabled; }
  // Sets it for this thread, until set again (prefer the guards).
  static void set_enabled(bool enabled) { autograd::detail::grad_mode_enabled = enabled; }
};

// Sets grad mode for the guard's scope, restoring the previous mode when it ends.
class AutoGradMode {
 public:
  // Sets grad mode to `enabled`, remembering the previous one.
  explicit AutoGradMode(bool enabled) : previous_(GradMode::is_enabled()) { GradMode::set_enabled(enabled); }
  ~AutoGradMode() { GradMode::set_enabled(previous_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool previous_;
};

// Turns gradient recording off for its scope (evaluation, parameter updates), as torch.no_grad().
struct NoGradGuard : AutoGradMode {
  NoGradGuard() : AutoGradMode(false) {}
};

// Turns gradient recording on for its scope, inside a NoGradGuard's.
struct EnableGradGuard : AutoGradMode {
  EnableGradGuard() : AutoGradMode(true) {}
};

}  // namespace kiln
