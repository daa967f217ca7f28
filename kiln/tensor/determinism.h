// kiln/tensor/determinism.h — deterministic mode: bit-for-bit reproducible GPU training.
//
//   kiln::set_deterministic(true);   // as torch.use_deterministic_algorithms(True) + cudnn.deterministic
//   kiln::manual_seed(0);            // same seed, same data order, same program: the same bits every run
//
// Off by default. When on, kiln's CUDA ops give the same bits for the same inputs on the same GPU model,
// driver, CUDA/cuDNN/cuBLAS versions and kiln build, run after run and across processes (so a run resumed
// from a checkpoint continues exactly as one that was never interrupted). What it changes:
//   - scatter_add / scatter_add_ / index_add on floating-point CUDA tensors (and what is built on them:
//     the embedding backward, the backward of index_select, gather and masked_select) sort the writes by
//     target and sum each target's contributions one after another in index order (accumulating 16-bit
//     floats in float) instead of adding with atomics, whose order varies from run to run. Cost: a radix
//     sort of the (target, position) pairs — two Int64 buffers of index.numel() entries and a few passes
//     over them; the embedding backward of a BERT-base batch takes about as long as the matmuls around it.
//     Integer and Bool scatter_add need no change (integer addition does not depend on the order).
//   - scatter / scatter_ on CUDA tensors (any dtype) sort the same way, so that of duplicate indices the
//     last in index order wins (as on the CPU) rather than whichever thread wrote last.
//   - cuDNN convolutions (forward, backward-data, backward-filter) choose only algorithms that cuDNN
//     reports as CUDNN_DETERMINISTIC, and always by cuDNN's heuristics: nn::set_cudnn_benchmark(true) is
//     ignored while the switch is on, because timing may pick a different (if deterministic) algorithm in
//     another process, and different algorithms round differently. A problem for which cuDNN offers no
//     deterministic algorithm throws kiln::NotImplementedError naming the pass and the shapes.
//   - cuDNN fused attention builds its backward graph with the frontend's deterministic algorithm (on
//     Hopper: a dP workspace instead of atomic dQ accumulation; somewhat slower and more memory). Where
//     cuDNN cannot run that (e.g. with dropout on Blackwell) fused_attention_supported() says no, and the
//     attention runs unfused (deterministic: matmul + softmax).
//   - cuBLASLt matrix products (float and FP8) keep the heuristic's algorithm: the timing of large products
//     (cuda::set_matmul_tuning) is skipped, since another process could time differently and pick an algorithm
//     that rounds differently.
// What needs no change: each cuBLAS/cuBLASLt algorithm is deterministic as kiln calls it (a fixed 32 MiB
// workspace per stream; atomics mode left at CUBLAS_ATOMICS_NOT_ALLOWED; split-K reductions cuBLASLt may pick
// are ordered, not atomic); kiln's
// reductions, softmax, normalisations and losses use fixed launch geometries and no atomics; dropout and
// other random ops draw from kiln's Philox generators (kiln::default_generator, saved in checkpoints); the
// data loader draws from per-sample SampleRngs.
// The algorithm caches (cuDNN convolutions, fused attention, cuBLASLt products) key on the switch, so it may be flipped
// at any time; a change affects ops launched after it. Process-wide and thread-safe; no effect on the CPU backend,
// whose kernels are deterministic already.
#pragma once

namespace kiln {

void set_deterministic(bool enabled);  // turns deterministic mode on or off, process-wide
bool deterministic();                  // whether it is on

// Sets the switch for a scope and restores the previous value on exit.
class DeterministicGuard {
 public:
  // Sets the switch to `enabled`, remembering the previous value.
  explicit DeterministicGuard(bool enabled) : previous_(deterministic()) { set_deterministic(enabled); }
  ~DeterministicGuard() { set_deterministic(previous_); }
  DeterministicGuard(const DeterministicGuard&) = delete;
  DeterministicGuard& operator=(const DeterministicGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace kiln
