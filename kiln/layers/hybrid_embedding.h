// kiln/layers/hybrid_embedding.h — nn::HybridEmbedding: a table too large for the GPU, its frequent ("hot") rows on
// the GPU and the others ("cold") in pinned host memory, looked up as one table.
//
//   auto emb = nn::make<nn::HybridEmbedding>(50'000'000, 64,
//       nn::HybridEmbeddingOptions{.device = Device::cuda(0), .hot_fraction = 0.05, .count_batches = 100});
//   Tensor h = emb(ids);                              // ids Int64 (B, S) on any device -> (B, S, 64) on cuda:0
//   optim::SparseAdam opt(emb->parameters(), {});      // "hot" (H, 64) on the GPU, "cold" (V - H, 64) on the host
//   emb->on_rebalance = [&](const nn::RowSwaps& s) {  // carry the optimizer's per-row state with the rows
//     emb->swap_state_rows(s, opt.state(emb->hot), opt.state(emb->cold));
//   };
//   ... every N steps, after opt.step() and zero_grad():  emb->rebalance();
//
// Placement: "slot" (V) Int64 says where each logical row lives: s >= 0 is row s of `hot`, s < 0 row -s - 1 of `cold`.
// The hot set is the H most frequent rows (ties: the lower row id first), by a given frequency table, or by the
// lookups counted over the first count_batches training-mode forward calls, after which the next forward rebalances
// once by itself; without either, rows 0..H-1 are hot (and stay so while counting).
// Gradients are row-sparse (kiln/autograd/sparse_grad.h): the hot rows' in `hot` (on the device), the cold rows' in
// `cold` (on the host; with ColdReads::Mapped held on the device), so a sparse optimizer (optim::SGD, SparseAdam,
// RowWiseAdagrad) given both parameters updates each row, and keeps its state, in the row's own tier.
// state_dict() presents one logical table: "weight" (V, D) in row order on the CPU (a new tensor, not sharing the
// tiers' memory), "slot", "counts" and "calls_counted" (where the counting of count_batches stands); loading one
// restores the saved placement and counting phase and scatters the table into the tiers.
// Host memory for a large table: state_dict() builds that one table beside the tiers (plus a host copy of the hot
// tier); load_state_dict() takes the given table as it is (no staging copy) and writes it into the tiers 64 MiB of
// rows at a time.
// counts accumulate from construction (or from the loaded state): counts.zero_() forgets the past.
// Data parallelism with replicated tables (every rank holds the whole table; dist::all_gather_sparse_grads averages
// the gradients): each rank sees only its own batches, so the ranks must agree on the counts before they place rows.
// dist::share_placement(model) (kiln/distributed/hybrid_placement.h) sets count_reduction, a sum over the ranks;
// training-mode lookups are then counted in a pending (V) count of this rank's own, and every rebalance first adds the
// pending counts' sum over the ranks to counts (agree_counts()), so every rank holds the same counts and chooses the
// same placement. Every rank must make the same training-mode forward calls and call rebalance() (and agree_counts())
// at the same points, as it does in a data-parallel loop.
// On the CPU, and on a GPU with ColdReads::Copy, a lookup reads the ids on the host (placement, counts and the range
// check are there; ids on a GPU are copied back, which waits for them), gathers the cold rows there and copies them
// over. With ColdReads::Mapped (the default on a GPU) the placement is mirrored on the device (an Int32 copy of slot,
// 4 bytes a row, with 4 more a row for the counts: device_placement_bytes()): one kernel reads each id's place, counts
// it, and gathers the row from the hot tier or, through the mapping, from the page-locked cold tier, so a lookup
// waits for nothing, whether its ids are on the host or on the GPU. Its cold rows' gradients stay on the device, for
// the optimizer to update the cold rows from the device. In that mode:
//   - The GPU reads and writes the cold tier (and the optimizer's state of it) asynchronously: this module's own host
//     accesses (state_dict, rebalance, load, a move) wait for the device first, as Optimizer::state_dict does; code
//     that reads `cold` or its optimizer state directly calls cuda::synchronize() first.
//   - Lookups are counted on the device and added to counts by agree_counts(), rebalance(), state_dict() and a move:
//     code that reads `counts` directly calls agree_counts() first.
//   - Ids given on the host are checked by the call; ids on the GPU by the kernel, whose error (naming the table and
//     the id) is thrown at the next synchronisation or index op, as kiln's index ops report theirs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/layers/module.h"     // nn::Module
#include "kiln/tensor/generator.h"  // Generator (reset_parameters)

