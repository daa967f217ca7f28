// kiln/distributed/process_group.h — collectives over the processes of the job.
//
//   Tensor t = kiln::ones({4}, {.device = env.device()});
//   dist::all_reduce(t);                                    // sum over every rank, in place
//   dist::all_reduce(t, dist::ReduceOp::Average);
//   auto work = dist::group(t.device()).all_reduce_async(t, dist::ReduceOp::Max);
//   ...                                                     // other work overlaps with the collective
//   work->wait();                                           // GPU: the current stream waits (no host sync)
//
// Each device type has one world group: NCCL for CUDA tensors (its collectives run on the group's own
// communication stream, ordered after the work already queued on the caller's current stream), MPI for
// CPU tensors. With world size 1 every collective is a no-op (all_gather copies). Tensors must be
// contiguous, of the group's device, and of the same shape and dtype on every rank; every rank must call
// the same collectives in the same order. Each collective has a sequence number; a collective that does
// not finish within init()'s timeout aborts the group and, by default, ends the process (environment.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kiln/distributed/environment.h"
#include "kiln/tensor/tensor.h"

namespace kiln::dist {

// How a reduction combines the ranks' values, elementwise (Average: the sum divided by the number of ranks).
enum class ReduceOp { Sum, Average, Max, Min };
const char* to_string(ReduceOp op);  // "Sum", "Average", "Max" or "Min"

// The handle of an asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  // GPU: the calling thread's current stream waits for the collective (the host does not). CPU: the host
  // waits. Throws DistributedError / TimeoutError when the collective failed.
  virtual void wait() = 0;
  // The host waits until the collective has finished.
  virtual void synchronize() = 0;
  // Whether the collective has finished (a host-side query that never blocks).
  virtual bool is_completed() = 0;
};
// What the *_async collectives return.
using WorkPtr = std::shared_ptr<Work>;

// A set of ranks and the collectives between them (NCCL on GPUs, MPI on the CPU).
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual std::string backend() const = 0;  // "nccl", "mpi" or "single"
  // The device whose tensors the collectives take: the group's GPU (NCCL), the CPU (MPI), or the single group's.
  virtual Device device() const = 0;
  // This process's rank in the group, 0 .. size() - 1.
  int rank() const { return rank_; }
  // The number of ranks in the group.
  int size() const { return size_; }
  // Collectives issued so far (the next one gets this sequence number).
  uint64_t sequence_number() const { return seq_; }

  // In place: every rank ends with the reduction of all ranks' `tensor`.
  virtual WorkPtr all_reduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  // In place: every rank ends with root's `tensor`.
  virtual WorkPtr broadcast_async(const Tensor& tensor, int root = 0) = 0;
  // out holds size() blocks of input.numel() elements (any shape with that many, e.g. (size(), *input.shape));
  // block r gets rank r's input.
  virtual WorkPtr all_gather_async(const Tensor& out, const Tensor& input) = 0;
  // input holds size() blocks of out.numel() elements; out gets the reduction over ranks of block rank().
  virtual WorkPtr reduce_scatter_async(const Tensor& out, const Tensor& input, ReduceOp op = ReduceOp::Sum) = 0;
  // Returns once every rank has called it (the host waits, for GPU groups too).
  virtual void barrier() = 0;

  // all_reduce_async(tensor, op)->wait(): on a GPU the current stream waits, not the host.
  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) { all_reduce_async(tensor, op)->wait(); }
  // broadcast_async(tensor, root)->wait().
  void broadcast(const Tensor& tensor, int root = 0) { broadcast_async(tensor, root)->wait(); }
  // all_gather_async(out, input)->wait().
  void all_gather(const Tensor& out, const Tensor& input) { all_gather_async(out, input)->wait(); }
  // reduce_scatter_async(out, input, op)->wait().
  void reduce_scatter(const Tensor& out, const Tensor& input, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(out, input, op)->wait();
  }

 protected:
  // For backends: this process's rank and the group's size.
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  // Checks what every collective needs (defined, contiguous, on `device`, a dtype the backend takes) and
  // returns the collective's sequence number. `what` names the collective in messages.
  uint64_t begin(const char* what, const Tensor& t, Device device);
  // The same checks for a second tensor of collective #seq (all_gather's and reduce_scatter's out).
  void check_tensor(const char* what, uint64_t seq, const Tensor& t, Device device) const;
  int rank_;          // what rank() returns
  int size_;          // what size() returns
  uint64_t seq_ = 0;  // what sequence_number() returns; begin() increments it
};

// The world group for tensors on `device` (CUDA devices: NCCL, on this process's GPU; cpu: MPI), created
// on first use. Calls init() with default options if it was not called.
ProcessGroup& group(Device device);

// The collectives on the world group of the tensor's device.
inline void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) { group(t.device()).all_reduce(t, op); }
// ProcessGroup::broadcast on the world group of t's device.
inline void broadcast(const Tensor& t, int root = 0) { group(t.device()).broadcast(t, root); }
// ProcessGroup::all_gather on the world group of input's device.
inline void all_gather(const Tensor& out, const Tensor& input) { group(input.device()).all_gather(out, input); }
// ProcessGroup::reduce_scatter on the world group of input's device.
inline void reduce_scatter(const Tensor& out, const Tensor& input, ReduceOp op = ReduceOp::Sum) {
  group(input.device()).reduce_scatter(out, input, op);
}
// Every rank waits for every other (through the CPU group when there is one, else the GPU group).
void barrier();

// amp::Fp8Recipe::amax_reduction for data parallelism: the FP8 amaxes replaced in place by their maximum over every
// rank (all_reduce Max on the world group of their device), so that every rank computes the same scales. A NaN amax
// (a step whose tensor held a NaN) may not survive the maximum (MPI and NCCL order NaN differently), but every rank
// gets the same result.
std::function<void(const Tensor& amaxes)> fp8_amax_reduction();

}  // namespace kiln::dist
