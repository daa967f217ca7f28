// kiln/io/onnx/ops.cpp — the translations of kiln's ops into ONNX operators (opset 17), one function each, and the
// table that finds them by the kiln op's name. A record holds the op's tensor inputs in declaration order and its
// other arguments by name (kiln/tensor/capture.h); ONNX wants equal input dtypes where kiln promotes, so inputs
// are cast to the dtype kiln computed in.
#include "kiln/io/onnx/ops.h"

#include <cmath>
#include <limits>
#include <unordered_map>

#include "kiln/autograd/functions.h"
#include "kiln/tensor/error.h"

namespace kiln::io::onnx {

// ---------------------------------------------------------------- attribute access

namespace {

const capture::Attr& find_attr(const capture::OpRecord& r, const std::string& name, const std::string& where) {
  const capture::Attr* a = r.attr(name);
  KILN_CHECK(a != nullptr, "export_onnx: op ", r.op, " ", where, " has no argument '", name,
             "' in its record; this is a bug in kiln's op recording");
  return *a;
}

int64_t as_int(const capture::AttrValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* d = std::get_if<double>(&v)) return static_cast<int64_t>(*d);
  KILN_FAIL("export_onnx: an argument is not a number");
}

std::vector<int64_t> as_ints(const capture::AttrValue& v) {
  if (const auto* is = std::get_if<std::vector<int64_t>>(&v)) return *is;
  return {as_int(v)};
}

}  // namespace

int64_t OpContext::i(const std::string& name) const { return as_int(find_attr(first, name, where).value); }
double OpContext::f(const std::string& name) const {
  const auto& v = find_attr(first, name, where).value;
  if (const auto* d = std::get_if<double>(&v)) return *d;
  return static_cast<double>(as_int(v));
}
bool OpContext::has(const std::string& name) const { return first.attr(name) != nullptr; }
std::vector<int64_t> OpContext::ints(const std::string& name) const {
  return as_ints(find_attr(first, name, where).value);
}
std::pair<std::vector<int64_t>, std::vector<int64_t>> OpContext::ints2(const std::string& name) const {
  return {as_ints(find_attr(first, name, where).value), as_ints(find_attr(second, name, where).value)};
}
std::pair<int64_t, int64_t> OpContext::i2(const std::string& name) const {
  return {as_int(find_attr(first, name, where).value), as_int(find_attr(second, name, where).value)};
}
std::pair<std::vector<int64_t>, std::vector<int64_t>> OpContext::out_shape(size_t k) const {
  return {first.outputs.at(k).shape(), second.outputs.at(k).shape()};
}