namespace kiln::nn {

// How a lookup on a GPU brings the cold rows it needs to the device, and where their gradients are applied.
enum class ColdReads {
  // Gathered on the host, then one copy to the device. Backward copies the cold rows' gradients to the host (a
  // wait), and the optimizer updates them there.
  Copy,
  // Read by a GPU kernel straight from the page-locked host table (no host gather, no staging copy). The cold rows'
  // gradients stay on the device (device-held, kiln/autograd/sparse_grad.h), and the optimizers' fused updates
  // (SGD, SparseAdam, RowWiseAdagrad) write the rows and their state, in page-locked host memory,
  // from the device: the step has no host synchronisation. An update without a fused form copies the gradient to
  // the host first.
  Mapped,
};

// Options of nn::HybridEmbedding.
struct HybridEmbeddingOptions {
  Device device = Device::cpu();  // where the hot rows live and where lookups return their rows
  int64_t hot_rows = -1;          // H, in [0, num_embeddings]; -1: round(hot_fraction * num_embeddings)
  double hot_fraction = 0.1;      // in [0, 1], used when hot_rows is -1
  // (num_embeddings), any real or integer dtype: how often each row is looked up. The H largest are hot at
  // construction, and rebalance() adds them to the counted lookups (a prior of that many lookups).
  Tensor frequencies{};
  // > 0: count the ids of the first count_batches training-mode forward calls, then rebalance once by itself (at the
  // start of the next forward call at which neither tier holds a gradient, so never between a backward and its step).
  // With a count_reduction only a training-mode call rebalances by itself, once no rank's tiers hold a gradient (the
  // ranks decide together, so they rebalance at the same call; evaluation may run on some ranks only).
  int64_t count_batches = 0;
  // On a GPU (ignored on the CPU); the member cold_reads can change it later. Mapped is the default: with the fused
  // sparse updates it was 12% faster per step than Copy in the recsys example (examples/recsys/README.md).
  ColdReads cold_reads = ColdReads::Mapped;
};

// Rows that a rebalance swapped between the tiers: hot row hot_slots[i] and cold row cold_slots[i] traded places.
// Both (M) Int64 on the CPU. Any per-row companion of the tiers (optimizer state) follows with swap_rows.
struct RowSwaps {
  Tensor hot_slots;   // (M) Int64 on the CPU: the hot slots whose rows move to the host
  Tensor cold_slots;  // (M) Int64 on the CPU: the cold slots whose rows take their places on the device
  // M, the number of swaps.
  int64_t size() const { return hot_slots.defined() ? hot_slots.numel() : 0; }
};

// Integer ids (...) -> (..., embedding_dim) on options.device. "hot" (H, D) on options.device and "cold" (V - H, D) on
// the CPU (pinned when the device is a GPU) start N(0, 1) and take row-sparse gradients. Buffers "slot" (V) Int64
// and "counts" (V) Int64 (the ids seen by training-mode forward calls) stay on the CPU. No padding row.
class HybridEmbedding : public Module {
 public:
  // kiln::Error unless both sizes are positive, hot_rows is -1 or in [0, num_embeddings], hot_fraction in [0, 1],
  // count_batches >= 0, and frequencies (when given) is 1-D of num_embeddings numbers.
  HybridEmbedding(int64_t num_embeddings, int64_t embedding_dim, HybridEmbeddingOptions options = {});
  // ids of any integer dtype on any device; kiln::Error naming the table (its place in the model, path(), and its
  // shape: `HybridEmbedding "tables.3" (1000 x 16 table)`) and the id for one outside [0, num_embeddings), thrown
  // by this call (the ids are checked on the host). In training mode, adds the ids to counts (with a
  // count_reduction: to this rank's pending counts).
  Tensor forward(const Tensor& ids) override;
  // Makes the H rows of highest counts (+ frequencies) hot, ties to the lower row id; rows already in the right tier
  // stay where they are, so only the rows that change tier move. Values move exactly; the swaps are returned and
  // given to on_rebalance. kiln::Error while either tier holds a gradient (call it after the step and zero_grad).
  // With a count_reduction it is a collective: the ranks first agree that no rank's tiers hold a gradient (else every
  // rank raises the error), then on the counts (agree_counts()), so every rank makes the same swaps.
  RowSwaps rebalance();
  // With a count_reduction: adds the lookups counted by every rank since the last agreement (their sum over the
  // ranks) to counts, and starts the pending counts again from zero; a collective, which every rank calls at the
  // same point (before saving counts in a checkpoint, say: saved counts hold only agreed lookups). Without one, the
  // lookups are in counts already (those left pending by a count_reduction since unset are added now). kiln::Error
  // when count_reduction gives back a tensor of another shape, dtype or device than the (V) Int64 CPU tensor it was
  // given.
  void agree_counts();
  // Bytes of GPU memory the placement takes beside the hot tier: with mapped cold reads on a GPU, a copy of slot as
  // Int32 and the lookups counted there, 8 bytes a row (0 until the first lookup; none on the CPU or with Copy).
  int64_t device_placement_bytes() const;
  // Redraws both tiers from N(0, 1) (from gen, or the default generator): hot first, then cold, each in slot order.
  void reset_parameters(Generator* gen = nullptr);
  // The logical table (num_embeddings, embedding_dim) in row order, a new tensor on the CPU.
  Tensor table() const;
  // Where a logical row lives (slot's value for it): >= 0 a hot slot, < 0 the cold slot -s - 1.
  int64_t slot_of(int64_t row) const;

