// Data-parallel training steps through dist::DataParallel, for the scaling from 1 to N GPUs (bench/pytorch_ddp.py
// runs the same cases through PyTorch DDP; bench/ddp_scaling.py prints the table).
//
//   ./build/bench/bench_ddp [--quick] [--model resnet50|bert-base|all] [--steps N]            # world 1
//   mpirun -np 2 -x NCCL_NVLS_ENABLE ./build/bench/bench_ddp [...]                              # world 2
//
// A full step: zero_grad, forward under bf16 autocast, loss, backward (the gradient all-reduce overlapped with it
// when the world is larger than 1; with world 1 DataParallel is a plain wrapper), optimizer step.
//   ResNet-50: batch 256 per GPU, 224x224, channels-last, SGD (lr 0.1, momentum 0.9, weight decay 5e-5).
//   BERT-base masked-LM: batch 128 x 128 tokens per GPU, AdamW (lr 1e-4, weight decay 0.01).
// Random data (bench/model_cases.h; each rank draws its own). The median of the timed steps after warm-up, each
// between two CUDA events on rank 0; throughput counts the samples of every rank. After timing, the parameters of
// all ranks are compared (they must be identical). Rank 0 prints one line and one JSON line per case:
//   {"bench":"ddp","framework":"kiln","model":"resnet50","world":2,"batch_per_gpu":256,"step_ms":..,"throughput":..}
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gpu_timing.h"                      // bench::median_step_ms
#include "kiln/distributed/data_parallel.h"  // dist::DataParallel
#include "kiln/distributed/environment.h"    // dist::init
#include "kiln/distributed/process_group.h"  // dist::all_reduce
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "model_cases.h"  // bench::make_resnet50, bench::make_bert_base

using namespace kiln;

namespace {

struct Settings {
  bool quick = false;
  std::string model = "all";
  int steps = 20;
  int warmup = 5;
};

// The sum of every parameter, the same on every rank when DataParallel did its job (the averaged gradients are
// bitwise equal on all ranks, so are the updates). Returns whether the ranks agree.
bool same_parameters_everywhere(nn::Module& model, Device dev) {
  double sum = 0;
  for (const Tensor& p : model.parameters()) sum += internal::sum(p.to(DType::Float64)).item<double>();
  Tensor hi = internal::from_vector(std::vector<float>{static_cast<float>(sum)}, {1}, dev);
  Tensor lo = hi.clone();
  dist::all_reduce(hi, dist::ReduceOp::Max);
  dist::all_reduce(lo, dist::ReduceOp::Min);
  return hi.item<float>() == lo.item<float>();
}

struct Measured {
  double step_ms = 0;          // rank 0's median
  double slowest_step_ms = 0;  // the largest median over the ranks
  double peak_gib = 0;         // rank 0's peak memory in tensors during the timed steps
};

Measured time_steps(const Settings& s, const dist::Env& env, const std::function<void()>& step) {
  for (int i = 0; i < s.warmup; ++i) step();  // cuDNN's algorithm search, the caching allocator's first blocks
  cuda::synchronize();
  cuda::reset_peak_memory_stats();
  Measured m;
  m.step_ms = bench::median_step_ms(0, s.steps, step);
  m.peak_gib = static_cast<double>(cuda::memory_stats().peak_allocated_bytes) / (1ull << 30);
  Tensor slowest = internal::from_vector(std::vector<float>{static_cast<float>(m.step_ms)}, {1}, env.device());
  dist::all_reduce(slowest, dist::ReduceOp::Max);
  m.slowest_step_ms = slowest.item<float>();
  return m;
}

void report(const dist::Env& env, const char* model, const char* unit, int64_t batch, const Measured& m, float loss,
            bool params_equal) {
  if (!params_equal) {
    std::fprintf(stderr, "bench_ddp: rank %d: %s's parameters differ between ranks after the timed steps\n", env.rank,
                 model);
  }
  if (!env.is_main()) return;
  const double throughput = static_cast<double>(batch) * env.world_size * 1000.0 / m.step_ms;
  std::printf(
      "kiln  %-9s world %d  batch %3lld/GPU  %8.2f ms/step (slowest rank %.2f)  %9.1f %s  peak %.2f GiB  "
      "loss %.4f%s\n",
      model, env.world_size, static_cast<long long>(batch), m.step_ms, m.slowest_step_ms, throughput, unit, m.peak_gib,
      loss, params_equal ? "" : "  PARAMETERS DIFFER BETWEEN RANKS");
  std::printf(
      "{\"bench\":\"ddp\",\"framework\":\"kiln\",\"model\":\"%s\",\"world\":%d,\"batch_per_gpu\":%lld,"
      "\"step_ms\":%.3f,\"slowest_step_ms\":%.3f,\"throughput\":%.1f,\"unit\":\"%s\",\"peak_gib\":%.2f,"
      "\"params_equal\":%s}\n",
      model, env.world_size, static_cast<long long>(batch), m.step_ms, m.slowest_step_ms, throughput, unit, m.peak_gib,
      params_equal ? "true" : "false");
  std::fflush(stdout);
}

void bench_resnet50(const Settings& s, const dist::Env& env) {
  bench::ResNetCase c = bench::make_resnet50(env.device(), MemoryFormat::ChannelsLast, s.quick);
  dist::DataParallel ddp(c.model);  // broadcasts rank 0's parameters and buffers
  optim::SGD opt(c.model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-5});
  Tensor loss;
  const Measured m = time_steps(s, env, [&] {
    opt.zero_grad(true);
    {
      amp::Autocast cast(DType::BFloat16);
      loss = nn::cross_entropy(ddp(c.x), c.y);
    }
    loss.backward();
    opt.step();
  });
  const float last_loss = loss.item<float>();
  report(env, "resnet50", "img/s", c.batch, m, last_loss, same_parameters_everywhere(*c.model, env.device()));
}

