// kiln/io/onnx/graph.cpp — the Builder: unique names, constants, and shape lists that follow the inputs' sizes.
#include "kiln/io/onnx/graph.h"

#include "kiln/autograd/functions.h"  // contiguous, to, scalar_tensor, from_vector
#include "kiln/tensor/error.h"

namespace kiln::io::onnx {

int onnx_type(DType dtype, const std::string& what) {
  // TensorProto.DataType's values.
  switch (dtype) {
    case DType::Float32: return 1;
    case DType::UInt8: return 2;
    case DType::Int32: return 6;
    case DType::Int64: return 7;
    case DType::Bool: return 9;
    case DType::Float16: return 10;
    case DType::Float64: return 11;
    case DType::BFloat16: return 16;
    case DType::Float8_e4m3fn:
    case DType::Float8_e5m2: break;
  }
  KILN_FAIL("export_onnx: ", what, " has dtype ", dtype, ", which an ONNX model at opset ", kOpset,
            " cannot hold; export the model in float32, float16 or bfloat16 (outside an FP8 autocast region)");
}

std::string Builder::fresh(const std::string& hint) {
  const int n = used_[hint]++;
  return n == 0 ? hint : hint + "_" + std::to_string(n);
}

std::string Builder::add(const std::string& op_type, std::vector<std::string> inputs,
                         std::vector<std::pair<std::string, AttrValue>> attrs) {
  return add_n(op_type, std::move(inputs), 1, std::move(attrs))[0];
}

std::vector<std::string> Builder::add_n(const std::string& op_type, std::vector<std::string> inputs, size_t outputs,
                                        std::vector<std::pair<std::string, AttrValue>> attrs) {
  Node node;
  node.op_type = op_type;
  node.inputs = std::move(inputs);
  node.attrs = std::move(attrs);
  node.name = (scope.empty() ? std::string() : scope + "/") + op_type + "_" + std::to_string(nodes_++);
  for (size_t i = 0; i < outputs; ++i) {
    std::string value = node.name;  // (appended piecewise: GCC 12 warns falsely on ":" + std::string)
    if (outputs > 1) value.append(":").append(std::to_string(i));
    node.outputs.push_back(fresh(value));
  }
  graph_.nodes.push_back(node);
  return graph_.nodes.back().outputs;
}

std::string Builder::initializer(const std::string& name, const Tensor& value) {
  std::string unique = fresh(name);
  (void)onnx_type(value.dtype(), "the constant " + name);
  graph_.initializers.emplace_back(unique, contiguous(to(value.detach(), Device::cpu())));
  return unique;
}

std::string Builder::ints(const std::vector<int64_t>& values) {
  return initializer("const", from_vector(values, {static_cast<int64_t>(values.size())}));
}

std::string Builder::int_scalar(int64_t value) {
  return initializer("const", from_vector(std::vector<int64_t>{value}, {}));
}

std::string Builder::scalar(double value, DType dtype) {
  return initializer("const", scalar_tensor(value, {.dtype = dtype}));
}

std::string Builder::cast(const std::string& value, DType from, DType to) {
  if (from == to) return value;
  return add("Cast", {value}, {{"to", int64_t{onnx_type(to, "a cast")}}});
}

std::optional<std::string> Builder::label_of(int64_t a, int64_t b) const {
  for (const DynamicDim& d : dynamic_) {
    if (d.a == a && d.b == b) return d.label;
  }
  return std::nullopt;
}

std::string Builder::input_shape(const std::string& input) {
  auto it = shapes_.find(input);
  if (it != shapes_.end()) return it->second;
  const std::string shape = add("Shape", {input});
  shapes_[input] = shape;
  return shape;
}

std::optional<std::string> Builder::dynamic_size(int64_t a, int64_t b) {
  for (const DynamicDim& d : dynamic_) {
    if (d.a == a && d.b == b) return add("Gather", {input_shape(d.input), ints({d.axis})}, {{"axis", int64_t{0}}});
  }
  // A product of two dynamic sizes: (N, S, H) flattened to (N * S, H).
  for (size_t i = 0; i < dynamic_.size(); ++i) {
    for (size_t j = i; j < dynamic_.size(); ++j) {
      const DynamicDim &x = dynamic_[i], &y = dynamic_[j];
      if (x.a * y.a == a && x.b * y.b == b) {
        const std::string u = add("Gather", {input_shape(x.input), ints({x.axis})}, {{"axis", int64_t{0}}});
        const std::string v = add("Gather", {input_shape(y.input), ints({y.axis})}, {{"axis", int64_t{0}}});
        return add("Mul", {u, v});
      }
    }
  }
  return std::nullopt;
}

std::string Builder::shape_list(const std::vector<int64_t>& a, const std::vector<int64_t>& b, bool infer,
                                const std::string& what) {
  KILN_CHECK(a.size() == b.size(), "export_onnx: ", what, " has ", a.size(), " elements in the first trace and ",
             b.size(), " in the second; its rank must not depend on the inputs' sizes");
  if (a == b) return ints(a);
  std::vector<std::string> parts;
  std::vector<int64_t> run;  // constant elements not yet emitted
  bool inferred = false;
  auto flush = [&] {
    if (!run.empty()) parts.push_back(ints(run));
    run.clear();
  };
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) {
      run.push_back(a[i]);
      continue;
    }
    if (auto size = dynamic_size(a[i], b[i])) {
      flush();
      parts.push_back(*size);
    } else if (infer && !inferred) {
      run.push_back(-1);
      inferred = true;
    } else {
      KILN_FAIL("export_onnx: ", what, " has element ", i, " = ", a[i], " in the first trace and ", b[i],
                " in the second, which follows no dynamic axis (nor a product of two); export without dynamic axes, "
                "or compute that size from an input's dims");
    }
  }
  flush();
  return parts.size() == 1 ? parts[0] : add("Concat", parts, {{"axis", int64_t{0}}});
}

std::string Builder::size_scalar(int64_t a, int64_t b, const std::string& what) {
  if (a == b) return int_scalar(a);
  const std::string list = shape_list({a}, {b}, false, what);
  return add("Squeeze", {list, ints({0})});
}

}  // namespace kiln::io::onnx