  // Applies `swaps` to a pair of per-row tensors (hot_like (H, ...), cold_like (V - H, ...), on any devices): their
  // rows trade places as the tiers' rows did. In place, exact.
  static void swap_rows(const RowSwaps& swaps, const Tensor& hot_like, const Tensor& cold_like);
  // swap_rows on every per-row tensor of an optimizer's state of `hot` and of `cold` (optim::Optimizer::state(p)):
  // the pairs of the same name whose first dims are H and V - H (exp_avg, exp_avg_sq, momentum_buffer, SGD's
  // momentum_mask, RowWiseAdagrad's sum). The others (step counters) are left alone. kiln::Error for a name present on
  // one side only: its rows could not follow (both tiers take a gradient, possibly empty, on every lookup, so a
  // sparse optimizer steps both).
  void swap_state_rows(const RowSwaps& swaps, std::map<std::string, Tensor>& hot_state,
                       std::map<std::string, Tensor>& cold_state) const;

  int64_t num_embeddings;  // V, the logical table's rows
  int64_t embedding_dim;   // D
  int64_t hot_rows;        // H
  Device device;           // where hot lives (to() changes it)
  int64_t count_batches;   // options.count_batches
  ColdReads cold_reads;    // options.cold_reads: how lookups on a GPU read cold rows (change it between steps only)
  Tensor hot;              // parameter (H, D) on the device: the hot rows, by hot slot
  Tensor cold;             // parameter (V - H, D) in host memory: the cold rows, by cold slot
  Tensor slot;             // buffer (V) Int64 on the CPU: row r's place, s >= 0 hot slot s, s < 0 cold slot -s - 1
  Tensor counts;           // buffer (V) Int64 on the CPU: the lookups of each row seen in training mode
  // Called by every rebalance (the automatic one too) with its swaps: the place to move optimizer state.
  std::function<void(const RowSwaps&)> on_rebalance;
  // Under data parallelism with replicated tables (dist::share_placement sets it): sums an Int64 tensor on the CPU
  // over the ranks, in place (or by assigning a tensor of the same shape, dtype and device), a collective that every
  // rank calls with the same shape. Set, it makes counts the sum of every rank's lookups as of the last agreement,
  // the same on every rank (the lookups since then are pending, counted per rank in one more (V) Int64 array, made at
  // the first counted call). Set it before the first training-mode forward call: counts present then (zero, or
  // loaded from a checkpoint) count as agreed.
  std::function<void(Tensor&)> count_reduction;

