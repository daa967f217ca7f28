// All-reduce bandwidth through kiln's NCCL process group, beside a plain NCCL call in the same run.
//
//   mpirun -np 2 -x NCCL_NVLS_ENABLE ./build/bench/bench_allreduce [--quick] [--iters N]
//
// One process per GPU. For float32 buffers of 8 MiB, 64 MiB, 256 MiB and 1 GiB (and bfloat16 at 256 MiB),
// each rank times N in-place sum all-reduces (after warm-up) two ways, back to back:
//   kiln  dist::group(dev).all_reduce_async(t, Sum) + wait(), as DataParallel issues them (the collective runs on
//         the group's communication stream; wait() makes the current stream wait for it);
//   nccl  ncclAllReduce on a communicator this program creates itself (its unique id sent by MPI_Bcast), on its
//         own stream.
// Both are timed with CUDA events around the N calls; the slowest rank's time counts. Rank 0 prints, per case,
// one line per path and a JSON line, with nccl-tests' measures: algbw = bytes / time and
// busbw = algbw * 2 (n - 1) / n (the bandwidth each link sees in a ring all-reduce), in GB/s (1e9 bytes).
// A first all-reduce of each buffer checks the sum (rank r contributes r + 1). With fewer than two GPUs, or
// outside a multi-process launch, it says so and exits 0.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>   // cudaSetDevice, streams and events of the plain NCCL path
#include <nccl.h>           // ncclCommInitRank, ncclAllReduce
#define OMPI_SKIP_MPICXX 1  // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>  // MPI_Bcast of the NCCL unique id, MPI_Allreduce of the timings

#include "kiln/data/distributed_env.h"       // data::distributed_env: rank and size from the launcher's variables
#include "kiln/distributed/environment.h"    // dist::init
#include "kiln/distributed/process_group.h"  // dist::group, ReduceOp
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"  // cuda::Event, cuda::synchronize

using namespace kiln;

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}
void check_mpi(int r, const char* what) {
  if (r != MPI_SUCCESS) throw std::runtime_error(std::string(what) + " failed (MPI error " + std::to_string(r) + ")");
}

struct Settings {
  bool quick = false;
  int iters = 0;  // 0: by size (see iterations())
  int warmup = 5;
};

struct Case {
  DType dtype;
  int64_t bytes;
};

// Enough calls that the small sizes run for tens of milliseconds: 4 GiB moved in all, 20 to 500 calls.
int iterations(const Settings& s, int64_t bytes) {
  if (s.iters > 0) return s.iters;
  if (s.quick) return 5;
  return static_cast<int>(std::clamp<int64_t>((int64_t{4} << 30) / bytes, 20, 500));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float32: return ncclFloat32;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float16: return ncclFloat16;
    default: throw std::runtime_error("bench_allreduce: no NCCL type for " + std::string(dtype_name(t)));
  }
}

// The slowest rank's value.
double max_over_ranks(double v) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return v;
}

// After one sum all-reduce of buffers filled with rank + 1, every element is n (n + 1) / 2 (exact in bf16 too).
void check_sum(const Tensor& t, int world, const char* path) {
  const double want = world * (world + 1) / 2.0;
  const double lo = internal::amin(t).item<double>(), hi = internal::amax(t).item<double>();
  if (lo != want || hi != want) {
    throw std::runtime_error(std::string("bench_allreduce: ") + path + " all-reduce of " +
                             std::string(dtype_name(t.dtype())) + " gave values in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], expected " + std::to_string(want));
  }
}

struct Result {
  double ms_per_call, algbw, busbw;
};

Result measure(double total_ms, int iters, int64_t bytes, int world) {
  const double ms = max_over_ranks(total_ms) / iters;
  const double algbw = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  return {ms, algbw, algbw * 2.0 * (world - 1) / world};
}

