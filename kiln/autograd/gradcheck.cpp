// gradcheck: the Jacobian of fn at inputs, once by backward (one pass per output element) and once by
// central differences (two forward passes per input element), compared element by element.
#include "kiln/autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "kiln/autograd/engine.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::autograd {
namespace {

// Offset (in elements, from data_ptr) of the element with row-major flat index k.
int64_t element_offset(const Tensor& t, int64_t k) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    const int64_t size = t.size(d);
    off += (k % size) * t.stride(d);
    k /= size;
  }
  return off;
}

// The floating outputs of fn, flattened to float64 values.
std::vector<std::vector<double>> output_values(const TensorList& outs) {
  std::vector<std::vector<double>> values;
  for (const Tensor& o : outs) {
    if (o.defined() && o.is_floating_point()) values.push_back(o.to_vector<double>());
  }
  return values;
}

}  // namespace

bool gradcheck(const DifferentiableFn& fn, const TensorList& inputs, const GradcheckOptions& options) {
  std::vector<size_t> checked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !t.requires_grad()) continue;
    KILN_CHECK(t.dtype() == DType::Float64 && t.is_cpu(), "gradcheck: input ", i, " is ", t.dtype(), " on ", t.device(),
               "; gradcheck needs CPU float64 inputs (finite differences in lower precision are too ",
               "coarse). Use .to(DType::Float64) on the CPU");
    checked.push_back(i);
  }
  KILN_CHECK(!checked.empty(), "gradcheck: no input requires grad; call requires_grad_() on those to check");

  // Analytic Jacobian: analytic[out][j][input][k] = d out_j / d input_k, one backward per output element.
  TensorList outs = fn(inputs);
  std::vector<size_t> out_index;  // floating outputs that require grad
  for (size_t o = 0; o < outs.size(); ++o) {
    if (outs[o].defined() && outs[o].is_floating_point()) out_index.push_back(o);
  }
  KILN_CHECK(!out_index.empty(), "gradcheck: fn returned no floating-point output");
  TensorList checked_inputs;
  for (size_t i : checked) checked_inputs.push_back(inputs[i]);

  std::vector<std::vector<std::vector<std::vector<double>>>> analytic(out_index.size());
  for (size_t oi = 0; oi < out_index.size(); ++oi) {
    const Tensor& out = outs[out_index[oi]];
    analytic[oi].resize(out.numel());
    for (int64_t j = 0; j < out.numel(); ++j) {
      if (!out.requires_grad()) {
        for (size_t i : checked) analytic[oi][j].push_back(std::vector<double>(inputs[i].numel(), 0.0));
        continue;
      }
      Tensor seed = internal::zeros(out.shape(), {.dtype = DType::Float64});  // one-hot at element j
      seed.data_ptr<double>()[j] = 1.0;
      seed = internal::to(seed, out.device(), out.dtype());
      TensorList grads = grad({out}, checked_inputs, {seed}, /*retain_graph=*/true, /*allow_unused=*/true);
      for (size_t c = 0; c < checked.size(); ++c) {
        const Tensor& in = inputs[checked[c]];
        if (!grads[c].defined()) {
          analytic[oi][j].push_back(std::vector<double>(in.numel(), 0.0));
          continue;
        }
        KILN_CHECK(grads[c].shape() == in.shape(), "gradcheck: the gradient for input ", checked[c], " has shape ",
                   grads[c].shape(), " but the input has shape ", in.shape());
        analytic[oi][j].push_back(grads[c].to_vector<double>());
      }
    }
  }

  // Numeric Jacobian, column by column: perturb one input element, re-run fn without recording.
  NoGradGuard no_grad;
  for (size_t c = 0; c < checked.size(); ++c) {
    const Tensor& in = inputs[checked[c]];
    double* base = in.data_ptr<double>();
    for (int64_t k = 0; k < in.numel(); ++k) {
      double* p = base + element_offset(in, k);
      const double orig = *p;
      *p = orig + options.eps;
      auto plus = output_values(fn(inputs));
      *p = orig - options.eps;
      auto minus = output_values(fn(inputs));
      *p = orig;
      for (size_t oi = 0; oi < out_index.size(); ++oi) {
        for (size_t j = 0; j < plus[oi].size(); ++j) {
          const double numeric = (plus[oi][j] - minus[oi][j]) / (2 * options.eps);
          const double a = analytic[oi][j][c][k];
          const bool ok = std::abs(a - numeric) <= options.atol + options.rtol * std::abs(numeric) ||
                          (std::isnan(a) && std::isnan(numeric));
          KILN_CHECK(ok, "gradcheck: d output", out_index[oi], "[", j, "] / d input", checked[c], "[", k,
                     "]: backward gives ", a, ", finite differences give ", numeric, " (eps ", options.eps, ", atol ",
                     options.atol, ", rtol ", options.rtol, ")");
        }
      }
    }
  }
  return true;
}

}  // namespace kiln::autograd
