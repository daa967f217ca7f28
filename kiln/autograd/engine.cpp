// The backward engine: dependency counts over the graph reachable from the roots, then a ready queue
// ordered by creation (latest first); gradients for a node's inputs are summed in a buffer until its
// last producer has run. A ready node that can add into a gradient sum (Node::accepts_gradient_buffers) waits
// while other nodes are ready, until the other producers of its inputs' gradients have run, so that it finds their
// sum begun whichever order the forward pass made the branches in (a residual block's convolution and shortcut).
#include "kiln/autograd/engine.h"

#include <algorithm>
#include <queue>
#include <unordered_map>

#include "kiln/autograd/autocast.h"
#include "kiln/autograd/autograd_meta.h"
#include "kiln/tensor/internal_ops.h"
#include "kiln/tensor/trace.h"  // a range per backward node

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

// Brings a gradient that `producer` computed to the shape, dtype and device that input `input_nr` of `receiver`
// expects: the input's own dtype, or the other one the receiver accepts there (Node::accepted_gradient_dtype).
Tensor validate_gradient(Tensor g, const Node& receiver, uint32_t input_nr, const Node& producer, size_t index) {
  const InputMeta& meta = receiver.input_meta(input_nr);
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
    if (receiver.accepted_gradient_dtype(input_nr) != g.dtype()) g = internal::cast(g, meta.dtype);
  }
  return g;
}

struct ReadyEntry {
  uint64_t sequence_nr;
  int32_t slot;
  bool operator<(const ReadyEntry& o) const { return sequence_nr < o.sequence_nr; }
};

// One run of backward. Every node reachable from the root gets a slot (an index into the task's
// vectors), written into the node itself so that no hash map is needed; a nested task (checkpoint
// recomputation) may reuse nodes, so each task restores the slots it overwrote when it ends.
// Captures (autograd::grad) take the gradient arriving at given node inputs instead of running the
// nodes that only lead to them.
class GraphTask {
 public:
  explicit GraphTask(bool keep_graph) : keep_graph_(keep_graph) {}
  ~GraphTask() {
    for (size_t i = nodes_.size(); i-- > 0;) nodes_[i]->engine_slot() = old_slots_[i];
  }
  GraphTask(const GraphTask&) = delete;
  GraphTask& operator=(const GraphTask&) = delete;

  // The task owns the captured node: a leaf's AccumulateGrad that is not in the graph yet is held by nobody
  // else (the leaf holds it weakly).
  void add_capture(const Edge& e, size_t index) { captures_.push_back({e.fn, e.input_nr, index}); }

