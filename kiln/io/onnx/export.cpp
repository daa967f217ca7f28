// kiln/io/onnx/export.cpp — io::export_onnx: traces the forward (twice with dynamic axes), checks that every op that
// read the inputs was recorded, translates the records into a Graph (ops.cpp) and writes it (writer.cpp).
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "kiln/autograd/autocast.h"
#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/io/onnx/graph.h"
#include "kiln/io/onnx/ops.h"
#include "kiln/io/onnx_export.h"
#include "kiln/tensor/capture.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/trace.h"
#include "kiln/version.h"

namespace kiln::io {
namespace {

using onnx::Builder;
using onnx::DynamicDim;
using onnx::Graph;
using onnx::ValueInfo;

const void* key(const Tensor& t) { return t.impl_ptr().get(); }
const void* storage_key(const Tensor& t) { return t.impl().storage().get(); }

// One run of the forward: what it recorded, in which module each record was made, and the first op that read a
// recorded value without a record of its own.
struct Trace {
  std::vector<Tensor> inputs, outputs;
  std::vector<capture::OpRecord> records;
  std::vector<std::string> modules;  // per record: the dotted path of the innermost module ("" the model itself)
  std::string unrecorded;            // an error message, or empty
  // The memory of the inputs and of every value computed from them (what a view of one shares).
  std::unordered_set<const void*> derived_storages;
};

// Receives the records (capture::Recorder) and watches every backend op and module call (trace::Listener) on the
// exporting thread.
class Tracer final : public capture::Recorder, public trace::Listener {
 public:
  Tracer(Trace& trace, const std::unordered_map<const void*, std::string>& paths)
      : trace_(trace), paths_(paths), thread_(std::this_thread::get_id()) {
    for (const Tensor& t : trace.inputs) trace.derived_storages.insert(storage_key(t));
  }

  // A record's results are computed from the inputs when one of its tensor inputs is (a factory's are not: a size
  // it took from an input is a dynamic axis, which the second trace finds).
  void record(capture::OpRecord&& op) override {
    const bool derived =
        std::any_of(op.inputs.begin(), op.inputs.end(), [&](const Tensor& t) { return t.defined() && is_derived(t); });
    for (const Tensor& t : op.outputs) {
      if (derived && t.defined()) trace_.derived_storages.insert(storage_key(t));
    }
    trace_.modules.push_back(current_module());
    trace_.records.push_back(std::move(op));
  }

  void begin(const trace::Range& range) override {
    if (std::this_thread::get_id() != thread_) return;
    if (range.kind == trace::Kind::Module) {
      modules_.push_back(range.object);
      return;
    }
    if (range.kind != trace::Kind::Op || capture::depth() != 0 || !trace_.unrecorded.empty()) return;
    for (const Tensor* t : range.tensors) {
      if (t != nullptr && t->defined() && is_derived(*t)) {
        trace_.unrecorded = "export_onnx: the op '" + std::string(range.name) + "' " + where(current_module()) +
                            " works on a value computed from the inputs, but it was not called through a kiln op "
                            "that export_onnx can translate (an internal op, an in-place write, or a kiln op "
                            "without an ONNX form); write that step with kiln's public ops (kiln::, nn::)";
        return;
      }
    }
  }

  void end(const trace::Range& range) override {
    if (std::this_thread::get_id() != thread_) return;
    if (range.kind == trace::Kind::Module && !modules_.empty()) modules_.pop_back();
  }

  static std::string where(const std::string& module) {
    return module.empty() ? "in the model's own forward" : "in module " + module;
  }

 private:
  bool is_derived(const Tensor& t) const { return trace_.derived_storages.count(storage_key(t)) != 0; }
  std::string current_module() const {
    for (auto it = modules_.rbegin(); it != modules_.rend(); ++it) {
      auto p = paths_.find(*it);
      if (p != paths_.end()) return p->second;
    }
    return "";
  }

