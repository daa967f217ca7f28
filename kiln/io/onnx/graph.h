// kiln/io/onnx/graph.h — the ONNX graph io::export_onnx builds before it writes it (internal to kiln_io): nodes,
// initializers and the graph's inputs and outputs, in kiln's own types, and the Builder that the op translations
// (ops.cpp) add nodes through. writer.cpp turns a Graph into ONNX's protobuf.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::io::onnx {

inline constexpr int64_t kOpset = 17;  // the ai.onnx opset every export states

// An attribute of a node: int, float, ints, floats, string, or a tensor (ConstantOfShape's value).
using AttrValue = std::variant<int64_t, float, std::vector<int64_t>, std::vector<float>, std::string, Tensor>;

struct Node {
  std::string op_type;              // "Conv", "MatMul", ...
  std::vector<std::string> inputs;  // value names; "" for an absent optional input
  std::vector<std::string> outputs;
  std::vector<std::pair<std::string, AttrValue>> attrs;
  std::string name;  // unique; says which kiln op and module it came from
};

// A dim of a graph input or output: a fixed size, or a named size that varies at run time.
using Dim = std::variant<int64_t, std::string>;

struct ValueInfo {
  std::string name;
  DType dtype;
  std::vector<Dim> dims;
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;
  std::vector<std::pair<std::string, Tensor>> initializers;  // CPU, contiguous
  std::vector<ValueInfo> inputs, outputs;
};

// A size that varies between the two traces export_onnx runs: dim `axis` of graph input `input`, `a` in the
// first trace and `b` in the second.
struct DynamicDim {
  std::string input;  // the graph input's name
  int64_t axis;
  int64_t a, b;
  std::string label;  // "batch", "sequence", ...
};

// Adds nodes and initializers to a Graph under unique names.
class Builder {
 public:
  Builder(Graph& graph, std::vector<DynamicDim> dynamic) : graph_(graph), dynamic_(std::move(dynamic)) {}

  // A new value name from `hint` (made unique).
  std::string fresh(const std::string& hint);
  // A node of one output; returns the output's name.
  std::string add(const std::string& op_type, std::vector<std::string> inputs,
                  std::vector<std::pair<std::string, AttrValue>> attrs = {});
  // A node of `outputs` outputs.
  std::vector<std::string> add_n(const std::string& op_type, std::vector<std::string> inputs, size_t outputs,
                                 std::vector<std::pair<std::string, AttrValue>> attrs = {});
  // An initializer holding `value` (copied to the CPU, contiguous) under `name` (made unique).
  std::string initializer(const std::string& name, const Tensor& value);
  // Constants: a 1-D Int64 list, a 0-d Int64, a 0-d of `dtype` holding `value`.
  std::string ints(const std::vector<int64_t>& values);
  std::string int_scalar(int64_t value);
  std::string scalar(double value, DType dtype);
  // `value` cast to `dtype` when `from` differs.
  std::string cast(const std::string& value, DType from, DType to);

  // A 1-D Int64 value holding a shape-like list whose elements were `a` in the first trace and `b` in the
  // second: constants where they agree, sizes of the graph's inputs (Shape, Gather) where they follow a dynamic
  // dim (or the product of two). An element that follows none: -1 when `infer` allows one (Reshape), else an error
  // naming `what`.
  std::string shape_list(const std::vector<int64_t>& a, const std::vector<int64_t>& b, bool infer,
                         const std::string& what);
  // One element of such a list as a 0-d Int64 value (Range's limit, Slice bounds).
  std::string size_scalar(int64_t a, int64_t b, const std::string& what);
  // The dynamic label whose sizes were (a, b), if any.
  std::optional<std::string> label_of(int64_t a, int64_t b) const;

  // Set by the caller while an op is translated: names nodes "<module path>/<kiln op>_<n>".
  std::string scope;

 private:
  std::optional<std::string> dynamic_size(int64_t a, int64_t b);  // a 1-D Int64 of one element, or none
  std::string input_shape(const std::string& input);

  Graph& graph_;
  std::vector<DynamicDim> dynamic_;
  std::map<std::string, int> used_;
  std::map<std::string, std::string> shapes_;  // graph input -> its Shape value
  int nodes_ = 0;
};

// The ONNX TensorProto element type of a dtype (kiln::Error for those ONNX cannot hold, naming `what`).
int onnx_type(DType dtype, const std::string& what);

// Writes `graph` as an ONNX model at `path` (through a temporary file renamed into place; nothing is left behind
// on failure). Initializers past `external_threshold` bytes in all go to "<file name>.data" beside it.
// Returns the bytes written (model and data).
int64_t write_model(const Graph& graph, const std::string& path, int64_t external_threshold,
                    const std::string& producer_version);
// Writes one tensor as a TensorProto file (ONNX's test-data layout: input_0.pb, output_0.pb).
void write_tensor_file(const Tensor& t, const std::string& path);

}  // namespace kiln::io::onnx