  // Runs everything reachable from root; with captures, only what leads to a captured input.
  void execute(const std::shared_ptr<Node>& root, size_t num_captures) {
    discover(root.get());
    const bool prune = !captures_.empty();
    std::vector<std::vector<std::pair<uint32_t, size_t>>> capture_at;
    if (prune) {
      capture_at.resize(nodes_.size());
      for (const Capture& c : captures_) {
        const int32_t s = slot_of(c.node.get());
        if (s >= 0) capture_at[static_cast<size_t>(s)].push_back({c.input_nr, c.index});
      }
      mark_needed(capture_at);
    }
    captured_.resize(num_captures);

    std::priority_queue<ReadyEntry> ready;
    std::vector<ReadyEntry> waiting;  // ready nodes that wait for other producers of their inputs' sums
    ready.push({root->sequence_nr(), 0});
    while (!ready.empty() || !waiting.empty()) {
      // Those waiting whose inputs' other producers have all run go back to the queue.
      for (size_t i = 0; i < waiting.size();) {
        if (waits_for_others(*nodes_[static_cast<size_t>(waiting[i].slot)])) {
          ++i;
        } else {
          ready.push(waiting[i]);
          waiting[i] = waiting.back();
          waiting.pop_back();
        }
      }
      int32_t slot;
      if (!ready.empty()) {
        slot = ready.top().slot;
        ready.pop();
        if (waits_for_others(*nodes_[static_cast<size_t>(slot)]) && (!ready.empty() || !waiting.empty())) {
          waiting.push_back({nodes_[static_cast<size_t>(slot)]->sequence_nr(), slot});
          continue;
        }
      } else {  // only waiting nodes are left (the producers they wait for never run): the latest goes first
        const auto latest = std::max_element(waiting.begin(), waiting.end());
        slot = latest->slot;
        *latest = waiting.back();
        waiting.pop_back();
      }
      Node* node = nodes_[static_cast<size_t>(slot)];
      flush_pending(static_cast<size_t>(slot));
      TensorList grads = std::move(buffers_[static_cast<size_t>(slot)]);
      grads.resize(node->num_inputs());
      if (node->has_pre_hooks()) node->run_pre_hooks(grads);
      if (prune) {
        for (auto [input_nr, index] : capture_at[static_cast<size_t>(slot)]) {
          // In the input's own dtype, also where the node accepts another (Node::accepted_gradient_dtype).
          const Tensor& g = grads[input_nr];
          const DType dtype = node->input_meta(input_nr).dtype;
          captured_[index] = g.defined() && g.dtype() != dtype ? internal::cast(g, dtype) : g;
        }
        if (!needed_[static_cast<size_t>(slot)]) continue;
      }

      const bool offers = node->accepts_gradient_buffers();
      if (offers) offer_buffers(*node);
      TensorList outputs;
      if (trace::active()) {
        Device device = Device::cpu();  // where this node's gradient work runs: its first gradient's device
        for (const Tensor& g : grads)
          if (g.defined()) {
            device = g.device();
            break;
          }
        trace::Scope range(trace::Kind::Backward, node->name(), device);
        outputs = node->apply(std::move(grads));
      } else {
        outputs = node->apply(std::move(grads));
      }
      if (!keep_graph_) node->release_saved();
      TensorList offered;
      if (offers) offered = std::move(node->offered_buffers());
      node->offered_buffers().clear();
      const auto& edges = node->next_edges();
      KILN_CHECK(outputs.size() == edges.size() || (outputs.empty() && edges.empty()), node->name(), " returned ",
                 outputs.size(), " gradients for ", edges.size(), " inputs");
      for (size_t i = 0; i < edges.size(); ++i) {
        const Edge& e = edges[i];
        if (!e.valid()) continue;
        Node* next = e.fn.get();
        const auto next_slot = static_cast<size_t>(next->engine_slot());
        if (i < offered.size() && offered[i].defined()) {
          // The buffer goes back: the node's gradient already added into it, or to have that added now.
          Tensor& acc = buffers_[next_slot][e.input_nr];
          const bool added_in_place = outputs[i].defined() && outputs[i].impl_ptr() == offered[i].impl_ptr();
          acc = std::move(offered[i]);
          if (added_in_place) outputs[i] = Tensor();
        }
        if (outputs[i].defined()) {
          Tensor g = validate_gradient(std::move(outputs[i]), *next, e.input_nr, *node, i);
          add_to_buffer(next_slot, next->num_inputs(), e.input_nr, std::move(g));
        }
        --producers_[input_offsets_[next_slot] + e.input_nr];
        if (--dependencies_[next_slot] == 0) ready.push({next->sequence_nr(), static_cast<int32_t>(next_slot)});
      }
    }
  }

  TensorList& captured() { return captured_; }

 private:
  struct Capture {
    std::shared_ptr<Node> node;
    uint32_t input_nr;
    size_t index;
  };

  // Gradients for one node input are summed as they arrive. On a GPU, small ones are collected first and
  // summed by one add_n kernel when the node is about to run (or when kMaxPending have gathered): a leaf
  // used by a thousand small ops then costs a few kernel launches instead of a thousand, while large
  // gradients, where the arithmetic dominates, are added at once so that memory stays bounded. On the
  // CPU an addition of a small tensor costs less than collecting it, so they are added at once.
  static constexpr int64_t kDeferBytes = 64 * 1024;
  static constexpr size_t kMaxPending = 32;

  void add_to_buffer(size_t slot, size_t num_inputs, uint32_t input_nr, Tensor g) {
    TensorList& buf = buffers_[slot];
    if (buf.empty()) buf.resize(num_inputs);
    Tensor& acc = buf[input_nr];
    if (!acc.defined()) {
      acc = std::move(g);
      return;
    }
    if (g.dtype() != acc.dtype()) {
      // Gradients of one input in two dtypes (its node accepts a wider one than the input's own: some producers
      // computed it there, others did not): the sum takes the wider, with whatever waits to join it.
      if (auto p = pending_.find(slot); p != pending_.end() && p->second.size() > input_nr) {
        flush_one(acc, p->second[input_nr]);
      }
      acc = internal::add(acc, g);
      return;
    }
    if (g.is_cuda() && static_cast<int64_t>(g.nbytes()) <= kDeferBytes) {
      auto& pending = pending_[slot];
      if (pending.empty()) pending.resize(num_inputs);
      TensorList& list = pending[input_nr];
      list.push_back(std::move(g));
      if (list.size() >= kMaxPending) flush_one(acc, list);
      return;
    }
    if (exclusively_owned(acc)) {
      internal::add_(acc, g);
    } else {  // the gradient already there is shared (e.g. with another node's buffer): out of place
      acc = internal::add(acc, g);
    }
  }