  Trace& trace_;
  const std::unordered_map<const void*, std::string>& paths_;
  std::thread::id thread_;
  std::vector<const void*> modules_;
};

Trace run_trace(const OnnxForward& forward, const std::vector<Tensor>& inputs,
                const std::unordered_map<const void*, std::string>& paths) {
  Trace trace;
  trace.inputs = inputs;
  auto tracer = std::make_shared<Tracer>(trace, paths);
  trace::add_listener(tracer);
  try {
    capture::Session session(*tracer);
    trace.outputs = forward(inputs);
  } catch (...) {
    trace::remove_listener(tracer);
    throw;
  }
  trace::remove_listener(tracer);
  return trace;
}

// The second trace's inputs: each dynamic axis resized (smaller where it can be, else larger, by a different
// amount per label so that no two labels' sizes coincide), by repeating the example's entries.
std::vector<Tensor> resized_inputs(const std::vector<Tensor>& inputs, const std::vector<std::string>& names,
                                   const OnnxExportOptions& options, std::vector<DynamicDim>& dynamic) {
  std::map<std::string, std::pair<int64_t, int64_t>> sizes;  // label -> (first, second)
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto it = options.dynamic_axes.find(names[i]);
    if (it == options.dynamic_axes.end()) continue;
    for (const auto& [axis_in, label] : it->second) {
      const int64_t rank = inputs[i].dim();
      KILN_CHECK(axis_in >= -rank && axis_in < rank, "export_onnx: dynamic axis ", axis_in, " of input '", names[i],
                 "' does not exist: it has shape ", inputs[i].shape());
      KILN_CHECK(!label.empty(), "export_onnx: dynamic axis ", axis_in, " of input '", names[i], "' has no label");
      const int64_t axis = axis_in < 0 ? axis_in + rank : axis_in;
      const int64_t size = inputs[i].size(axis);
      auto [entry, fresh] = sizes.try_emplace(label, size, 0);
      KILN_CHECK(fresh || entry->second.first == size, "export_onnx: the dynamic axis '", label, "' has size ",
                 entry->second.first, " in one input and ", size, " in input '", names[i], "' (axis ", axis,
                 "); inputs that share a label must share its size");
      KILN_CHECK(size > 0, "export_onnx: dynamic axis '", label, "' has size 0 in the example inputs");
      dynamic.push_back({names[i], axis, size, 0, label});
    }
  }
  int64_t step = 1;
  for (auto& [label, s] : sizes) {
    s.second = s.first > step + 1 ? s.first - step : s.first + step;
    ++step;
  }
  for (auto& d : dynamic) d.b = sizes[d.label].second;
  std::vector<Tensor> out = inputs;
  for (const DynamicDim& d : dynamic) {
    const size_t i = static_cast<size_t>(std::find(names.begin(), names.end(), d.input) - names.begin());
    if (out[i].size(d.axis) == d.b) continue;
    std::vector<int64_t> rows(static_cast<size_t>(d.b));
    for (int64_t j = 0; j < d.b; ++j) rows[static_cast<size_t>(j)] = j % d.a;
    const Tensor index = from_vector(rows, {d.b}).to(out[i].device());
    out[i] = index_select(out[i], d.axis, index);
  }
  return out;
}

// Each batch norm whose input is a convolution's output that nothing else reads (fold_batch_norm).
onnx::Folding find_foldings(const Trace& trace) {
  onnx::Folding folding;
  std::unordered_map<const void*, size_t> producer;
  std::unordered_map<const void*, int> uses;
  for (size_t i = 0; i < trace.records.size(); ++i) {
    for (const Tensor& t : trace.records[i].inputs) {
      if (t.defined()) ++uses[key(t)];
    }
  }
  for (const Tensor& t : trace.outputs) ++uses[key(t)];
  for (size_t i = 0; i < trace.records.size(); ++i) {
    const auto& r = trace.records[i];
    if (r.op == "conv2d") producer[key(r.outputs[0])] = i;
    const bool norm = r.op == "batch_norm" || r.op == "batch_norm_relu" || r.op == "batch_norm_add_relu";
    if (!norm || !r.inputs[1].defined() || !r.inputs[2].defined()) continue;
    auto p = producer.find(key(r.inputs[0]));
    if (p == producer.end() || uses[key(r.inputs[0])] != 1) continue;
    folding.conv_to_norm[p->second] = i;
    folding.norm_to_conv[i] = p->second;
  }
  return folding;
}

std::vector<onnx::Dim> dims_of(const Tensor& a, const Tensor& b, const Builder& builder, const std::string& name) {
  std::vector<onnx::Dim> dims;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) == b.size(d)) {
      dims.emplace_back(a.size(d));
    } else if (auto label = builder.label_of(a.size(d), b.size(d))) {
      dims.emplace_back(*label);
    } else {
      dims.emplace_back(name + "_dim" + std::to_string(d));
    }
  }
  return dims;
}

}  // namespace

