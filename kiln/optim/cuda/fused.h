// kiln/optim/cuda/fused.h — the fused multi-tensor CUDA kernels of kiln/optim (internal; no CUDA header).
//
//   #if KILN_WITH_CUDA
//   if (params[0].is_cuda())
//     cuda_impl::fused_adam(params, grads, exp_avgs, exp_avg_sqs, {}, steps, {.lr = 1e-3}, grad_scale, found_inf);
//   #endif
//
// Every function takes index-aligned lists of contiguous tensors on one CUDA device and updates them with a
// few launches in total (tensors are cut into chunks; a launch covers many chunks of many tensors), on the
// current stream, without synchronising the host. Parameters, gradients and states are float32, float16 or
// bfloat16 (states and math in float32 when the parameter is 16-bit; lists of one dtype per call).
// Precisely: the optimizers take params of one dtype (float32, float16 or bfloat16), grads of the params'
// dtype, and float32 states whatever the params' dtype; the update is computed in float32 and a 16-bit
// parameter is rounded once (to nearest even) when stored. fused_unscale_and_check, fused_l2_norm and
// fused_scale accept lists that mix those three dtypes (one launch per dtype). Temporaries come from the
// caching allocator (no cudaMalloc once warm). Tensors may be views (e.g. narrow) as long as they are
// contiguous; misaligned ones take a scalar path. Argument errors throw kiln::Error naming the list and index.
//
// AMP hooks (as PyTorch's fused optimizers): `grad_scale` (undefined, or a 1-element float32 device tensor)
// divides every gradient before use; `found_inf` (undefined, or a 1-element float32 device tensor) makes the
// whole update a no-op when it is non-zero — parameters, states and step counts stay unchanged — so a
// GradScaler never has to read it on the host. Gradients are only read (PyTorch's fused Adam also writes the
// unscaled gradient back; these kernels do not).
//
// 16-bit shadows: `shadows` (empty, or one per parameter: undefined where none is kept) are float16 or bfloat16
// tensors of float32 parameters' shapes and strides. The kernel that writes the updated parameter also writes
// its value rounded once (to nearest even) into the shadow: what casting the parameter gives, without another
// pass over it. On a skipped step (found_inf) the shadow gets the unchanged parameter's cast. Autocast regions
// use these copies instead of casting the parameters again (kiln/autograd/autocast.h, autocast::shadow).
//
// Step counters: steps[i] is read by the update (which uses steps[i] + 1, as PyTorch increments first) and
// incremented by a second launch after it, so that all chunks of a tensor see the same count.
//
// Learning rates for CUDA graphs: with `lr_device` set (the memory of a 1-element float64 device tensor), the
// kernels read the learning rate there when they run, and `lr` is ignored; the update is bit for bit the one
// `lr` of the same value gives.
#pragma once

#include <vector>

#include "kiln/optim/sparse_rows.h"  // detail::SparseRule, detail::SparseHyper
#include "kiln/tensor/tensor.h"

namespace kiln::optim::cuda_impl {

using TensorVec = std::vector<Tensor>;

struct SgdHyper {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false;
  const double* lr_device = nullptr;
};
// momentum_buffers: empty when momentum == 0; otherwise one per parameter. `first_step` per parameter is
// implied by `steps`: steps[i] (1-element float32) == 0 means the buffer is initialised to the gradient (PyTorch).
// steps[i] is incremented (unless found_inf). With momentum == 0, steps may also be empty (nothing reads it).
void fused_sgd(const TensorVec& params, const TensorVec& grads, const TensorVec& momentum_buffers,
               const TensorVec& steps, const SgdHyper& h, const Tensor& grad_scale, const Tensor& found_inf,
               const TensorVec& shadows = {});

struct AdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled_weight_decay = false;  // AdamW
  bool amsgrad = false, maximize = false;
  const double* lr_device = nullptr;
};
// steps[i]: 1-element float32 device tensors, incremented in the kernel before the bias corrections (unless
// found_inf). max_exp_avg_sqs: empty unless amsgrad.
void fused_adam(const TensorVec& params, const TensorVec& grads, const TensorVec& exp_avgs,
                const TensorVec& exp_avg_sqs, const TensorVec& max_exp_avg_sqs, const TensorVec& steps,
                const AdamHyper& h, const Tensor& grad_scale, const Tensor& found_inf, const TensorVec& shadows = {});

