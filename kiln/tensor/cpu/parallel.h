// kiln/tensor/cpu/parallel.h — spreading a loop over the CPU backend's thread pool.
//
//   parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) { for (i = begin; i < end; ++i) ...; });
//
// Ranges smaller than two grains run on the calling thread. The pool has num_threads() - 1 workers
// plus the caller (KILN_NUM_THREADS overrides the hardware count; set_num_threads() at run time).
// A parallel_for inside a parallel_for runs serially. Exceptions thrown by fn reach the caller.
#pragma once

#include <cstdint>
#include <functional>

namespace kiln::cpu {

// Elementwise work below this many elements is not worth a thread hand-off.
inline constexpr int64_t kGrainSize = 32768;

int num_threads();
void set_num_threads(int n);

void parallel_for_impl(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& fn) {
  if (end <= begin) return;
  if (end - begin < 2 * grain || num_threads() == 1) {
    fn(begin, end);
    return;
  }
  parallel_for_impl(begin, end, grain, fn);
}

}  // namespace kiln::cpu
