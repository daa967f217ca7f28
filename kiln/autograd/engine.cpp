// The backward engine: dependency counts over the graph reachable from the roots, then a ready queue
// ordered by creation (latest first); gradients for a node's inputs are summed in a buffer until its
// last producer has run.
#include "kiln/autograd/engine.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "kiln/autograd/autocast.h"
#include "kiln/autograd/autograd_meta.h"
#include "kiln/tensor/ops.h"

namespace kiln::autograd {
namespace {

// The start of a graph task: hands the root gradients to the roots' nodes.
class GraphRoot final : public Node {
 public:
  explicit GraphRoot(TensorList grads) : Node(UINT64_MAX), grads_(std::move(grads)) {}
  std::string_view name() const override { return "GraphRoot"; }
  TensorList apply(TensorList&&) override { return std::move(grads_); }

 private:
  TensorList grads_;
};

// Brings a gradient that `producer` computed to the shape, dtype and device the receiving input expects.
Tensor validate_gradient(Tensor g, const InputMeta& meta, const Node& producer, size_t index) {
  if (g.shape() != meta.shape) {
    bool reducible = g.dim() >= static_cast<int64_t>(meta.shape.size());
    const int64_t lead = g.dim() - static_cast<int64_t>(meta.shape.size());
    for (size_t i = 0; reducible && i < meta.shape.size(); ++i) {
      reducible = meta.shape[i] == 1 || meta.shape[i] == g.size(lead + static_cast<int64_t>(i));
    }
    KILN_CHECK(reducible, producer.name(), " returned a gradient of shape ", g.shape(), " for its input ", index,
               ", which has shape ", meta.shape, "; a backward function must return one gradient per input, of ",
               "that input's shape (or a shape it broadcasts to)");
    g = sum_to(g, meta.shape);
  }
  KILN_CHECK(g.device() == meta.device, producer.name(), " returned a gradient on ", g.device(), " for its input ",
             index, ", which is on ", meta.device);
  if (g.dtype() != meta.dtype) {
    KILN_CHECK(is_floating_point(g.dtype()), producer.name(), " returned a ", g.dtype(), " gradient for its input ",
               index, " (", meta.dtype, "); gradients must be floating-point");
    g = ops::cast(g, meta.dtype);
  }
  return g;
}

struct ReadyEntry {
  uint64_t sequence_nr;
  Node* node;
  bool operator<(const ReadyEntry& o) const { return sequence_nr < o.sequence_nr; }
};

// One run of backward. Captures (autograd::grad) take the gradient arriving at given node inputs
// instead of running the nodes that only lead to them.
class GraphTask {
 public:
  GraphTask(bool keep_graph) : keep_graph_(keep_graph) {}

  void add_capture(const Edge& e, size_t index) { captures_[e.fn.get()].push_back({e.input_nr, index}); }

  // Runs everything reachable from root; with captures, only what leads to a captured input.
  void execute(const std::shared_ptr<Node>& root, size_t num_captures) {
    count_dependencies(root.get());
    const bool prune = !captures_.empty();
    if (prune) mark_needed(root.get());
    captured_.resize(num_captures);

    std::priority_queue<ReadyEntry> ready;
    ready.push({root->sequence_nr(), root.get()});
    while (!ready.empty()) {
      Node* node = ready.top().node;
      ready.pop();
      TensorList grads;
      if (auto it = buffers_.find(node); it != buffers_.end()) {
        grads = std::move(it->second);
        buffers_.erase(it);
      }
      grads.resize(node->num_inputs());
      if (node->has_pre_hooks()) node->run_pre_hooks(grads);
      if (auto it = captures_.find(node); it != captures_.end()) {
        for (auto [input_nr, index] : it->second) captured_[index] = grads[input_nr];
      }
      if (prune && !needed_.count(node)) continue;

      TensorList outputs = node->apply(std::move(grads));
      if (!keep_graph_) node->release_saved();
      const auto& edges = node->next_edges();
      KILN_CHECK(outputs.size() == edges.size() || (outputs.empty() && edges.empty()), node->name(), " returned ",
                 outputs.size(), " gradients for ", edges.size(), " inputs");
      for (size_t i = 0; i < edges.size(); ++i) {
        const Edge& e = edges[i];
        if (!e.valid()) continue;
        Node* next = e.fn.get();
        if (outputs[i].defined()) {
          Tensor g = validate_gradient(std::move(outputs[i]), next->input_meta(e.input_nr), *node, i);
          TensorList& buf = buffers_[next];
          if (buf.empty()) buf.resize(next->num_inputs());
          Tensor& slot = buf[e.input_nr];
          // Out of place: the gradient already there may be shared with another node's buffer.
          slot = slot.defined() ? ops::add(slot, g) : std::move(g);
        }
        if (--dependencies_[next] == 0) ready.push({next->sequence_nr(), next});
      }
    }
  }