  // Hands `node` the gradient sums it may add into (Node::offered_buffers): those of its inputs' slots that are
  // defined, exclusively owned and have no small gradients waiting to join them. Each is moved out of its buffer (so
  // that it stays exclusively owned) and put back after apply(); a slot two edges share is offered once.
  void offer_buffers(Node& node) {
    const auto& edges = node.next_edges();
    TensorList& offered = node.offered_buffers();
    offered.assign(edges.size(), Tensor());
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid()) continue;
      const int32_t s = slot_of(e.fn.get());
      if (s < 0) continue;
      TensorList& buf = buffers_[static_cast<size_t>(s)];
      if (buf.size() <= e.input_nr || !buf[e.input_nr].defined() || !exclusively_owned(buf[e.input_nr])) continue;
      if (auto p = pending_.find(static_cast<size_t>(s));
          p != pending_.end() && p->second.size() > e.input_nr && !p->second[e.input_nr].empty())
        continue;
      offered[i] = std::move(buf[e.input_nr]);
    }
  }

  // Whether `node` can add into gradient sums and one of its inputs' sums still has producers other than `node`
  // that have not run (the node then runs after them, where other nodes can run meanwhile).
  bool waits_for_others(const Node& node) const {
    if (!node.accepts_gradient_buffers()) return false;
    const auto& edges = node.next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid()) continue;
      int own = 0;  // this node's edges into the same sum
      for (const Edge& f : edges) own += f.valid() && f.fn == e.fn && f.input_nr == e.input_nr ? 1 : 0;
      const auto s = static_cast<size_t>(e.fn->engine_slot());
      if (producers_[input_offsets_[s] + e.input_nr] > own) return true;
    }
    return false;
  }

  static void flush_one(Tensor& acc, TensorList& list) {
    if (list.empty()) return;
    list.push_back(acc);
    acc = internal::add_n(list);  // one kernel for all of them
    list.clear();
  }

  void flush_pending(size_t slot) {
    auto it = pending_.find(slot);
    if (it == pending_.end()) return;
    TensorList& buf = buffers_[slot];
    for (size_t i = 0; i < it->second.size(); ++i) flush_one(buf[i], it->second[i]);
    pending_.erase(it);
  }

  int32_t slot_of(Node* n) {
    const int32_t s = n->engine_slot();
    return s >= 0 && static_cast<size_t>(s) < nodes_.size() && nodes_[static_cast<size_t>(s)] == n ? s : -1;
  }

  int32_t add_node(Node* n) {
    old_slots_.push_back(n->engine_slot());
    n->engine_slot() = static_cast<int32_t>(nodes_.size());
    nodes_.push_back(n);
    return n->engine_slot();
  }

  // Slots for every node reachable from root (root gets 0), their dependency counts, and the producers of each
  // input's gradient not yet run.
  void discover(Node* root) {
    add_node(root);
    dependencies_.push_back(0);
    for (size_t i = 0; i < nodes_.size(); ++i) {  // breadth-first: nodes_ grows as we go
      for (const Edge& e : nodes_[i]->next_edges()) {
        if (!e.valid()) continue;
        int32_t s = slot_of(e.fn.get());
        if (s < 0) {
          s = add_node(e.fn.get());
          dependencies_.push_back(0);
        }
        ++dependencies_[static_cast<size_t>(s)];
      }
    }
    buffers_.resize(nodes_.size());
    input_offsets_.resize(nodes_.size() + 1);
    input_offsets_[0] = 0;
    for (size_t i = 0; i < nodes_.size(); ++i) input_offsets_[i + 1] = input_offsets_[i] + nodes_[i]->num_inputs();
    producers_.assign(input_offsets_.back(), 0);
    for (Node* n : nodes_) {
      for (const Edge& e : n->next_edges()) {
        if (e.valid()) ++producers_[input_offsets_[static_cast<size_t>(e.fn->engine_slot())] + e.input_nr];
      }
    }
  }

  // needed_[s]: node s must run because a captured input lies below it. Children always have larger
  // slots than a parent that discovered them, but a node reached from several parents may have a
  // smaller slot than one of them, so iterate to a fixed point (graphs are shallow in this respect).
  void mark_needed(const std::vector<std::vector<std::pair<uint32_t, size_t>>>& capture_at) {
    needed_.assign(nodes_.size(), 0);
    bool changed = true;
    while (changed) {
      changed = false;
      for (size_t i = nodes_.size(); i-- > 0;) {
        if (needed_[i]) continue;
        for (const Edge& e : nodes_[i]->next_edges()) {
          if (!e.valid()) continue;
          const auto c = static_cast<size_t>(e.fn->engine_slot());
          if (!capture_at[c].empty() || needed_[c]) {
            needed_[i] = 1;
            changed = true;
            break;
          }
        }
      }
    }
  }

  bool keep_graph_;
  std::vector<Node*> nodes_;
  std::vector<int32_t> old_slots_;
  std::vector<int> dependencies_;
  std::vector<size_t> input_offsets_;  // node slot -> its inputs' first index in producers_
  std::vector<int> producers_;         // per node input: the edges into it whose node has not run
  std::vector<TensorList> buffers_;
  std::unordered_map<size_t, std::vector<TensorList>> pending_;  // slot -> per input, gradients not yet summed
  std::vector<Capture> captures_;
  std::vector<char> needed_;
  TensorList captured_;
};

