// kiln/data/distributed_env.h — this process's place in a multi-process job, read from the launcher's
// environment variables (no MPI or NCCL call): what DistributedSampler and the DataLoader shard by.
//
//   data::DistributedEnv env = data::distributed_env();   // {rank, world_size, local_rank}
//   if (env.world_size > 1) std::cout << "rank " << env.rank << " of " << env.world_size << "\n";
#pragma once

namespace kiln::data {

// This process's place in a job, read from the launcher's environment variables (distributed_env()).
struct DistributedEnv {
  int rank = 0;        // 0 .. world_size - 1
  int world_size = 1;  // processes in the job
  int local_rank = 0;  // the rank among the processes of this node (which GPU to use)
};

// The first family of variables whose rank and size are both set, in this order:
//   OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK   (Open MPI's mpirun)
//   PMI_RANK / PMI_SIZE / MPI_LOCALRANKID        (MPICH, Intel MPI: Hydra)
//   RANK / WORLD_SIZE / LOCAL_RANK               (torchrun, or set by hand)
//   SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID  (srun)
// SLURM's come last because every process inside an allocation inherits them, also those started by
// mpirun or torchrun, which set their own. A missing local rank is taken to be the rank (one node).
// Without any: {0, 1, 0}. A malformed value (not a number, negative, rank >= world size, only one of
// rank and size set) throws a kiln::Error naming the variable and its value.
DistributedEnv distributed_env();

}  // namespace kiln::data
