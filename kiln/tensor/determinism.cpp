// The deterministic-mode switch (determinism.h): one process-wide atomic flag.
#include "kiln/tensor/determinism.h"

#include <atomic>

namespace kiln {

namespace {
std::atomic<bool> g_deterministic{false};
}  // namespace

void set_deterministic(bool enabled) { g_deterministic.store(enabled, std::memory_order_relaxed); }
bool deterministic() { return g_deterministic.load(std::memory_order_relaxed); }

}  // namespace kiln
