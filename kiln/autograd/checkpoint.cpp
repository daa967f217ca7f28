// checkpoint(): forward keeps the inputs and the random-generator states; CheckpointBackward reruns fn
// with recording on and runs a nested backward through the recomputed part of the graph.
#include "kiln/autograd/checkpoint.h"

#include <utility>

#include "kiln/autograd/autocast.h"  // the autocast state of forward, replayed by the recomputation
#include "kiln/autograd/engine.h"
#include "kiln/tensor/generator.h"

namespace kiln::autograd {
namespace {

// The default generators a recomputation must replay: the CPU's and those of the inputs' GPUs.
struct RngStates {
  std::vector<std::pair<Device, GeneratorState>> states;

  static RngStates capture(const TensorList& inputs) {
    RngStates r;
    r.add(Device::cpu());
    for (const Tensor& t : inputs) {
      if (t.defined() && t.is_cuda()) r.add(t.device());
    }
    return r;
  }
  void add(Device d) {
    for (auto& [dev, st] : states) {
      if (dev == d) return;
    }
    states.emplace_back(d, default_generator(d).state());
  }
  void restore() const {
    for (const auto& [dev, st] : states) default_generator(dev).set_state(st);
  }
};

thread_local int t_recomputing = 0;  // checkpoint recomputations running on this thread (they nest)

class CheckpointBackward final : public Node {
 public:
  std::function<TensorList(const TensorList&)> fn;
  std::vector<SavedTensor> inputs;
  std::vector<bool> input_requires_grad;
  RngStates rng;
  autocast::detail::State autocast_state;  // forward's: backward runs with autocast off

  std::string_view name() const override { return "CheckpointBackward"; }

  TensorList apply(TensorList&& grads) override {
    // Recompute with the generators as they were in forward; leave them as backward found them.
    TensorList detached;
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor t = inputs[i].unpack(*this);
      if (t.defined()) {
        t = t.detach();
        if (input_requires_grad[i]) t.requires_grad_(true);
      }
      detached.push_back(std::move(t));
    }
    RngStates now = rng;
    for (auto& [dev, st] : now.states) st = default_generator(dev).state();
    rng.restore();
    TensorList outs;
    {
      // The recomputation must give forward's values: the same generators, and the same autocast dtypes (the
      // engine turns autocast off during backward).
      EnableGradGuard grad_on;
      const autocast::detail::State backward_state = autocast::detail::state;
      autocast::detail::state = autocast_state;
      ++t_recomputing;  // layers with side effects (BatchNorm's running statistics) do them once, in forward
      try {
        outs = fn(detached);
      } catch (...) {
        --t_recomputing;
        autocast::detail::state = backward_state;
        throw;
      }
      --t_recomputing;
      autocast::detail::state = backward_state;
    }
    now.restore();

    TensorList roots, root_grads;
    for (size_t i = 0; i < outs.size() && i < grads.size(); ++i) {
      if (outs[i].defined() && outs[i].requires_grad() && grads[i].defined()) {
        roots.push_back(outs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    if (!roots.empty()) backward(roots, root_grads);
    TensorList result;
    for (size_t i = 0; i < detached.size(); ++i) {
      result.push_back(input_requires_grad[i] ? detached[i].grad() : Tensor());
    }
    return result;
  }

  void release_saved() override {
    for (auto& s : inputs) s.reset();
    fn = nullptr;
  }
};

}  // namespace

bool in_recomputation() { return t_recomputing > 0; }

TensorList checkpoint(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs) {
  KILN_CHECK(fn != nullptr, "checkpoint: fn is empty");
  if (!GradMode::is_enabled()) return fn(inputs);

  auto node = std::make_shared<CheckpointBackward>();
  node->rng = RngStates::capture(inputs);
  node->autocast_state = autocast::detail::state;
  // Forward runs with recording on, so that it is known which outputs depend on tensors that require
  // grad (inputs, or parameters fn captures); that graph is dropped as soon as fn returns, so memory
  // holds at most one checkpointed segment's activations at a time, as during the recomputation.
  TensorList outs = fn(inputs);

  bool any_requires = false;
  for (const Tensor& o : outs) any_requires = any_requires || (o.defined() && o.requires_grad());
  if (!any_requires) return outs;

  for (const Tensor& t : inputs) {
    node->mutable_next_edges().push_back(gradient_edge(t));
    node->input_requires_grad.push_back(requires_grad(t));
    node->inputs.emplace_back(t, /*is_output=*/false);
  }
  node->fn = fn;
  TensorList result;
  for (const Tensor& o : outs) {
    if (!o.defined() || !o.requires_grad()) {
      result.push_back(o);
      continue;
    }
    Tensor r = o.detach();
    set_history(r, node);
    result.push_back(std::move(r));
  }
  return result;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  KILN_CHECK(fn != nullptr, "checkpoint: fn is empty");
  return checkpoint([fn](const TensorList& in) { return TensorList{fn(in[0])}; }, TensorList{input})[0];
}

}  // namespace kiln::autograd
