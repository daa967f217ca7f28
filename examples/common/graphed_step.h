// examples/common/graphed_step.h — the examples' --cuda-graph: a training step on static input tensors, run
// eagerly for its first calls, then recorded once in a kiln::cuda::Graph and replayed for every later batch.
// Written against kiln's public API only, like the examples.
//
//   ex::StaticBatch inputs;                      // the tensors the step reads; each batch is copied into them
//   Tensor last_loss = zeros({}, {.device = gpu});
//   ex::GraphedStep graphed([&] {                // the whole step: forward, loss, backward, optimizer, zero_grad
//     Tensor loss = nn::cross_entropy(model(inputs.batch()[0]), inputs.batch()[1]);
//     loss.backward();
//     last_loss.copy_(loss.detach());            // a tensor made before the capture: replays write it
//     opt.step();
//     opt.zero_grad();
//   });
//   for (data::Batch& b : loader.epoch(e)) {
//     inputs.copy_from(b);
//     graphed.run();                             // eager, eager, capture (one more real step), replay, ...
//     sched.step();                              // the optimizers read the learning rate before each replay
//   }
//
// Keep the tensors the step reads (the static batch, the model, the optimizer and its state) alive and in place
// for as long as the GraphedStep: replays write the addresses the capture saw.
#pragma once

#include <kiln/kiln.h>
#include <kiln/tensor/cuda.h>  // cuda::Graph

#include <cstdlib>  // std::getenv
#include <cstring>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ex {

// Why this process's environment rules out a capture, or "" when nothing does: KILN_CUDA_SYNC_INDEX_CHECKS makes
// every index op wait for the GPU to report bad indices, a host synchronisation that a capture cannot record.
inline std::string cuda_graph_env_conflict() {
  const char* v = std::getenv("KILN_CUDA_SYNC_INDEX_CHECKS");
  if (v == nullptr || std::strcmp(v, "") == 0 || std::strcmp(v, "0") == 0) return "";
  return "--cuda-graph does not work with KILN_CUDA_SYNC_INDEX_CHECKS=" + std::string(v) +
         " (each index op then waits for the GPU, which a captured step must not); unset it, or leave out "
         "--cuda-graph";
}

// The step's input tensors: a copy of the first batch; every later batch is copied into those same tensors, on
// the current stream. Every batch must have the first one's fields, shapes and dtypes (the training loaders drop
// the last partial batch of an epoch, so theirs do).
class StaticBatch {
 public:
  void copy_from(const kiln::data::Batch& b) {
    if (static_.empty()) {
      for (size_t i = 0; i < b.size(); ++i) static_.add(b.names()[i], b[i].clone());  // the layout is kept
      return;
    }
    if (b.names() != static_.names())
      throw std::runtime_error("--cuda-graph: a batch with other fields than the first");
    for (size_t i = 0; i < b.size(); ++i) {
      const kiln::Tensor& from = b[i];
      kiln::Tensor& to = static_[i];
      if (from.shape() != to.shape() || from.dtype() != to.dtype()) {
        auto shape = [](const kiln::Shape& sh) {
          std::string s = "(";
          for (size_t d = 0; d < sh.size(); ++d) s += (d ? ", " : "") + std::to_string(sh[d]);
          return s + ")";
        };
        std::ostringstream why;
        why << "--cuda-graph: field '" << b.names()[i] << "' of a batch is " << from.dtype() << " "
            << shape(from.shape()) << ", the captured step reads " << to.dtype() << " " << shape(to.shape())
            << "; a replayed step needs every batch of the same shape (full batches, one sequence length)";
        throw std::runtime_error(why.str());
      }
      to.copy_(from);
    }
  }
  const kiln::data::Batch& batch() const { return static_; }
  bool empty() const { return static_.empty(); }

 private:
  kiln::data::Batch static_;
};

// A training step run eagerly for its first `eager_steps` calls (cuDNN's algorithm search, cuBLAS plans, the
// optimizer's state and the gradients come into being on the current stream), then captured: that call runs the
// step once more for real on the graph's stream (cuda::Graph::capture's warm-up, so it trains on the batch copied
// for it, as an eager call would) and records it without running it again. Every later call replays the record.
class GraphedStep {
 public:
  explicit GraphedStep(std::function<void()> step, int eager_steps = 2)
      : step_(std::move(step)), eager_steps_(eager_steps) {}

  // One training step. Returns true on the call that captured the step.
  bool run() {
    if (graph_.captured()) {
      graph_.replay();
      return false;
    }
    if (calls_++ < eager_steps_) {
      step_();
      return false;
    }
    try {
      // The eager steps' cached blocks go back to the driver first: the capture takes memory of its own, which the
      // caching allocator keeps for the graph's replays.
      kiln::cuda::empty_cache();
      graph_.capture(step_, /*warmup=*/1);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("--cuda-graph: the training step could not be captured: ") + e.what() +
                               "\n(train without --cuda-graph to run every step eagerly)");
    }
    return true;
  }
  bool captured() const { return graph_.captured(); }

 private:
  std::function<void()> step_;
  int eager_steps_;
  int calls_ = 0;
  kiln::cuda::Graph graph_;
};

}  // namespace ex
