// Runs two small training steps with NVTX on (ops off, to keep the log short), for test_nvtx.cpp, which
// starts this program with the recording injection library.
#include "kiln/kiln.h"

int main() {
  using namespace kiln;
  manual_seed(1);
  auto net = std::make_shared<nn::Sequential>();
  net->append(std::make_shared<nn::Linear>(4, 8));
  net->append(std::make_shared<nn::ReLU>());
  profiler::enable_nvtx({.ops = false});
  for (int64_t step = 0; step < 2; ++step) {
    trace::mark_step(step);
    Tensor loss = sum((*net)(randn({3, 4})));
    loss.backward();
  }
  trace::end_step();
  profiler::disable_nvtx();
  return 0;
}