 protected:
  // "weight" (V, D) (table()), "slot", "counts", and "calls_counted" (an Int64 scalar: the forward calls counted so far
  // while count_batches runs, -1 once its rebalance is done), so that a resumed run rebalances at the same step.
  StateDict own_state() const override;
  // The given "weight" itself when it is whole (read by finish_load_state, not copied), else a staging copy of the
  // table; staging copies of the other three, filled with the current values (so a partial load keeps the rest). A
  // given "slot" must place H rows in hot slots 0..H-1 and the others in cold slots 0..V-H-1, each once;
  // "calls_counted" must be an integer >= -1.
  StateDict own_load_targets(const std::function<const Tensor*(const std::string&)>& given) override;
  // Adopts the staged placement, counts and counting phase (a "slot" given without "calls_counted" ends the
  // counting phase), and scatters the table into the tiers.
  void finish_load_state() override;
  // Drops the staging of a load that failed (a staged copy of the table can be as large as the table).
  void abandon_load_state() override;
  // The hot tier (and its dense gradient) follows the device; cold stays on the CPU (pinned when the device is a GPU)
  // and both follow a dtype; slot and counts stay.
  void to_own(const MoveRequest& request) override;

 private:
  // cold's rows at cold_slots (N cold slots) as (N, D) on `device`: the one place cold rows cross to the device, by
  // cold_reads (a host gather first waits for the device's access: wait_for_device_access). device_slots: the same
  // slots already on the device, when at hand (a mapped read uses them).
  Tensor gather_cold(const std::vector<int64_t>& cold_slots, const Tensor& device_slots);
  // Whether the device reads the cold tier through its mapping, and its gradients stay on the device (updated
  // through the mapping too): ColdReads::Mapped on a GPU.
  bool maps_cold() const;
  // Waits for the GPU kernels that may still read or write the cold tier through its mapping (a lookup, and the
  // optimizer's update of its device-held gradient) before the host reads or writes it: a host gather, table() and
  // state_dict, rebalance, load, reset_parameters, a move. While mapped it always waits; after a switch to
  // ColdReads::Copy, once.
  void wait_for_device_access() const;
  // Sets slot from per-row scores (V doubles): the top H hot. Used at construction (no values to move).
  void place_by(const std::vector<double>& score);
  std::vector<double> scores() const;  // counts + frequencies, per row
  // count_reduction(t), then the check that t kept its shape, dtype (Int64) and device (the CPU); `what` names t.
  void sum_over_ranks(Tensor& t, const char* what) const;
  // Whether `mine` holds on any rank (with a count_reduction: a sum of flags over the ranks; else just `mine`).
  bool on_any_rank(bool mine) const;
  // The rebalance after its gradient check: agree_counts(), then the placement of the scores and the swaps.
  RowSwaps place_and_swap();

  std::vector<double> frequencies_;  // options.frequencies as doubles, or empty
  int64_t calls_counted_ = 0;        // training-mode forward calls counted so far (while counting)
  bool counting_ = false;            // the automatic rebalance is still ahead
  bool slot_given_ = false;    // the load being staged has a "slot" (without "calls_counted", it ends the counting)
  bool calls_given_ = false;   // the load being staged has "calls_counted"
  bool counts_given_ = false;  // the load being staged has "counts" (they replace the pending ones too)
  Tensor pending_;             // (V) Int64 on the CPU: this rank's lookups since the last agreement, or none
  Tensor staged_weight_, staged_slot_, staged_counts_, staged_calls_;  // load_state_dict's staging (own_load_targets)
  Tensor calls_state() const;  // "calls_counted": calls counted while counting, -1 once the counting phase is over
  // The device of the mapped lookups since the last wait (set by a mapped lookup): a switch to ColdReads::Copy waits
  // for it once (wait_for_device_access).
  mutable std::optional<Device> device_access_;

  // The placement on the device. With mapped cold reads (and at most 2^31 - 1 rows) a lookup reads the placement on
  // the GPU, counts there, and gathers both tiers' rows in one kernel, so no host work stands between the ids and
  // the rows: device_slot_ (V) Int32 mirrors slot (made again when slot's storage version moves, device_slot_version_),
  // and device_counts_ (V) Int32 holds the training lookups counted since they were last added to counts (or to the
  // pending counts under a count_reduction) by fold_device_counts, device_counted_ of them.
  bool places_on_device() const;
  const Tensor& device_slot();
  Tensor placed_forward(const Tensor& ids, const Tensor& host_ids);  // host_ids: (N) Int64 on the CPU, or undefined
  void fold_device_counts() const;  // waits for the device; adds device_counts_ to counts (or pending_) and zeroes it
  Tensor device_slot_;
  uint64_t device_slot_version_ = 0;
  mutable Tensor device_counts_;
  mutable int64_t device_counted_ = 0;
};

}  // namespace kiln::nn