namespace {

using Names = std::vector<std::string>;
using Attrs = std::vector<std::pair<std::string, AttrValue>>;

DType in_dtype(const OpContext& c, size_t k) { return c.first.inputs.at(k).dtype(); }
DType out_dtype(const OpContext& c, size_t k = 0) { return c.first.outputs.at(k).dtype(); }
int64_t in_rank(const OpContext& c, size_t k) { return c.first.inputs.at(k).dim(); }
int64_t wrap(int64_t dim, int64_t rank) { return dim < 0 ? dim + std::max<int64_t>(rank, 1) : dim; }
// Input k in the output's dtype.
std::string in_as_out(OpContext& c, size_t k) { return c.b.cast(c.in.at(k), in_dtype(c, k), out_dtype(c)); }
// A number argument as a 0-d constant of `dtype`.
std::string number(OpContext& c, const std::string& attr, DType dtype) { return c.b.scalar(c.f(attr), dtype); }

[[noreturn]] void refuse(const OpContext& c, const std::string& why) {
  KILN_FAIL("export_onnx: op ", c.first.op, " ", c.where, ": ", why);
}

// ---------------------------------------------------------------- elementwise

Names binary(OpContext& c, const char* onnx_op) {
  if (out_dtype(c) == DType::Bool) refuse(c, "arithmetic on bool tensors has no ONNX form; cast them first");
  std::string a = in_as_out(c, 0), b = in_as_out(c, 1);
  if (c.has("alpha") && c.f("alpha") != 1.0) b = c.b.add("Mul", {b, number(c, "alpha", out_dtype(c))});
  return {c.b.add(onnx_op, {a, b})};
}
Names t_add(OpContext& c) { return binary(c, "Add"); }
Names t_sub(OpContext& c) { return binary(c, "Sub"); }
Names t_mul(OpContext& c) { return binary(c, "Mul"); }
Names t_div(OpContext& c) { return binary(c, "Div"); }
Names t_pow(OpContext& c) { return binary(c, "Pow"); }
Names t_maximum(OpContext& c) { return binary(c, "Max"); }
Names t_minimum(OpContext& c) { return binary(c, "Min"); }

// x op s (or s op x when `reversed`), in the output's dtype.
Names with_number(OpContext& c, const char* onnx_op, const char* attr, bool reversed) {
  if (out_dtype(c) == DType::Bool) refuse(c, "arithmetic on bool tensors has no ONNX form; cast them first");
  const std::string x = in_as_out(c, 0), s = number(c, attr, out_dtype(c));
  return {reversed ? c.b.add(onnx_op, {s, x}) : c.b.add(onnx_op, {x, s})};
}
Names t_add_scalar(OpContext& c) { return with_number(c, "Add", "other", false); }
Names t_sub_scalar(OpContext& c) { return with_number(c, "Sub", "other", false); }
Names t_rsub_scalar(OpContext& c) { return with_number(c, "Sub", "other", true); }
Names t_mul_scalar(OpContext& c) { return with_number(c, "Mul", "other", false); }
Names t_div_scalar(OpContext& c) { return with_number(c, "Div", "other", false); }
Names t_rdiv_scalar(OpContext& c) { return with_number(c, "Div", "other", true); }
Names t_pow_scalar(OpContext& c) { return with_number(c, "Pow", "exponent", false); }
Names t_rpow_scalar(OpContext& c) { return with_number(c, "Pow", "base", true); }

// Comparisons compute in the promoted dtype (with a number: the tensor's, or float32 for an integer tensor and a
// fractional number), as kiln's do.
Names compare(OpContext& c, const char* onnx_op, bool negate) {
  std::string a, b;
  if (c.first.inputs.size() == 2) {
    const DType t = promote_types(in_dtype(c, 0), in_dtype(c, 1));
    a = c.b.cast(c.in[0], in_dtype(c, 0), t);
    b = c.b.cast(c.in[1], in_dtype(c, 1), t);
  } else {
    const bool fractional = std::holds_alternative<double>(c.first.attr("other")->value);
    DType t = in_dtype(c, 0);
    if (fractional && !is_floating_point(t)) t = DType::Float32;
    if (t == DType::Bool) t = DType::Int64;
    a = c.b.cast(c.in[0], in_dtype(c, 0), t);
    b = number(c, "other", t);
  }
  const std::string y = c.b.add(onnx_op, {a, b});
  return {negate ? c.b.add("Not", {y}) : y};
}
Names t_eq(OpContext& c) { return compare(c, "Equal", false); }
Names t_ne(OpContext& c) { return compare(c, "Equal", true); }
Names t_lt(OpContext& c) { return compare(c, "Less", false); }
Names t_le(OpContext& c) { return compare(c, "LessOrEqual", false); }
Names t_gt(OpContext& c) { return compare(c, "Greater", false); }
Names t_ge(OpContext& c) { return compare(c, "GreaterOrEqual", false); }
Names logical(OpContext& c, const char* onnx_op) {
  return {c.b.add(onnx_op,
                  {c.b.cast(c.in[0], in_dtype(c, 0), DType::Bool), c.b.cast(c.in[1], in_dtype(c, 1), DType::Bool)})};
}
Names t_logical_and(OpContext& c) { return logical(c, "And"); }
Names t_logical_or(OpContext& c) { return logical(c, "Or"); }
Names t_logical_xor(OpContext& c) { return logical(c, "Xor"); }

// One ONNX operator of the input in the output's dtype.
Names unary(OpContext& c, const char* onnx_op) { return {c.b.add(onnx_op, {in_as_out(c, 0)})}; }
Names t_neg(OpContext& c) { return unary(c, "Neg"); }
Names t_abs(OpContext& c) { return unary(c, "Abs"); }
Names t_exp(OpContext& c) { return unary(c, "Exp"); }
Names t_log(OpContext& c) { return unary(c, "Log"); }
Names t_sqrt(OpContext& c) { return unary(c, "Sqrt"); }
Names t_sin(OpContext& c) { return unary(c, "Sin"); }
Names t_cos(OpContext& c) { return unary(c, "Cos"); }
Names t_tanh(OpContext& c) { return unary(c, "Tanh"); }
Names t_erf(OpContext& c) { return unary(c, "Erf"); }
Names t_sigmoid(OpContext& c) { return unary(c, "Sigmoid"); }
Names t_relu(OpContext& c) { return unary(c, "Relu"); }
Names t_sign(OpContext& c) { return unary(c, "Sign"); }
Names t_floor(OpContext& c) { return unary(c, "Floor"); }
Names t_ceil(OpContext& c) { return unary(c, "Ceil"); }
Names t_round(OpContext& c) { return unary(c, "Round"); }  // half to even, as kiln's
Names t_reciprocal(OpContext& c) { return unary(c, "Reciprocal"); }
Names t_rsqrt(OpContext& c) { return {c.b.add("Reciprocal", {c.b.add("Sqrt", {in_as_out(c, 0)})})}; }
Names t_expm1(OpContext& c) {
  return {c.b.add("Sub", {c.b.add("Exp", {in_as_out(c, 0)}), c.b.scalar(1, out_dtype(c))})};
}
Names t_log1p(OpContext& c) {
  return {c.b.add("Log", {c.b.add("Add", {in_as_out(c, 0), c.b.scalar(1, out_dtype(c))})})};
}
Names t_log2(OpContext& c) {
  return {c.b.add("Div", {c.b.add("Log", {in_as_out(c, 0)}), c.b.scalar(std::log(2.0), out_dtype(c))})};
}
Names t_silu(OpContext& c) {
  const std::string x = in_as_out(c, 0);
  return {c.b.add("Mul", {x, c.b.add("Sigmoid", {x})})};
}
Names t_square(OpContext& c) {
  const std::string x = in_as_out(c, 0);
  return {c.b.add("Mul", {x, x})};
}

// GELU as opset 17 writes it: x * Φ(x) = 0.5 x (1 + erf(x / √2)), or the tanh form
// 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))).
std::string gelu(OpContext& c, const std::string& x, DType t, bool tanh_form) {
  Builder& b = c.b;
  std::string inner;
  if (tanh_form) {
    const std::string cube = b.add("Mul", {b.add("Mul", {x, x}), x});
    const std::string sum = b.add("Add", {x, b.add("Mul", {cube, b.scalar(0.044715, t)})});
    inner = b.add("Tanh", {b.add("Mul", {sum, b.scalar(std::sqrt(2.0 / M_PI), t)})});
  } else {
    inner = b.add("Erf", {b.add("Div", {x, b.scalar(std::sqrt(2.0), t)})});
  }
  const std::string one_plus = b.add("Add", {inner, b.scalar(1, t)});
  return b.add("Mul", {b.add("Mul", {x, one_plus}), b.scalar(0.5, t)});
}
Names t_gelu(OpContext& c) { return {gelu(c, in_as_out(c, 0), out_dtype(c), c.i("tanh_approximation") != 0)}; }

Names t_clamp(OpContext& c) {
  const DType t = out_dtype(c);
  return {c.b.add("Clip",
                  {in_as_out(c, 0), c.has("min") ? number(c, "min", t) : "", c.has("max") ? number(c, "max", t) : ""})};
}

Names t_where(OpContext& c) {
  const DType t = out_dtype(c);
  const std::string cond = c.b.cast(c.in[0], in_dtype(c, 0), DType::Bool);
  const std::string a = c.in[1].empty() ? number(c, "a", t) : c.b.cast(c.in[1], in_dtype(c, 1), t);
  const std::string b = c.in[2].empty() ? number(c, "b", t) : c.b.cast(c.in[2], in_dtype(c, 2), t);
  return {c.b.add("Where", {cond, a, b})};
}

Names t_masked_fill(OpContext& c) {
  const DType t = out_dtype(c);
  return {c.b.add("Where", {c.b.cast(c.in[1], in_dtype(c, 1), DType::Bool), number(c, "value", t), in_as_out(c, 0)})};
}

// ---------------------------------------------------------------- shapes and views

// Every reshaping view (view, reshape, flatten, unflatten, squeeze, unsqueeze) is a Reshape to its result's shape.
Names t_reshape(OpContext& c) {
  auto [a, b] = c.out_shape();
  return {c.b.add("Reshape", {c.in[0], c.b.shape_list(a, b, true, c.first.op + " " + c.where)})};
}

Names t_permute(OpContext& c) {
  std::vector<int64_t> perm = c.ints("dims");
  for (auto& d : perm) d = wrap(d, in_rank(c, 0));
  return {c.b.add("Transpose", {c.in[0]}, {{"perm", perm}})};
}

Names t_transpose(OpContext& c) {
  const int64_t r = in_rank(c, 0);
  if (r < 2) return {c.in[0]};
  std::vector<int64_t> perm(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d) perm[static_cast<size_t>(d)] = d;
  std::swap(perm[static_cast<size_t>(wrap(c.i("dim0"), r))], perm[static_cast<size_t>(wrap(c.i("dim1"), r))]);
  return {c.b.add("Transpose", {c.in[0]}, {{"perm", perm}})};
}

Names t_expand(OpContext& c) {
  auto [a, b] = c.out_shape();
  return {c.b.add("Expand", {c.in[0], c.b.shape_list(a, b, false, "expand " + c.where)})};
}

// x[start:end:step] along `dim`, bounds that may follow the inputs' sizes.
std::string slice(OpContext& c, int64_t dim, std::pair<int64_t, int64_t> start, std::pair<int64_t, int64_t> end,
                  int64_t step) {
  const std::string what = c.first.op + " " + c.where;
  return c.b.add("Slice", {c.in[0], c.b.shape_list({start.first}, {start.second}, false, what),
                           c.b.shape_list({end.first}, {end.second}, false, what), c.b.ints({dim}), c.b.ints({step})});
}

Names t_narrow(OpContext& c) {
  const auto start = c.i2("start"), length = c.i2("length");
  const int64_t size_a = c.first.inputs[0].size(wrap(c.i("dim"), in_rank(c, 0)));
  const int64_t size_b = c.second.inputs[0].size(wrap(c.i("dim"), in_rank(c, 0)));
  // A negative start counts from the end, as kiln's narrow.
  const std::pair<int64_t, int64_t> s{start.first < 0 ? start.first + size_a : start.first,
                                      start.second < 0 ? start.second + size_b : start.second};
  return {slice(c, wrap(c.i("dim"), in_rank(c, 0)), s, {s.first + length.first, s.second + length.second}, 1)};
}

Names t_slice(OpContext& c) {
  constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();
  const auto start = c.has("start") ? c.i2("start") : std::pair<int64_t, int64_t>{0, 0};
  const auto end = c.has("end") ? c.i2("end") : std::pair<int64_t, int64_t>{kEnd, kEnd};
  return {slice(c, wrap(c.i("dim"), in_rank(c, 0)), start, end, c.i("step"))};
}

Names t_select(OpContext& c) {
  const auto index = c.i2("index");
  return {c.b.add("Gather", {c.in[0], c.b.size_scalar(index.first, index.second, "select " + c.where)},
                  {{"axis", wrap(c.i("dim"), in_rank(c, 0))}})};
}

// split, split_with_sizes and chunk: Split by the pieces' sizes; unbind: pieces of 1, squeezed.
Names t_split(OpContext& c) {
  const int64_t dim = wrap(c.i("dim"), in_rank(c, 0));
  std::vector<int64_t> a, b;
  for (size_t k = 0; k < c.first.outputs.size(); ++k) {
    a.push_back(c.first.outputs[k].dim() == in_rank(c, 0) ? c.first.outputs[k].size(dim) : 1);
    b.push_back(c.second.outputs[k].dim() == in_rank(c, 0) ? c.second.outputs[k].size(dim) : 1);
  }
  if (a.size() == 1) return {c.in[0]};
  Names parts =
      c.b.add_n("Split", {c.in[0], c.b.shape_list(a, b, false, c.first.op + " " + c.where)}, a.size(), {{"axis", dim}});
  if (c.first.op == "unbind") {
    for (auto& p : parts) p = c.b.add("Squeeze", {p, c.b.ints({dim})});
  }
  return parts;
}

Names t_identity(OpContext& c) { return {c.in[0]}; }

Names t_cast(OpContext& c) { return {c.b.cast(c.in[0], in_dtype(c, 0), out_dtype(c))}; }

// ---------------------------------------------------------------- reductions

// ONNX's reductions at opset 17: ReduceSum takes the axes as an input, the others as an attribute. No dims: all.
Names reduce(OpContext& c, const char* onnx_op, bool axes_input) {
  const std::vector<int64_t> dims = c.ints("dims");
  std::vector<int64_t> axes;
  for (int64_t d : dims) axes.push_back(wrap(d, in_rank(c, 0)));
  Attrs attrs{{"keepdims", c.i("keepdim")}};
  const std::string x = in_as_out(c, 0);
  if (in_rank(c, 0) == 0) return {x};
  if (axes_input) return {c.b.add(onnx_op, {x, axes.empty() ? "" : c.b.ints(axes)}, attrs)};
  if (!axes.empty()) attrs.emplace_back("axes", axes);
  return {c.b.add(onnx_op, {x}, attrs)};
}
Names t_sum(OpContext& c) { return reduce(c, "ReduceSum", true); }
Names t_mean(OpContext& c) { return reduce(c, "ReduceMean", false); }
Names t_prod(OpContext& c) { return reduce(c, "ReduceProd", false); }
Names t_amax(OpContext& c) { return reduce(c, "ReduceMax", false); }
Names t_amin(OpContext& c) { return reduce(c, "ReduceMin", false); }
Names t_logsumexp(OpContext& c) { return reduce(c, "ReduceLogSumExp", false); }
Names t_norm(OpContext& c) {
  const double p = c.f("p");
  if (p == 2) return reduce(c, "ReduceL2", false);
  if (p == 1) return reduce(c, "ReduceL1", false);
  refuse(c, "only the 1- and 2-norms have an ONNX reduction");
}

// max(a, dim) and min(a, dim): the values and their Int64 indices.
Names indexed_extremum(OpContext& c, bool is_max) {
  const int64_t dim = wrap(c.i("dim"), in_rank(c, 0));
  const Attrs attrs{{"axis", dim}, {"keepdims", c.i("keepdim")}};
  return {c.b.add(is_max ? "ReduceMax" : "ReduceMin", {c.in[0]},
                  {{"axes", std::vector<int64_t>{dim}}, {"keepdims", c.i("keepdim")}}),
          c.b.add(is_max ? "ArgMax" : "ArgMin", {c.in[0]}, attrs)};
}
Names t_max_dim(OpContext& c) { return indexed_extremum(c, true); }
Names t_min_dim(OpContext& c) { return indexed_extremum(c, false); }

Names t_softmax(OpContext& c) {
  return {c.b.add("Softmax", {in_as_out(c, 0)}, {{"axis", wrap(c.i("dim"), in_rank(c, 0))}})};
}
Names t_log_softmax(OpContext& c) {
  return {c.b.add("LogSoftmax", {in_as_out(c, 0)}, {{"axis", wrap(c.i("dim"), in_rank(c, 0))}})};
}

// ---------------------------------------------------------------- products, indexing, joining

Names t_matmul(OpContext& c) { return {c.b.add("MatMul", {in_as_out(c, 0), in_as_out(c, 1)})}; }

Names t_addmm(OpContext& c) {
  return {c.b.add("Gemm", {in_as_out(c, 1), in_as_out(c, 2), in_as_out(c, 0)},
                  {{"alpha", static_cast<float>(c.f("alpha"))}, {"beta", static_cast<float>(c.f("beta"))}})};
}

Names t_outer(OpContext& c) {
  return {c.b.add("Mul", {c.b.add("Unsqueeze", {in_as_out(c, 0), c.b.ints({1})}),
                          c.b.add("Unsqueeze", {in_as_out(c, 1), c.b.ints({0})})})};
}

Names t_embedding(OpContext& c) { return {c.b.add("Gather", {c.in[0], c.in[1]}, {{"axis", int64_t{0}}})}; }

Names t_index_select(OpContext& c) {
  return {c.b.add("Gather", {c.in[0], c.in[1]}, {{"axis", wrap(c.i("dim"), in_rank(c, 0))}})};
}

Names t_gather(OpContext& c) {
  return {c.b.add("GatherElements", {c.in[0], c.in[1]}, {{"axis", wrap(c.i("dim"), in_rank(c, 0))}})};
}

Names t_cat(OpContext& c) {
  const int64_t rank = c.first.outputs[0].dim();
  Names parts;
  for (size_t k = 0; k < c.in.size(); ++k) {
    const Tensor& t = c.first.inputs[k];
    if (t.dim() == 1 && t.size(0) == 0 && rank != 1) continue;  // kiln's cat skips (0,) pieces, as PyTorch's
    parts.push_back(in_as_out(c, k));
  }
  return {parts.size() == 1 ? parts[0] : c.b.add("Concat", parts, {{"axis", wrap(c.i("dim"), rank)}})};
}

Names t_stack(OpContext& c) {
  const int64_t dim = wrap(c.i("dim"), c.first.outputs[0].dim());
  Names parts;
  for (size_t k = 0; k < c.in.size(); ++k) parts.push_back(c.b.add("Unsqueeze", {in_as_out(c, k), c.b.ints({dim})}));
  return {c.b.add("Concat", parts, {{"axis", dim}})};
}

Names triangle(OpContext& c, bool upper) {
  return {c.b.add("Trilu", {c.in[0], c.b.int_scalar(c.i("diagonal"))}, {{"upper", int64_t{upper}}})};
}
Names t_tril(OpContext& c) { return triangle(c, false); }
Names t_triu(OpContext& c) { return triangle(c, true); }

// ---------------------------------------------------------------- factories

// A 1-element tensor of `dtype` holding `value`: ConstantOfShape's value.
Tensor fill_value(double value, DType dtype) { return full({1}, value, {.dtype = dtype}); }

Names t_full(OpContext& c) {
  auto [a, b] = c.out_shape();
  return {c.b.add("ConstantOfShape", {c.b.shape_list(a, b, false, "the shape of " + c.first.op + " " + c.where)},
                  {{"value", fill_value(c.f("value"), out_dtype(c))}})};
}

Names t_full_like(OpContext& c) {
  return {
      c.b.add("ConstantOfShape", {c.b.add("Shape", {c.in[0]})}, {{"value", fill_value(c.f("value"), out_dtype(c))}})};
}

Names t_arange(OpContext& c) {
  const DType t = out_dtype(c);
  KILN_CHECK(t == DType::Int64 || t == DType::Int32 || t == DType::Float32 || t == DType::Float64,
             "export_onnx: arange ", c.where, " makes ", t, ", which ONNX's Range cannot; make it int64 or float32");
  const auto end = c.i2("end");
  std::string limit;
  if (std::holds_alternative<int64_t>(c.first.attr("end")->value)) {
    limit = c.b.cast(c.b.size_scalar(end.first, end.second, "the end of arange " + c.where), DType::Int64, t);
  } else {
    limit = number(c, "end", t);
  }
  return {c.b.add("Range", {number(c, "start", t), limit, number(c, "step", t)})};
}

// ---------------------------------------------------------------- layers

void warn_training(OpContext& c, const char* what) {
  if (c.has("training") && c.i("training") != 0) {
    c.warnings.push_back(std::string("export_onnx: ") + c.first.op + " " + c.where + " ran in training mode; " + what);
  }
}

Names t_dropout(OpContext& c) {
  warn_training(c, "the exported model has no dropout (inference)");
  return {c.in[0]};
}

// x @ weight^T (+ bias): Gemm for 2-D x, else MatMul with the transposed weight.
Names t_linear(OpContext& c) {
  const std::string w = c.in[1];
  if (in_rank(c, 0) == 2) {
    Names in{c.in[0], w};
    if (!c.in[2].empty()) in.push_back(c.in[2]);
    return {c.b.add("Gemm", in, {{"transB", int64_t{1}}})};
  }
  std::string y = c.b.add("MatMul", {c.in[0], c.b.add("Transpose", {w}, {{"perm", std::vector<int64_t>{1, 0}}})});
  if (!c.in[2].empty()) y = c.b.add("Add", {y, c.in[2]});
  return {y};
}

// LayerNormalization over the last len(normalized_shape) dims; a missing weight is ones (ONNX needs a scale).
std::string layer_norm(OpContext& c, const std::string& x, DType t, size_t weight, size_t bias) {
  const std::vector<int64_t> shape = c.ints("normalized_shape");
  std::string scale = c.in[weight];
  if (scale.empty()) scale = c.b.initializer("ones", full(shape, 1.0, {.dtype = t}));
  return c.b.add("LayerNormalization", {x, scale, c.in[bias]},
                 {{"axis", -static_cast<int64_t>(shape.size())}, {"epsilon", static_cast<float>(c.f("eps"))}});
}
Names t_layer_norm(OpContext& c) { return {layer_norm(c, c.in[0], in_dtype(c, 0), 1, 2)}; }

// layer_norm(x + residual): the add in the dtype kiln sums in, the layer norm in the result's.
Names t_add_layer_norm(OpContext& c) {
  warn_training(c, "the exported model has no dropout (inference)");
  const DType sum_type = promote_types(in_dtype(c, 0), in_dtype(c, 1));
  const std::string sum =
      c.b.add("Add", {c.b.cast(c.in[0], in_dtype(c, 0), sum_type), c.b.cast(c.in[1], in_dtype(c, 1), sum_type)});
  return {c.b.cast(layer_norm(c, sum, sum_type, 2, 3), sum_type, out_dtype(c))};
}

// The per-channel scale and shift of an eval batch norm, (C) each in float64: y = x * scale + shift.
std::pair<Tensor, Tensor> norm_affine(const capture::OpRecord& norm) {
  const Tensor mean = norm.inputs[1].to(Device::cpu(), DType::Float64);
  const Tensor var = norm.inputs[2].to(Device::cpu(), DType::Float64);
  const int64_t channels = mean.numel();
  Tensor gamma = norm.inputs[3].defined() ? norm.inputs[3].to(Device::cpu(), DType::Float64)
                                          : ones({channels}, {.dtype = DType::Float64});
  Tensor beta = norm.inputs[4].defined() ? norm.inputs[4].to(Device::cpu(), DType::Float64)
                                         : zeros({channels}, {.dtype = DType::Float64});
  const double eps = std::get<double>(norm.attr("eps")->value);
  const Tensor scale = gamma * rsqrt(var + eps);
  return {scale, beta - mean * scale};
}

// BatchNormalization (eval) on input 0 with the running statistics; ReLU and a residual add where the op has them.
Names batch_norm(OpContext& c, bool relu, bool residual) {
  warn_training(c, "exported with its running statistics (inference)");
  std::string y = c.in[0];
  if (!c.folded_into_conv) {
    const DType t = in_dtype(c, 0);
    const int64_t channels = c.first.inputs[0].size(1);
    std::string scale = c.in[3], bias = c.in[4];
    if (scale.empty()) scale = c.b.initializer("ones", ones({channels}, {.dtype = t}));
    if (bias.empty()) bias = c.b.initializer("zeros", zeros({channels}, {.dtype = t}));
    y = c.b.add("BatchNormalization", {c.in[0], scale, bias, c.in[1], c.in[2]},
                {{"epsilon", static_cast<float>(c.f("eps"))}});
  }
  if (residual) y = c.b.add("Add", {c.b.cast(y, in_dtype(c, 0), out_dtype(c)), in_as_out(c, 5)});
  if (relu) y = c.b.add("Relu", {y});
  return {y};
}
Names t_batch_norm(OpContext& c) { return batch_norm(c, false, false); }
Names t_batch_norm_relu(OpContext& c) { return batch_norm(c, true, false); }
Names t_batch_norm_add_relu(OpContext& c) { return batch_norm(c, true, true); }

Names t_conv2d(OpContext& c) {
  if (in_rank(c, 0) != 4) refuse(c, "only batched (N, C, H, W) convolutions export; add a batch dim");
  const Tensor& weight = c.first.inputs[1];
  const std::vector<int64_t> pad = c.ints("padding");
  Attrs attrs{{"kernel_shape", std::vector<int64_t>{weight.size(2), weight.size(3)}},
              {"strides", c.ints("stride")},
              {"pads", std::vector<int64_t>{pad[0], pad[1], pad[0], pad[1]}},
              {"dilations", c.ints("dilation")},
              {"group", c.i("groups")}};
  std::string w = c.in[1], b = c.in[2];
  if (c.folded_norm != nullptr) {
    // w' = w * scale (per output channel), b' = b * scale + shift, computed in float64, stored in w's dtype.
    auto [scale, shift] = norm_affine(*c.folded_norm);
    const Tensor w64 = weight.to(Device::cpu(), DType::Float64);
    const Tensor folded_w = w64 * reshape(scale, {weight.size(0), 1, 1, 1});
    Tensor b64 = c.first.inputs[2].defined() ? c.first.inputs[2].to(Device::cpu(), DType::Float64)
                                             : zeros({weight.size(0)}, {.dtype = DType::Float64});
    const Tensor folded_b = b64 * scale + shift;
    w = c.b.initializer(c.in[1] + ".folded", folded_w.to(weight.dtype()));
    b = c.b.initializer(c.in[1] + ".folded_bias", folded_b.to(weight.dtype()));
  }
  Names in{c.in[0], w};
  if (!b.empty()) in.push_back(b);
  return {c.b.add("Conv", in, attrs)};
}

Attrs pool_attrs(OpContext& c) {
  const std::vector<int64_t> pad = c.ints("padding");
  return {{"kernel_shape", c.ints("kernel_size")},
          {"strides", c.ints("stride")},
          {"pads", std::vector<int64_t>{pad[0], pad[1], pad[0], pad[1]}},
          {"ceil_mode", c.i("ceil_mode")}};
}
Names t_max_pool2d(OpContext& c) {
  if (in_rank(c, 0) != 4) refuse(c, "only batched (N, C, H, W) pooling exports; add a batch dim");
  return {c.b.add("MaxPool", {c.in[0]}, pool_attrs(c))};
}
Names t_avg_pool2d(OpContext& c) {
  if (in_rank(c, 0) != 4) refuse(c, "only batched (N, C, H, W) pooling exports; add a batch dim");
  Attrs attrs = pool_attrs(c);
  attrs.emplace_back("count_include_pad", c.i("count_include_pad"));
  return {c.b.add("AveragePool", {c.in[0]}, attrs)};
}
Names t_adaptive_avg_pool2d(OpContext& c) {
  if (in_rank(c, 0) != 4) refuse(c, "only batched (N, C, H, W) pooling exports; add a batch dim");
  const std::vector<int64_t> out = c.ints("output_size");
  if (out[0] == 1 && out[1] == 1) return {c.b.add("GlobalAveragePool", {c.in[0]})};
  const Tensor& x = c.first.inputs[0];
  const bool fixed = x.size(2) == c.second.inputs[0].size(2) && x.size(3) == c.second.inputs[0].size(3);
  if (!fixed || x.size(2) % out[0] != 0 || x.size(3) % out[1] != 0) {
    refuse(c, "an adaptive average pool exports only to 1x1, or to a size that divides a fixed input size");
  }
  const std::vector<int64_t> k{x.size(2) / out[0], x.size(3) / out[1]};
  return {c.b.add("AveragePool", {c.in[0]}, {{"kernel_shape", k}, {"strides", k}})};
}

// softmax(q k^T * scale + mask) @ v, with kiln's rule that a row whose every key is masked gives zeros.
Names t_scaled_dot_product_attention(OpContext& c) {
  Builder& b = c.b;
  const DType t = in_dtype(c, 0);
  const Tensor& q = c.first.inputs[0];
  const int64_t rank = q.dim();
  std::vector<int64_t> perm(static_cast<size_t>(std::max<int64_t>(rank, 2)));
  for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  const double scale = c.has("scale") ? c.f("scale") : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  std::string scores = b.add("MatMul", {c.in[0], b.add("Transpose", {c.in[1]}, {{"perm", perm}})});
  scores = b.add("Mul", {scores, b.scalar(scale, t)});
  bool masked = false;
  if (!c.in[3].empty()) {
    masked = true;
    if (in_dtype(c, 3) == DType::Bool) {
      scores = b.add("Where", {c.in[3], scores, b.scalar(-std::numeric_limits<double>::infinity(), t)});
    } else {
      scores = b.add("Add", {scores, b.cast(c.in[3], in_dtype(c, 3), t)});
    }
  }
  if (c.i("is_causal") != 0) {
    masked = true;
    const int64_t la = q.size(-2), lb = c.second.inputs[0].size(-2);
    const int64_t sa = c.first.inputs[1].size(-2), sb = c.second.inputs[1].size(-2);
    const std::string shape = b.shape_list({la, sa}, {lb, sb}, false, "the causal mask " + c.where);
    const std::string blocked = b.add("ConstantOfShape", {shape}, {{"value", fill_value(-INFINITY, t)}});
    scores = b.add("Add", {scores, b.add("Trilu", {blocked, b.int_scalar(1)}, {{"upper", int64_t{1}}})});
  }
  std::string p = b.add("Softmax", {scores}, {{"axis", int64_t{-1}}});
  if (masked) p = b.add("Where", {b.add("IsNaN", {p}), b.scalar(0, t), p});
  if (c.f("dropout_p") > 0) {
    c.warnings.push_back("export_onnx: scaled_dot_product_attention " + c.where +
                         " has dropout_p > 0; the exported model has no attention dropout (inference)");
  }
  return {b.add("MatMul", {p, c.in[2]})};
}

}  // namespace