// LAMB (Apex FusedLAMB with decoupled weight decay), per parameter with t = steps[i] + 1, bc = 1 - beta^t
// (or 1 without bias_correction):
//   g = grad / grad_scale;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   u = (m / bc1) / (sqrt(v / bc2) + eps) + weight_decay * p
//   p -= lr * trust * u,  trust = clamp(||p|| / ||u||, 0, max_trust_ratio), 1 where either norm is 0
// (norms over the whole parameter tensor, from per-chunk float32 sums added in a fixed order: deterministic).
struct LambHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-6, weight_decay = 0;
  bool bias_correction = true;
  double max_trust_ratio = 10.0;  // trust ratio = clamp(||p|| / ||update||, 0, max); 1 where either norm is 0
  const double* lr_device = nullptr;
};
void fused_lamb(const TensorVec& params, const TensorVec& grads, const TensorVec& exp_avgs,
                const TensorVec& exp_avg_sqs, const TensorVec& steps, const LambHyper& h, const Tensor& grad_scale,
                const Tensor& found_inf, const TensorVec& shadows = {});

// grads[i] *= inv_scale[0] for all i, and found_inf[0] = 1 if any element of any grad is inf or NaN (it is
// never reset to 0 here: callers zero it). inv_scale, found_inf: 1-element float32 device tensors.
void fused_unscale_and_check(const TensorVec& grads, const Tensor& found_inf, const Tensor& inv_scale);

// The L2 norm over all elements of all tensors, as a 1-element (0-d) float32 device tensor (squares summed
// in float32 per chunk of 64K elements, the chunk sums added in float64 in a fixed order: deterministic).
// Needs at least one tensor (for the device); tensors without elements add 0.
Tensor fused_l2_norm(const TensorVec& tensors);
// tensors[i] *= factor[0] (a 1-element float32 device tensor) for all i.
void fused_scale(const TensorVec& tensors, const Tensor& factor);

// Row-sparse updates (sparse.cu): `indices` (K) Int64 and `values` (K, D...) of the parameter's dtype, as
// SparseRowGrad holds them before coalescing (rows in any order, repeated rows summed in the entries' order), on the
// GPU that runs the update; only those rows of `param` and of its states change. `param`, its states and `step` are
// on that GPU, or all in page-locked host memory (a device-held gradient, sparse_grad.h), which the kernel reads and
// writes through its device mapping. Sgd: no state (no momentum). Adam (SparseAdam): states
// {exp_avg, exp_avg_sq}, float32 of the parameter's shape. RowWiseAdagrad: states {sum}, float32 (V). `step`: the
// parameter's 1-element float32 counter beside it, read as step + 1 (Adam's bias corrections, in double) and
// incremented after the update; grad_scale divides the summed gradient; found_inf != 0 makes it all a no-op. No host
// synchronisation. Sgd and Adam round each operation as the unfused kiln-op path does (bit-equal results).
using SparseRule = detail::SparseRule;
using SparseHyper = detail::SparseHyper;
// Whether fused_sparse_update takes this parameter for a gradient on `device`: contiguous, float32, float16 or
// bfloat16, on `device` (a GPU) or in page-locked host memory.
bool fuses_sparse(const Tensor& param, Device device);
void fused_sparse_update(const Tensor& param, const Tensor& indices, const Tensor& values, const TensorVec& states,
                         const Tensor& step, const SparseHyper& h, const Tensor& grad_scale, const Tensor& found_inf);

}  // namespace kiln::optim::cuda_impl