  TensorList& captured() { return captured_; }

 private:
  void count_dependencies(Node* root) {
    std::vector<Node*> stack{root};
    std::unordered_set<Node*> seen{root};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next_edges()) {
        if (!e.valid()) continue;
        ++dependencies_[e.fn.get()];
        if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
      }
    }
  }

  // needed_: nodes that must run because a captured input lies below them.
  void mark_needed(Node* root) {
    // Iterative post-order: a node is needed when one of its children is captured or needed.
    std::unordered_map<Node*, bool> done;
    std::vector<std::pair<Node*, size_t>> stack{{root, 0}};
    done[root] = false;
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      const auto& edges = n->next_edges();
      if (next < edges.size()) {
        Node* child = edges[next++].fn.get();
        if (child != nullptr && !done.count(child)) {
          done[child] = false;
          stack.push_back({child, 0});
        }
        continue;
      }
      bool need = false;
      for (const Edge& e : edges) {
        if (e.valid() && (captures_.count(e.fn.get()) || needed_.count(e.fn.get()))) need = true;
      }
      if (need) needed_.insert(n);
      done[n] = true;
      stack.pop_back();
    }
  }

  bool keep_graph_;
  std::unordered_map<Node*, int> dependencies_;
  std::unordered_map<Node*, TensorList> buffers_;
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> captures_;
  std::unordered_set<Node*> needed_;
  TensorList captured_;
};

// The root node for `outputs`, with their gradients (ones for one-element outputs when not given).
std::shared_ptr<Node> make_root(const TensorList& outputs, const TensorList& grad_outputs, std::string_view api) {
  KILN_CHECK(!outputs.empty(), api, ": no outputs to differentiate");
  KILN_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), api, ": ", outputs.size(),
             " outputs but ", grad_outputs.size(), " gradients; give one gradient per output (or none)");
  TensorList grads;
  std::vector<Edge> edges;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    KILN_CHECK(out.defined(), api, ": output ", i, " is undefined");
    Edge e = gradient_edge(out);
    KILN_CHECK(e.valid(), api, ": output ", i, " (shape ", out.shape(), ") does not require grad and has no grad_fn; ",
               "nothing leads from it to a tensor that requires grad. Call requires_grad_() on the parameters ",
               "before the forward pass, and do not compute it under NoGradGuard");
    Tensor g = grad_outputs.empty() ? Tensor() : grad_outputs[i];
    if (!g.defined()) {
      KILN_CHECK(out.numel() == 1, api, ": output ", i, " has shape ", out.shape(), "; a gradient can be implied only ",
                 "for one-element outputs (it is 1 then). Pass the gradient of the output, e.g. ",
                 "y.backward(ones_like(y)), or reduce it first (y.sum().backward())");
      g = ops::ones_like(out);
    } else {
      KILN_CHECK(g.shape() == out.shape(), api, ": the gradient for output ", i, " has shape ", g.shape(),
                 " but the output has shape ", out.shape());
      KILN_CHECK(g.device() == out.device(), api, ": the gradient for output ", i, " is on ", g.device(),
                 " but the output is on ", out.device());
    }
    grads.push_back(std::move(g));
    edges.push_back(std::move(e));
  }
  auto root = std::make_shared<GraphRoot>(std::move(grads));
  root->mutable_next_edges() = std::move(edges);
  return root;
}

// Backward runs without recording and without autocast, whatever the caller's modes.
struct BackwardModes {
  AutoGradMode no_grad{false};
  autocast::DisableGuard no_autocast;
};

}  // namespace

void backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph) {
  auto root = make_root(outputs, grad_outputs, "backward");
  BackwardModes modes;
  GraphTask task(retain_graph);
  task.execute(root, 0);
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                bool retain_graph, bool allow_unused) {
  auto root = make_root(outputs, grad_outputs, "autograd::grad");
  KILN_CHECK(!inputs.empty(), "autograd::grad: no inputs given to differentiate with respect to");
  GraphTask task(retain_graph);
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(inputs[i].defined(), "autograd::grad: input ", i, " is undefined");
    Edge e = gradient_edge(inputs[i]);
    KILN_CHECK(e.valid(), "autograd::grad: input ", i, " (shape ", inputs[i].shape(), ") does not require grad; ",
               "call requires_grad_() on it before the forward pass");
    task.add_capture(e, i);
  }
  {
    BackwardModes modes;
    task.execute(root, inputs.size());
  }
  TensorList result = std::move(task.captured());
  for (size_t i = 0; i < result.size(); ++i) {
    KILN_CHECK(result[i].defined() || allow_unused, "autograd::grad: input ", i, " (shape ", inputs[i].shape(),
               ") was not used to compute the outputs; pass allow_unused=true to get an undefined gradient for it");
  }
  return result;
}

}  // namespace kiln::autograd
