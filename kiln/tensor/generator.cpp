#include "kiln/tensor/generator.h"

#include <deque>

#include "kiln/tensor/cuda.h"  // cuda::Graph::capturing

namespace kiln {

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_ = {seed, 0};
}

uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_.seed;
}

GeneratorState Generator::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

void Generator::set_state(const GeneratorState& state) {
  const bool capturing = cuda::Graph::capturing();
  std::lock_guard<std::mutex> lock(mutex_);
  state_ = state;
  state_.device_offset = nullptr;
  if (capturing) rewound_in_capture_ = true;
}

bool Generator::rewound_in_capture() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rewound_in_capture_;
}

GeneratorState Generator::next_draw() {
  const bool capturing = cuda::Graph::capturing();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!capturing) rewound_in_capture_ = false;
  GeneratorState draw = state_;
  ++state_.offset;
  return draw;
}

namespace {
// One generator per device, created on first use; a deque keeps references stable as it grows.
std::mutex g_generators_mutex;
uint64_t g_last_seed = Generator::kDefaultSeed;  // what a GPU generator created later starts from
Generator g_cpu_generator;
std::deque<Generator>& cuda_generators() {
  static std::deque<Generator> gens;
  return gens;
}
}  // namespace

Generator& default_generator(Device device) {
  if (device.is_cpu()) return g_cpu_generator;
  std::lock_guard<std::mutex> lock(g_generators_mutex);
  auto& gens = cuda_generators();
  while (static_cast<int>(gens.size()) <= device.index()) gens.emplace_back(g_last_seed);
  return gens[static_cast<size_t>(device.index())];
}

void manual_seed(uint64_t seed) {
  g_cpu_generator.manual_seed(seed);
  std::lock_guard<std::mutex> lock(g_generators_mutex);
  g_last_seed = seed;
  for (auto& g : cuda_generators()) g.manual_seed(seed);
}

}  // namespace kiln
