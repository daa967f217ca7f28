// kiln/tensor/threads.h — how many CPU threads kiln's CPU kernels use.
//
//   kiln::set_num_threads(4);   // or KILN_NUM_THREADS=4 in the environment, read at first use
//   int n = kiln::num_threads();
#pragma once

namespace kiln {

int num_threads();            // the calling thread plus the pool's workers
void set_num_threads(int n);  // n >= 1; waits for running parallel work, then resizes the pool

}  // namespace kiln