// kiln: all_reduce_async + wait, on the current stream of this rank's GPU.
Result time_kiln(const Tensor& t, int iters, int warmup, int world) {
  dist::ProcessGroup& group = dist::group(t.device());
  for (int i = 0; i < warmup; ++i) group.all_reduce_async(t, dist::ReduceOp::Sum)->wait();
  cuda::synchronize();
  cuda::Event start(true), stop(true);
  start.record();
  for (int i = 0; i < iters; ++i) group.all_reduce_async(t, dist::ReduceOp::Sum)->wait();
  stop.record();
  stop.synchronize();
  return measure(start.elapsed_ms(stop), iters, static_cast<int64_t>(t.nbytes()), world);
}

// Plain NCCL on our own communicator and stream.
Result time_nccl(const Tensor& t, ncclComm_t comm, cudaStream_t stream, int iters, int warmup, int world) {
  void* data = t.data_ptr();
  const size_t count = static_cast<size_t>(t.numel());
  const ncclDataType_t type = nccl_type(t.dtype());
  for (int i = 0; i < warmup; ++i)
    check_nccl(ncclAllReduce(data, data, count, type, ncclSum, comm, stream), "ncclAllReduce");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < iters; ++i)
    check_nccl(ncclAllReduce(data, data, count, type, ncclSum, comm, stream), "ncclAllReduce");
  check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return measure(ms, iters, static_cast<int64_t>(t.nbytes()), world);
}

std::string size_label(int64_t bytes) {
  char buf[32];
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0) {
    std::snprintf(buf, sizeof buf, "%lld GiB", static_cast<long long>(bytes >> 30));
  } else {
    std::snprintf(buf, sizeof buf, "%lld MiB", static_cast<long long>(bytes >> 20));
  }
  return buf;
}