OnnxExportReport export_onnx(nn::Module& module, const OnnxForward& forward, const std::vector<Tensor>& example_inputs,
                             const std::string& path, const OnnxExportOptions& options) {
  KILN_CHECK(forward != nullptr, "export_onnx: the forward function is empty");
  KILN_CHECK(!example_inputs.empty(), "export_onnx: give at least one example input");
  OnnxExportReport report;
  std::vector<std::string> input_names;
  for (size_t i = 0; i < example_inputs.size(); ++i) {
    KILN_CHECK(example_inputs[i].defined(), "export_onnx: example input ", i, " is undefined");
    input_names.push_back(i < options.input_names.size() ? options.input_names[i] : "input_" + std::to_string(i));
    (void)onnx::onnx_type(example_inputs[i].dtype(), "input '" + input_names.back() + "'");
  }
  KILN_CHECK(options.input_names.size() <= example_inputs.size(), "export_onnx: ", options.input_names.size(),
             " input names for ", example_inputs.size(), " example inputs");
  for (const auto& [name, axes] : options.dynamic_axes) {
    KILN_CHECK(
        std::find(input_names.begin(), input_names.end(), name) != input_names.end(),
        "export_onnx: dynamic_axes names '", name, "', which is not an input (the inputs are named ",
        [&] {
          std::string s;
          for (const auto& n : input_names) s += (s.empty() ? "'" : ", '") + n + "'";
          return s;
        }(),
        ")");
  }
  {
    std::set<std::string> unique(input_names.begin(), input_names.end());
    KILN_CHECK(unique.size() == input_names.size(), "export_onnx: two inputs have the same name");
  }

  // Eval mode, no gradients, no autocast: the model as it serves. Each module's mode is restored afterwards.
  std::unordered_map<const void*, std::string> paths;
  std::vector<std::pair<nn::Module*, bool>> modes;
  for (auto& [name, m] : module.named_modules()) {
    paths[m.get()] = name;
    modes.emplace_back(m.get(), m->is_training());
  }
  if (module.is_training()) {
    report.warnings.push_back(
        "export_onnx: the module is in training mode; it is exported as in eval mode (dropout "
        "off, batch norm on its running statistics). Call eval() before exporting to silence "
        "this warning");
  }
  struct RestoreModes {
    std::vector<std::pair<nn::Module*, bool>>& modes;
    ~RestoreModes() {
      for (auto& [m, training] : modes) m->train(training);
    }
  } restore{modes};
  for (auto& [m, training] : modes) m->train(false);
  NoGradGuard no_grad;
  autocast::DisableGuard no_autocast;

  Trace first = run_trace(forward, example_inputs, paths);
  if (!first.unrecorded.empty()) KILN_FAIL(first.unrecorded);
  KILN_CHECK(!first.outputs.empty(), "export_onnx: the forward returned no tensors");
  std::vector<DynamicDim> dynamic;
  std::vector<Tensor> second_inputs = resized_inputs(example_inputs, input_names, options, dynamic);
  Trace second;
  if (dynamic.empty()) {
    second = first;
  } else {
    try {
      second = run_trace(forward, second_inputs, paths);
    } catch (const std::exception& e) {
      KILN_FAIL(
          "export_onnx: the forward failed when run again with the dynamic axes resized (to find which sizes "
          "follow them): ",
          e.what());
    }
    if (!second.unrecorded.empty()) KILN_FAIL(second.unrecorded);
    bool same = second.records.size() == first.records.size() && second.outputs.size() == first.outputs.size();
    for (size_t i = 0; same && i < first.records.size(); ++i) same = first.records[i].op == second.records[i].op;
    KILN_CHECK(same, "export_onnx: the forward ran other ops when the dynamic axes were resized (",
               first.records.size(), " ops, then ", second.records.size(),
               "): its control flow depends on the sizes, which one ONNX graph cannot follow; export without dynamic "
               "axes, or at the size you will serve");
  }

  Graph graph;
  graph.name = options.graph_name.empty() ? module.type_name() : options.graph_name;
  Builder builder(graph, dynamic);
  std::unordered_map<const void*, std::string> names;  // value (TensorImpl) -> its name in the graph
  for (size_t i = 0; i < example_inputs.size(); ++i) {
    names[key(example_inputs[i])] = input_names[i];
    (void)builder.fresh(input_names[i]);  // reserved
    graph.inputs.push_back(ValueInfo{input_names[i], example_inputs[i].dtype(),
                                     dims_of(example_inputs[i], second_inputs[i], builder, input_names[i])});
  }
  std::unordered_map<const void*, std::string> parameters;  // parameter or buffer -> its state_dict name
  std::vector<std::pair<std::string, Tensor>> state = module.named_parameters();
  for (auto& b : module.named_buffers()) state.push_back(b);
  for (const auto& [name, t] : state) {
    if (t.defined()) parameters.emplace(key(t), name);
  }
  // The graph's name for a tensor a record reads: a value, a parameter (an initializer under its state_dict name),
  // or a constant the forward made without reading the inputs.
  auto resolve = [&](const Tensor& a, const Tensor& b, const std::string& where) -> std::string {
    if (auto it = names.find(key(a)); it != names.end()) return it->second;
    if (auto it = parameters.find(key(a)); it != parameters.end()) {
      names[key(a)] = builder.initializer(it->second, a);
      return names[key(a)];
    }
    KILN_CHECK(first.derived_storages.count(storage_key(a)) == 0, "export_onnx: a tensor ", where,
               " shares memory with a value computed from the inputs but was not made by a kiln op that export_onnx "
               "records (a view taken through internal ops?); make it with kiln's public ops");
    KILN_CHECK(a.shape() == b.shape(), "export_onnx: a tensor ", where, " has shape ", a.shape(),
               " in the first trace and ", b.shape(),
               " with the dynamic axes resized, but it was not computed by a kiln op from the inputs, so its size "
               "cannot follow them; make it with kiln's ops (zeros, arange, ...) from sizes of the inputs");
    names[key(a)] = builder.initializer("constant", a);
    return names[key(a)];
  };

  const onnx::Folding folding = options.fold_batch_norm ? find_foldings(first) : onnx::Folding{};
  for (size_t i = 0; i < first.records.size(); ++i) {
    const capture::OpRecord& r = first.records[i];
    const capture::OpRecord& r2 = second.records[i];
    const std::string where = Tracer::where(first.modules[i]);
    const onnx::Translate translate = onnx::find_translation(r.op);
    KILN_CHECK(translate != nullptr, "export_onnx: the kiln op '", r.op, "' ", where,
               " has no ONNX translation; write that step with ops export_onnx supports (kiln/io/onnx_export.h)");
    std::vector<std::string> in;
    for (size_t k = 0; k < r.inputs.size(); ++k) {
      if (!r.inputs[k].defined()) {
        in.emplace_back();
        continue;
      }
      (void)onnx::onnx_type(r.inputs[k].dtype(), "an input of " + r.op + " " + where);
      in.push_back(resolve(r.inputs[k], r2.inputs[k], "read by " + r.op + " " + where));
    }
    builder.scope = (first.modules[i].empty() ? std::string() : first.modules[i] + "/") + r.op;
    onnx::OpContext ctx{builder, r, r2, std::move(in), report.warnings, where};
    if (auto f = folding.conv_to_norm.find(i); f != folding.conv_to_norm.end()) {
      ctx.folded_norm = &first.records[f->second];
    }
    ctx.folded_into_conv = folding.norm_to_conv.count(i) != 0;
    const std::vector<std::string> outs = translate(ctx);
    KILN_CHECK(outs.size() == r.outputs.size(), "export_onnx: the translation of ", r.op, " gave ", outs.size(),
               " values for ", r.outputs.size(), " results; this is a bug in kiln");
    for (size_t k = 0; k < outs.size(); ++k) {
      if (r.outputs[k].defined()) {
        (void)onnx::onnx_type(r.outputs[k].dtype(), "the result of " + r.op + " " + where);
        names[key(r.outputs[k])] = outs[k];
      }
    }
  }
  builder.scope.clear();

  KILN_CHECK(options.output_names.size() <= first.outputs.size(), "export_onnx: ", options.output_names.size(),
             " output names for ", first.outputs.size(), " outputs of the forward");
  for (size_t k = 0; k < first.outputs.size(); ++k) {
    const Tensor& y = first.outputs[k];
    KILN_CHECK(y.defined(), "export_onnx: output ", k, " of the forward is undefined");
    const std::string name = k < options.output_names.size() ? options.output_names[k] : "output_" + std::to_string(k);
    KILN_CHECK(std::find(input_names.begin(), input_names.end(), name) == input_names.end(),
               "export_onnx: output name '", name, "' is also an input's name");
    const std::string value = resolve(y, second.outputs[k], "returned as output " + std::to_string(k));
    graph.nodes.push_back(onnx::Node{"Identity", {value}, {name}, {}, "output/" + name});
    graph.outputs.push_back(ValueInfo{name, y.dtype(), dims_of(y, second.outputs[k], builder, name)});
  }

  // Initializers no node reads: the weights and statistics a folded batch norm replaced.
  std::unordered_set<std::string> read;
  for (const auto& n : graph.nodes) read.insert(n.inputs.begin(), n.inputs.end());
  std::erase_if(graph.initializers, [&](const auto& init) { return read.count(init.first) == 0; });

  report.bytes = onnx::write_model(graph, path, options.external_data_threshold, KILN_VERSION_STRING);
  report.nodes = static_cast<int64_t>(graph.nodes.size());
  report.initializers = static_cast<int64_t>(graph.initializers.size());
  int64_t total = 0;
  for (const auto& [n, t] : graph.initializers) total += t.numel() * static_cast<int64_t>(element_size(t.dtype()));
  report.external_data = total > options.external_data_threshold;
  std::set<std::string> types;
  for (const auto& n : graph.nodes) types.insert(n.op_type);
  report.op_types.assign(types.begin(), types.end());
  for (const auto& w : report.warnings) std::cerr << "kiln: " << w << "\n";
  return report;
}

OnnxExportReport export_onnx(nn::Module& module, const Tensor& example_input, const std::string& path,
                             const OnnxExportOptions& options) {
  return export_onnx(
      module, [&module](const std::vector<Tensor>& in) { return std::vector<Tensor>{module(in[0])}; }, {example_input},
      path, options);
}

void write_onnx_tensor(const Tensor& t, const std::string& path) {
  KILN_CHECK(t.defined(), "write_onnx_tensor: the tensor is undefined");
  onnx::write_tensor_file(t, path);
}

}  // namespace kiln::io