void bench_bert_base(const Settings& s, const dist::Env& env) {
  bench::BertCase c = bench::make_bert_base(env.device(), s.quick);
  dist::DataParallel ddp(c.model);
  optim::AdamW opt(c.model->parameters(), {.lr = 1e-4, .weight_decay = 0.01});
  Tensor loss;
  const Measured m = time_steps(s, env, [&] {
    opt.zero_grad(true);
    {
      amp::Autocast cast(DType::BFloat16);
      // DataParallel::forward takes one tensor; the masked-LM head takes four. Calling the module itself is the
      // same: the gradient all-reduce hangs on the parameters' gradient hooks, not on the forward call.
      loss = c.model(c.ids, c.types, c.mask, c.labels).loss;
    }
    loss.backward();
    opt.step();
  });
  const float last_loss = loss.item<float>();
  report(env, "bert-base", "seq/s", c.batch, m, last_loss, same_parameters_everywhere(*c.model, env.device()));
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      s.quick = true;
      s.steps = 3;
      s.warmup = 1;
    } else if (a == "--model" && i + 1 < argc) {
      s.model = argv[++i];
    } else if (a == "--steps" && i + 1 < argc) {
      s.steps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: [mpirun -np N] bench_ddp [--quick] [--model resnet50|bert-base|all] [--steps N]\n");
      return 2;
    }
  }
  if (s.model != "all" && s.model != "resnet50" && s.model != "bert-base") {
    std::fprintf(stderr, "bench_ddp: --model takes resnet50, bert-base or all, got %s\n", s.model.c_str());
    return 2;
  }
  const data::DistributedEnv launch = data::distributed_env();
  if (!cuda::is_available()) {
    if (launch.rank == 0) std::printf("bench_ddp: no GPU visible; nothing to measure\n");
    return 0;
  }
  try {
    const dist::Env& env = dist::init();
    if (!env.device().is_cuda() || env.local_world_size > cuda::device_count()) {
      if (env.is_main())
        std::printf("bench_ddp: %d processes on this node but %d GPUs; nothing to measure\n", env.local_world_size,
                    cuda::device_count());
      return 0;
    }
    manual_seed(1234 + static_cast<uint64_t>(env.rank));  // each rank its own data (the model is rank 0's)
    nn::set_cudnn_benchmark(true);
    if (env.is_main()) {
      const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
      std::printf("kiln ddp: world %d (%s), bf16 autocast, median of %d steps after %d, NCCL_NVLS_ENABLE=%s\n",
                  env.world_size, env.launcher.c_str(), s.steps, s.warmup, nvls ? nvls : "(unset)");
    }
    if (s.model == "all" || s.model == "resnet50") bench_resnet50(s, env);
    if (s.model == "all" || s.model == "bert-base") bench_bert_base(s, env);
    dist::finalize();
  } catch (const std::exception& e) {
    // A rank that stops alone would leave the others in a collective: kiln's collective timeout ends them
    // (OnTimeout::Exit); mpirun ends the job when this rank exits non-zero.
    std::fprintf(stderr, "bench_ddp: rank %d: %s\n", launch.rank, e.what());
    return 1;
  }
  return 0;
}