int run(const Settings& s, int& argc, char**& argv) {
  const data::DistributedEnv launch = data::distributed_env();
  if (!cuda::is_available() || cuda::device_count() < 2) {
    if (launch.rank == 0)
      std::printf("bench_allreduce: needs two GPUs (%d visible); nothing to measure\n", cuda::device_count());
    return 0;
  }
  const dist::Env& env = dist::init();
  if (env.world_size < 2) {
    std::printf("bench_allreduce: a single process; run it under `mpirun -np 2` (one process per GPU)\n");
    return 0;
  }
  if (env.local_world_size > cuda::device_count() || !env.device().is_cuda()) {
    if (env.is_main())
      std::printf("bench_allreduce: %d processes on this node but %d GPUs; nothing to measure\n", env.local_world_size,
                  cuda::device_count());
    return 0;
  }
  const Device dev = env.device();
  const int world = env.world_size;

  // MPI: kiln's bootstrap started it under mpirun; start it here otherwise (a TCP bootstrap).
  int mpi_started = 0;
  check_mpi(MPI_Initialized(&mpi_started), "MPI_Initialized");
  const bool we_started_mpi = !mpi_started;
  if (we_started_mpi) check_mpi(MPI_Init(&argc, &argv), "MPI_Init");
  int mpi_rank = 0, mpi_size = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size), "MPI_Comm_size");
  if (mpi_rank != env.rank || mpi_size != world)
    throw std::runtime_error("bench_allreduce: MPI sees rank " + std::to_string(mpi_rank) + " of " +
                             std::to_string(mpi_size) + ", kiln rank " + std::to_string(env.rank) + " of " +
                             std::to_string(world));

  // kiln's NCCL group (created on every rank now: its bootstrap is collective), then our own communicator.
  dist::ProcessGroup& kiln_group = dist::group(dev);
  check_cuda(cudaSetDevice(dev.index()), "cudaSetDevice");
  ncclUniqueId id;
  if (env.rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  check_mpi(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
  ncclComm_t comm;
  check_nccl(ncclCommInitRank(&comm, world, id, env.rank), "ncclCommInitRank");
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");

  std::vector<Case> cases;
  if (s.quick) {
    cases = {
        {DType::Float32, int64_t{1} << 20}, {DType::Float32, int64_t{8} << 20}, {DType::BFloat16, int64_t{8} << 20}};
  } else {
    cases = {{DType::Float32, int64_t{8} << 20},
             {DType::Float32, int64_t{64} << 20},
             {DType::Float32, int64_t{256} << 20},
             {DType::Float32, int64_t{1} << 30},
             {DType::BFloat16, int64_t{256} << 20}};
  }

  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  if (env.is_main()) {
    std::printf("bench_allreduce: %d ranks (%s, bootstrap %s), kiln group \"%s\", NCCL %d, NCCL_NVLS_ENABLE=%s\n",
                world, env.launcher.c_str(), env.bootstrap.c_str(), kiln_group.backend().c_str(), nccl_version,
                nvls ? nvls : "(unset)");
    std::printf("in-place sum; time per call of the slowest rank; busbw = algbw * 2(n-1)/n, GB/s = 1e9 B/s\n");
  }

  std::vector<std::string> json;
  for (const Case& c : cases) {
    const int64_t count = c.bytes / static_cast<int64_t>(element_size(c.dtype));
    const int iters = iterations(s, c.bytes);
    Tensor t = full({count}, env.rank + 1, {.dtype = c.dtype, .device = dev});

    // kiln first: check once, then time.
    kiln_group.all_reduce(t, dist::ReduceOp::Sum);
    check_sum(t, world, "kiln");
    const Result k = time_kiln(t, iters, s.warmup, world);
    cuda::synchronize();

    // The same buffer through plain NCCL on our stream (the fill runs on kiln's current stream: wait for it).
    t.fill_(env.rank + 1);
    cuda::synchronize();
    check_nccl(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(count), nccl_type(c.dtype), ncclSum, comm,
                             stream),
               "ncclAllReduce");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check_sum(t, world, "nccl");
    const Result n = time_nccl(t, comm, stream, iters, s.warmup, world);

    if (env.is_main()) {
      const std::string dt(dtype_name(c.dtype));
      const std::string size = size_label(c.bytes);
      for (const auto& [path, r] : {std::pair<const char*, Result>{"kiln", k}, {"nccl", n}}) {
        std::printf("allreduce %-8s %8s  %-4s  %9.3f ms  algbw %7.1f GB/s  busbw %7.1f GB/s  (%d calls)\n", dt.c_str(),
                    size.c_str(), path, r.ms_per_call, r.algbw, r.busbw, iters);
      }
      char line[512];
      std::snprintf(line, sizeof line,
                    "{\"bench\":\"allreduce\",\"dtype\":\"%s\",\"bytes\":%lld,\"world\":%d,\"iters\":%d,"
                    "\"kiln_ms\":%.4f,\"kiln_algbw\":%.2f,\"kiln_busbw\":%.2f,"
                    "\"nccl_ms\":%.4f,\"nccl_algbw\":%.2f,\"nccl_busbw\":%.2f,\"kiln_vs_nccl\":%.4f}",
                    dt.c_str(), static_cast<long long>(c.bytes), world, iters, k.ms_per_call, k.algbw, k.busbw,
                    n.ms_per_call, n.algbw, n.busbw, n.ms_per_call / k.ms_per_call);
      std::printf("%s\n", line);
      std::fflush(stdout);
    }
  }

  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  check_nccl(ncclCommDestroy(comm), "ncclCommDestroy");
  cudaStreamDestroy(stream);
  dist::finalize();  // kiln's groups, and MPI when kiln started it
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (we_started_mpi && !finalized) MPI_Finalize();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      s.quick = true;
      s.warmup = 2;
    } else if (a == "--iters" && i + 1 < argc) {
      s.iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: mpirun -np 2 bench_allreduce [--quick] [--iters N]\n");
      return 2;
    }
  }
  try {
    return run(s, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
    std::fflush(stderr);
    // A rank that stops alone would leave the others waiting in a collective: end the whole job.
    int started = 0, finalized = 0;
    MPI_Initialized(&started);
    MPI_Finalized(&finalized);
    if (started && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