// The root node for `outputs`, with their gradients (ones for one-element outputs when not given).
std::shared_ptr<Node> make_root(const TensorList& outputs, const TensorList& grad_outputs, std::string_view api) {
  KILN_CHECK(!outputs.empty(), api, ": no outputs to differentiate");
  KILN_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), api, ": ", outputs.size(), " outputs but ",
             grad_outputs.size(), " gradients; give one gradient per output (or none)");
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
      g = internal::ones_like(out);
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

// The callbacks of queue_callback, per thread; they run when the outermost backward's graph is done.
thread_local int backward_depth = 0;
thread_local std::vector<std::function<void()>> end_callbacks;

// Counts a running backward; the outermost one runs the queued callbacks once its graph has finished
// (run_callbacks), and drops them when the graph failed.
class BackwardScope {
 public:
  BackwardScope() { ++backward_depth; }
  ~BackwardScope() {
    if (--backward_depth == 0) end_callbacks.clear();
  }
  BackwardScope(const BackwardScope&) = delete;
  BackwardScope& operator=(const BackwardScope&) = delete;
  void run_callbacks() {
    if (backward_depth != 1) return;
    // Callbacks may queue more; each runs once, in order.
    for (size_t i = 0; i < end_callbacks.size(); ++i) {
      std::function<void()> fn = std::move(end_callbacks[i]);
      fn();
    }
    end_callbacks.clear();
  }
};

}  // namespace

void backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph) {
  auto root = make_root(outputs, grad_outputs, "backward");
  BackwardScope scope;
  BackwardModes modes;
  GraphTask task(retain_graph);
  task.execute(root, 0);
  scope.run_callbacks();
}

void queue_callback(std::function<void()> fn) {
  KILN_CHECK(backward_depth > 0, "autograd::queue_callback: no backward is running on this thread; queue ",
             "callbacks from hooks or nodes that run during backward");
  KILN_CHECK(fn != nullptr, "autograd::queue_callback: the callback is empty");
  end_callbacks.push_back(std::move(fn));
}

bool in_backward() { return backward_depth > 0; }

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs, bool retain_graph,
                bool allow_unused) {
  auto root = make_root(outputs, grad_outputs, "autograd::grad");
  KILN_CHECK(!inputs.empty(), "autograd::grad: no inputs given to differentiate with respect to");
  BackwardScope scope;
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
    scope.run_callbacks();
  }
  TensorList result = std::move(task.captured());
  for (size_t i = 0; i < result.size(); ++i) {
    KILN_CHECK(result[i].defined() || allow_unused, "autograd::grad: input ", i, " (shape ", inputs[i].shape(),
               ") was not used to compute the outputs; pass allow_unused=true to get an undefined gradient for it");
  }
  return result;
}

}  // namespace kiln::autograd