Translate find_translation(const std::string& op) {
  static const std::unordered_map<std::string, Translate> kTable = {
      {"add", t_add},
      {"sub", t_sub},
      {"mul", t_mul},
      {"div", t_div},
      {"pow", t_pow},
      {"maximum", t_maximum},
      {"minimum", t_minimum},
      {"add_scalar", t_add_scalar},
      {"sub_scalar", t_sub_scalar},
      {"rsub_scalar", t_rsub_scalar},
      {"mul_scalar", t_mul_scalar},
      {"div_scalar", t_div_scalar},
      {"rdiv_scalar", t_rdiv_scalar},
      {"pow_scalar", t_pow_scalar},
      {"rpow_scalar", t_rpow_scalar},
      {"eq", t_eq},
      {"ne", t_ne},
      {"lt", t_lt},
      {"le", t_le},
      {"gt", t_gt},
      {"ge", t_ge},
      {"logical_and", t_logical_and},
      {"logical_or", t_logical_or},
      {"logical_xor", t_logical_xor},
      {"neg", t_neg},
      {"abs", t_abs},
      {"exp", t_exp},
      {"expm1", t_expm1},
      {"log", t_log},
      {"log1p", t_log1p},
      {"log2", t_log2},
      {"sqrt", t_sqrt},
      {"rsqrt", t_rsqrt},
      {"sin", t_sin},
      {"cos", t_cos},
      {"tanh", t_tanh},
      {"erf", t_erf},
      {"sigmoid", t_sigmoid},
      {"relu", t_relu},
      {"silu", t_silu},
      {"sign", t_sign},
      {"floor", t_floor},
      {"ceil", t_ceil},
      {"round", t_round},
      {"reciprocal", t_reciprocal},
      {"square", t_square},
      {"gelu", t_gelu},
      {"clamp", t_clamp},
      {"where", t_where},
      {"masked_fill", t_masked_fill},
      {"view", t_reshape},
      {"reshape", t_reshape},
      {"flatten", t_reshape},
      {"unflatten", t_reshape},
      {"squeeze", t_reshape},
      {"unsqueeze", t_reshape},
      {"permute", t_permute},
      {"transpose", t_transpose},
      {"expand", t_expand},
      {"narrow", t_narrow},
      {"slice", t_slice},
      {"select", t_select},
      {"split", t_split},
      {"split_with_sizes", t_split},
      {"chunk", t_split},
      {"unbind", t_split},
      {"to", t_cast},
      {"cast", t_cast},
      {"contiguous", t_identity},
      {"clone", t_identity},
      {"sum", t_sum},
      {"mean", t_mean},
      {"prod", t_prod},
      {"amax", t_amax},
      {"amin", t_amin},
      {"logsumexp", t_logsumexp},
      {"norm", t_norm},
      {"max_dim", t_max_dim},
      {"min_dim", t_min_dim},
      {"softmax", t_softmax},
      {"log_softmax", t_log_softmax},
      {"matmul", t_matmul},
      {"addmm", t_addmm},
      {"outer", t_outer},
      {"embedding", t_embedding},
      {"index_select", t_index_select},
      {"gather", t_gather},
      {"cat", t_cat},
      {"stack", t_stack},
      {"tril", t_tril},
      {"triu", t_triu},
      {"full", t_full},
      {"full_like", t_full_like},
      {"arange", t_arange},
      {"dropout", t_dropout},
      {"linear", t_linear},
      {"layer_norm", t_layer_norm},
      {"add_layer_norm", t_add_layer_norm},
      {"dropout_add_layer_norm", t_add_layer_norm},
      {"batch_norm", t_batch_norm},
      {"batch_norm_relu", t_batch_norm_relu},
      {"batch_norm_add_relu", t_batch_norm_add_relu},
      {"conv2d", t_conv2d},
      {"max_pool2d", t_max_pool2d},
      {"avg_pool2d", t_avg_pool2d},
      {"adaptive_avg_pool2d", t_adaptive_avg_pool2d},
      {"scaled_dot_product_attention", t_scaled_dot_product_attention},
  };
  auto it = kTable.find(op);
  return it == kTable.end() ? nullptr : it->second;
}

}  // namespace kiln::io::onnx
