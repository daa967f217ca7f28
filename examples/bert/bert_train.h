// examples/bert/bert_train.h — what pretraining and fine-tuning share: the run options, the process setup
// (dist::init, device, mixed precision), the optimizer and schedule, and the training loop with gradient
// accumulation, logging, checkpoints and exact resume.
//
// The loop in one picture, per optimizer step (accum micro-batches; DataParallel averages on the last):
//   for each micro-batch: [no_sync unless last] { autocast { loss = task.loss(batch) } scaler.scale(loss /
//   accum).backward() } unscale_, clip_grad_norm_, scaler.step(opt), scaler.update(), scheduler.step(), zero_grad
// With --cuda-graph (one GPU, one micro-batch per step) that whole step but the scheduler runs on static input
// tensors that each batch is copied into: eagerly for the first 2 steps of the process, then captured in a
// cuda::Graph (ex::GraphedStep) and replayed.
#pragma once

#include <kiln/kiln.h>
#include <kiln/tensor/cuda.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bert_data.h"     // fs, text and TSV inputs, config.json
#include "example_util.h"  // ex::Options, ex::pick_device, ex::Progress
#include "graphed_step.h"  // ex::GraphedStep, ex::StaticBatch (--cuda-graph)

namespace bert_example {

using kiln::Device;
using kiln::DType;
namespace dist = kiln::dist;
namespace io = kiln::io;
namespace nn = kiln::nn;
namespace optim = kiln::optim;

// ---------------------------------------------------------------- options

// The options both modes take (each mode adds its own). References into ex::Options' storage.
struct RunOptions {
  int64_t& seq_len;
  int64_t& batch;
  int64_t& accum;
  int64_t& epochs;
  int64_t& max_steps;
  int64_t& stop_after;
  std::string& optimizer;
  double& lr;
  double& weight_decay;
  int64_t& warmup_steps;
  double& clip;
  std::string& amp;
  bool& checkpointing;
  bool& cuda_graph;
  int64_t& workers;
  int64_t& threads;
  std::string& out;
  bool& resume;
  int64_t& ckpt_every;
  int64_t& keep;
  int64_t& log_every;
  std::string& tensorboard;
  ex::ProfileOptions profiling;
  int64_t& seed;
  std::string& device;
  bool& deterministic;
  bool& print_checksum;
};

// The defaults that differ between pretraining and fine-tuning.
struct RunDefaults {
  int64_t seq_len, batch, epochs;
  double lr_adamw, lr_lamb;
  double warmup_fraction;  // of the run's steps, when --warmup-steps is -1
  int64_t ckpt_every, log_every;
  std::string out;
};

inline std::string number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

inline RunOptions add_run_options(ex::Options& o, const RunDefaults& d) {
  // Braced initialisation evaluates left to right: the options are listed in --help in this order.
  return RunOptions{
      o.add_int("seq-len", d.seq_len,
                "tokens per sequence, [CLS] and [SEP] included (128 or 512 as BERT; "
                "at most the model's max positions)"),
      o.add_int("batch", d.batch, "sequences per micro-batch on each process"),
      o.add_int("accum-steps", 1,
                "micro-batches per optimizer step (gradient accumulation); the global batch "
                "is batch x accum-steps x processes"),
      o.add_int("epochs", d.epochs, "passes over the training data (unless --max-steps is given)"),
      o.add_int("max-steps", 0, "optimizer steps of the whole run; 0: epochs x steps per epoch"),
      o.add_int("stop-after", 0,
                "end this process after N more steps (a checkpoint is saved; continue with "
                "--resume), as a preempted job would"),
      o.add_string("optimizer", "adamw", "adamw | lamb"),
      o.add_double(
          "lr", -1,
          "peak learning rate; -1: " + number(d.lr_adamw) + " with adamw, " + number(d.lr_lamb) + " with lamb"),
      o.add_double("weight-decay", 0.01, "decoupled weight decay (not on biases and LayerNorm weights)"),
      o.add_int("warmup-steps", -1,
                "linear warmup from 0 to the peak lr, then linear decay to 0 at the last "
                "step; -1: " +
                    number(100 * d.warmup_fraction) + "% of the steps"),
      o.add_double("clip-grad", 1.0, "clip the global gradient norm to this (0: off)"),
      o.add_string("amp", "auto",
                   "mixed precision on the GPU: bf16 | fp16 (with loss scaling) | fp8 (bf16 with the "
                   "Linears' products in FP8, sm_89 or newer; on the CPU, kiln's FP8 reference) | off; auto: "
                   "bf16 on a GPU, off on the CPU"),
      o.add_flag("checkpointing",
                 "gradient checkpointing: recompute each encoder layer during backward "
                 "instead of keeping its activations (less memory, more compute)"),
      o.add_flag("cuda-graph",
                 "after 2 eager steps, capture the training step in a CUDA graph and replay it for every later "
                 "batch (one GPU; every batch is full, the last partial one is dropped); not with --accum-steps > 1, "
                 "--checkpointing, --profile, mpirun or the CPU"),
      o.add_int("workers", 4, "data-loading threads"),
      o.add_int("threads", 0, "CPU compute threads (0: kiln's default, KILN_NUM_THREADS or all cores)"),
      o.add_string("out", d.out, "folder for checkpoints, metrics.csv, config.json, vocab.txt, model.safetensors"),
      o.add_flag("resume", "continue from the newest complete checkpoint in --out (same options as that run)"),
      o.add_int("ckpt-every", d.ckpt_every,
                "save a checkpoint every N steps (0: only at the end), and after each fine-tuning epoch"),
      o.add_int("keep", 3, "checkpoints kept in --out (0: all)"),
      o.add_int("log-every", d.log_every, "print the progress line and a metrics.csv row every N steps"),
      o.add_string("tensorboard", "", "also log the metrics as TensorBoard event files to DIR"),
      ex::StepProfiler::add_options(o, "<out>/trace.json"),
      o.add_int("seed", 1234, "seed of the initialisation, data order, masking and dropout"),
      o.add_string("device", "auto", "auto | cpu | cuda (auto: this process's GPU if there is one)"),
      o.add_flag("deterministic",
                 "bit-for-bit reproducible GPU kernels (kiln::set_deterministic), e.g. for an "
                 "exact resume on the GPU; somewhat slower"),
      o.add_flag("print-checksum", "print a checksum of the parameters at the end (to compare runs)"),
  };
}

inline void check_run_options(const ex::Options& opts, const RunOptions& o) {
  auto positive = [&](int64_t v, const char* name) {
    if (v <= 0) opts.fail(std::string("--") + name + " must be positive, got " + std::to_string(v));
  };
  positive(o.seq_len, "seq-len");
  positive(o.batch, "batch");
  positive(o.accum, "accum-steps");
  positive(o.log_every, "log-every");
  if (o.epochs <= 0 && o.max_steps <= 0) opts.fail("give --epochs or --max-steps (positive)");
  if (o.max_steps < 0 || o.stop_after < 0 || o.ckpt_every < 0 || o.keep < 0 || o.workers < 0 || o.threads < 0) {
    opts.fail("--max-steps, --stop-after, --ckpt-every, --keep, --workers and --threads take values >= 0");
  }
  if (o.optimizer != "adamw" && o.optimizer != "lamb") {
    opts.fail("--optimizer takes adamw or lamb, not '" + o.optimizer + "'");
  }
  if (o.amp != "auto" && o.amp != "bf16" && o.amp != "fp16" && o.amp != "fp8" && o.amp != "off") {
    opts.fail("--amp takes bf16, fp16, fp8, off or auto, not '" + o.amp + "'");
  }
  if (o.lr != -1 && !(o.lr > 0)) opts.fail("--lr must be positive (or -1 for the default)");
  if (o.clip < 0 || o.weight_decay < 0) opts.fail("--clip-grad and --weight-decay must be >= 0");
  if (o.cuda_graph) {  // what a replayed step cannot do (the GPU and the number of processes: check_cuda_graph)
    if (const std::string why = ex::cuda_graph_env_conflict(); !why.empty()) opts.fail(why);
    if (o.accum > 1) {
      opts.fail("--cuda-graph replays one whole optimizer step per batch; it does not take --accum-steps " +
                std::to_string(o.accum) + " (raise --batch instead, or leave out --cuda-graph)");
    }
    if (o.checkpointing) {
      opts.fail(
          "--cuda-graph does not take --checkpointing: recomputing a layer with dropout rewinds the random "
          "generator, which replays cannot follow; leave out one of them");
    }
    if (!o.profiling.profile.empty()) {
      opts.fail(
          "--cuda-graph does not take --profile (a replay is one launch, with no ops to time); profile "
          "without --cuda-graph: the eager steps run the same kernels");
    }
    if (o.device == "cpu") opts.fail("--cuda-graph needs a GPU, and this run is on the CPU (--device cpu)");
  }
}

// ---------------------------------------------------------------- the process

struct Runtime {
  const dist::Env* env = nullptr;
  Device device = Device::cpu();
  std::optional<DType> amp;  // the autocast dtype, or none (float32)
  // --amp fp8: the recipe of the training forwards (bf16 autocast, the Linears the recipe selects in FP8).
  // Evaluation runs in bf16 without it, so that it leaves the training scales alone.
  std::optional<kiln::amp::Fp8Recipe> fp8;
  bool main() const { return env->is_main(); }

  // The autocast region of a training forward (nothing when the run is in float32).
  void enter_training_autocast(std::optional<kiln::amp::Autocast>& cast) const {
    if (!amp) return;
    if (fp8) {
      cast.emplace(*amp, kiln::amp::AutocastOptions{.device_type = device.type(), .fp8 = fp8});
    } else {
      cast.emplace(*amp);
    }
  }
};

// Joins the job (a single process, or one rank of mpirun) and picks the device and the precision.
inline Runtime start_runtime(const RunOptions& o) {
  Runtime rt;
  rt.env = &dist::init();
  rt.device = ex::pick_device(o.device, *rt.env);
  if (o.threads > 0) kiln::set_num_threads(static_cast<int>(o.threads));
  if (o.deterministic) kiln::set_deterministic(true);
  if (o.amp == "fp8") {
    // Every Linear whose sizes are multiples of 16 (the default filter: the MLM decoder over the vocabulary stays
    // bf16), E4M3 forward and E5M2 gradients, scales from the amax history of the last 1,024 steps.
    rt.amp = DType::BFloat16;
    rt.fp8 = kiln::amp::Fp8Recipe{};
    // Under several processes every rank scales by the maximum of the ranks' amaxes, so all hold the same scales.
    if (rt.env->world_size > 1) rt.fp8->amax_reduction = dist::fp8_amax_reduction();
    if (rt.device.is_cuda() && kiln::cuda::compute_capability(rt.device.index()) < 89) {
      throw std::runtime_error(
          "--amp fp8 needs a GPU with FP8 tensor cores (compute capability 8.9 or newer: Ada, "
          "Hopper, Blackwell); " +
          rt.device.str() + " has " + std::to_string(kiln::cuda::compute_capability(rt.device.index())) +
          "; use --amp bf16");
    }
    if (!rt.device.is_cuda() && rt.main()) {
      std::cout << "note: --amp fp8 on the CPU runs kiln's FP8 reference implementation (slow; for checking)\n";
    }
  } else if (rt.device.is_cuda()) {
    if (o.amp == "auto" || o.amp == "bf16") rt.amp = DType::BFloat16;
    if (o.amp == "fp16") rt.amp = DType::Float16;
  } else if ((o.amp == "bf16" || o.amp == "fp16") && rt.main()) {
    // kiln's autocast casts CUDA ops; CPU ops run in float32 whatever is asked.
    std::cout << "note: --amp " << o.amp << " applies to GPU runs; this run is on the CPU, in float32\n";
  }
  return rt;
}

// --cuda-graph, once the process has joined the job: one process, on a GPU. Exits 2 otherwise, before anything is
// loaded.
inline void check_cuda_graph(const ex::Options& opts, const RunOptions& o, const Runtime& rt) {
  if (!o.cuda_graph) return;
  if (rt.env->world_size > 1) {
    opts.fail(
        "--cuda-graph runs on one GPU for now: the gradient all-reduce of dist::DataParallel cannot be "
        "captured; run the " +
        std::to_string(rt.env->world_size) + " processes without --cuda-graph");
  }
  if (!rt.device.is_cuda()) {
    opts.fail(
        "--cuda-graph needs a GPU, and none is visible (or kiln was built without CUDA); leave out "
        "--cuda-graph");
  }
}

inline const char* amp_name(const Runtime& rt) {
  if (!rt.amp) return "off";
  if (rt.fp8) return "fp8";
  return *rt.amp == DType::BFloat16 ? "bf16" : "fp16";
}

// ---------------------------------------------------------------- optimizer and schedule

// AdamW or LAMB with two parameter groups: weight decay on the weight matrices and embeddings, none on biases
// and LayerNorm parameters (as BERT's original recipe).
inline std::unique_ptr<optim::Optimizer> make_optimizer(const nn::Module& model, const RunOptions& o, double lr) {
  std::vector<Tensor> decay, no_decay;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!p.requires_grad()) continue;
    const bool exempt = name.ends_with(".bias") || name.find("LayerNorm") != std::string::npos;
    (exempt ? no_decay : decay).push_back(p);
  }
  if (o.optimizer == "lamb") {
    optim::LAMBOptions with{.lr = lr, .weight_decay = o.weight_decay}, without = with;
    without.weight_decay = 0;
    std::vector<optim::ParamGroup<optim::LAMBOptions>> groups;  // an empty group is an error: leave it out
    if (!decay.empty()) groups.push_back({decay, with});
    if (!no_decay.empty()) groups.push_back({no_decay, without});
    return std::make_unique<optim::LAMB>(std::move(groups), with);
  }
  // eps 1e-6 as BERT's own AdamWeightDecay.
  optim::AdamWOptions with{.lr = lr, .eps = 1e-6, .weight_decay = o.weight_decay}, without = with;
  without.weight_decay = 0;
  std::vector<optim::ParamGroup<optim::AdamWOptions>> groups;
  if (!decay.empty()) groups.push_back({decay, with});
  if (!no_decay.empty()) groups.push_back({no_decay, without});
  return std::make_unique<optim::AdamW>(std::move(groups), with);
}

// ---------------------------------------------------------------- checksum

// FNV-1a over the names and bytes of the parameters and buffers: equal checksums mean bit-identical models.
inline std::string parameter_checksum(const nn::Module& model) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ULL;
  };
  for (const auto& [name, t] : model.state_dict()) {
    const Tensor c = t.cpu().contiguous();
    mix(name.data(), name.size());
    mix(c.data_ptr(), c.nbytes());
  }
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// ---------------------------------------------------------------- the training loop

// What a mode hands to the loop.
struct Task {
  std::string name;  // "pretrain" / "finetune": messages and metadata
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<const data::Dataset> train;
  // The loss of one micro-batch (already on the device), computed inside the autocast region.
  std::function<Tensor(const data::Batch&)> loss;
  // Called on every rank once the run is set up (after the resume checks), before the first step: rank 0
  // writes config.json and vocab.txt there, so a mismatched --resume never overwrites them.
  std::function<void()> before_training;
  // Set by run_training before before_training: the step of the first row a resumed run logs again (-1: not
  // resumed), and rank 0's TensorBoard writer (--tensorboard), for a task's own metrics logger to share.
  int64_t resume_step = -1;
  std::shared_ptr<kiln::monitor::TensorBoardWriter> tensorboard;
  // Called on every rank at the end of each epoch, before its checkpoint (fine-tuning evaluates there).
  std::function<void(int64_t epoch, int64_t step)> after_epoch;
  // What a resumed run must agree on (model shape, labels, batch geometry, ...); saved in every checkpoint.
  io::Metadata meta;
};

// The settings of the run in --out, compared with this one's before resuming, so that a mismatch is a message
// in words rather than an error about tensor shapes.
inline void check_same_run(const std::string& path, const io::Metadata& now, const std::string& out) {
  io::Metadata saved;
  try {
    io::load_checkpoint(path, {.metadata = &saved});
  } catch (const kiln::Error& e) {
    throw std::runtime_error(path + " is not a checkpoint of this example (" + e.what() + "); choose another --out");
  }
  std::string diffs;
  for (const auto& [k, v] : now.strings) {
    auto it = saved.strings.find(k);
    const std::string was = it == saved.strings.end() ? "(none)" : it->second;
    if (was != v) diffs += "\n  " + k + ": '" + was + "' there, '" + v + "' now";
  }
  for (const auto& [k, v] : now.numbers) {
    auto it = saved.numbers.find(k);
    if (it == saved.numbers.end()) {
      diffs += "\n  " + k + ": (none) there, " + number(v) + " now";
    } else if (it->second != v) {
      diffs += "\n  " + k + ": " + number(it->second) + " there, " + number(v) + " now";
    }
  }
  if (!diffs.empty()) {
    throw std::runtime_error("--resume: the run in " + out + " was made with other settings:" + diffs +
                             "\nresume with the options (and number of processes) of that run, or choose another "
                             "--out");
  }
}

// After an FP8 run on several processes: every rank must hold the same FP8 scales (the amaxes are reduced over the
// ranks, Fp8Recipe::amax_reduction). Compares each Linear's scales with their minimum and maximum over the ranks;
// throws naming the first that differs.
inline void check_fp8_scales_agree(const nn::Module& model, const Runtime& rt) {
  int64_t layers = 0;
  for (const auto& [name, buffer] : model.named_buffers()) {
    if (!name.ends_with("fp8_scale")) continue;
    Tensor lo = buffer.clone(), hi = buffer.clone();
    dist::all_reduce(lo, dist::ReduceOp::Min);
    dist::all_reduce(hi, dist::ReduceOp::Max);
    if (!kiln::equal(lo, hi)) {
      throw std::runtime_error("--amp fp8: the FP8 scales of " + name + " differ between the ranks after training");
    }
    ++layers;
  }
  if (rt.main()) std::cout << "FP8 scales: the same on every rank (" << layers << " layers)\n";
}

// Trains task.model; returns the last step. Every rank runs it; rank 0 prints and writes metrics.csv.
inline int64_t run_training(Task& task, const RunOptions& o, const RunDefaults& d, const Runtime& rt) {
  const dist::Env& env = *rt.env;
  const fs::path out(o.out);

  // The loader shards by rank by itself (DistributedSampler under mpirun). drop_last keeps every batch the
  // same shape (no recompilation of cuDNN plans, no odd-sized last step) and every rank in step.
  data::DataLoaderOptions lo{.batch_size = o.batch,
                             .workers = static_cast<int>(o.workers),
                             .shuffle = true,
                             .seed = static_cast<uint64_t>(o.seed),
                             .drop_last = true,
                             .pin_memory = rt.device.is_cuda(),
                             .prefetch_next_epoch = true};  // epochs in order: no bubble between them
  if (rt.device.is_cuda()) lo.device = rt.device;           // batches arrive on the GPU, copied ahead on a copy stream
  data::DataLoader loader(task.train, lo);
  const int64_t micro_per_epoch = loader.size();
  const int64_t steps_per_epoch = micro_per_epoch / o.accum;  // the leftover micro-batches of an epoch are skipped
  if (steps_per_epoch == 0) {
    throw std::runtime_error(task.train->describe() + " gives " + std::to_string(micro_per_epoch) + " batch(es) of " +
                             std::to_string(o.batch) + " per process (" + std::to_string(env.world_size) +
                             " process(es)), fewer than one optimizer step of " + std::to_string(o.accum) +
                             " micro-batch(es); give more data, a smaller --batch or "
                             "fewer --accum-steps");
  }
  const int64_t total = o.max_steps > 0 ? o.max_steps : o.epochs * steps_per_epoch;
  const int64_t warmup =
      o.warmup_steps >= 0 ? o.warmup_steps : static_cast<int64_t>(std::llround(d.warmup_fraction * total));
  if (warmup > total) {
    throw std::runtime_error("--warmup-steps " + std::to_string(warmup) + " is longer than the run (" +
                             std::to_string(total) + " steps)");
  }
  const double lr = o.lr > 0 ? o.lr : (o.optimizer == "lamb" ? d.lr_lamb : d.lr_adamw);

  // FP8 state (buffers of the Linears that compute in FP8) before the checkpoint is loaded: a resumed run restores
  // the amax histories and scales with the weights.
  if (rt.fp8) kiln::amp::prepare_fp8(*task.model, *rt.fp8, rt.device);
  auto opt = make_optimizer(*task.model, o, lr);
  std::unique_ptr<optim::LRScheduler> sched = optim::linear_warmup_linear_decay(*opt, warmup, total);
  // fp16 needs loss scaling (its range is narrow); bf16 and float32 do not: a disabled scaler passes through.
  kiln::amp::GradScaler scaler({.enabled = rt.amp == DType::Float16});
  // Broadcasts rank 0's parameters; averages gradients in backward hooks. BERT's forward takes several
  // tensors, so the loop calls the model itself (task.loss): DataParallel's hooks do the work either way.
  dist::DataParallel ddp(task.model);

  // ---- checkpoints and resume
  io::CheckpointManager ckpt(out.string(), {.keep_last = static_cast<int>(o.keep)});
  data::LoaderPosition pos;
  io::Metadata meta = task.meta;
  meta.strings["task"] = task.name;
  meta.strings["optimizer"] = o.optimizer;
  meta.strings["amp"] = amp_name(rt);
  meta.numbers["seq_len"] = static_cast<double>(o.seq_len);
  meta.numbers["batch"] = static_cast<double>(o.batch);
  meta.numbers["accum_steps"] = static_cast<double>(o.accum);
  meta.numbers["world_size"] = env.world_size;  // each rank has its own loader position and generators
  io::CheckpointParts parts{.model = task.model.get(),
                            .optimizer = opt.get(),
                            .scheduler = sched.get(),
                            .scaler = &scaler,
                            .generators = true,
                            .loader = &pos,
                            .metadata = &meta};
  int64_t step = 0;
  bool resumed = false;
  if (auto latest = ckpt.latest()) {
    if (!o.resume) {
      throw std::runtime_error(o.out + " already holds checkpoints (" + *latest +
                               "); add --resume to continue that run, or choose another --out");
    }
    check_same_run(*latest, meta, o.out);
    step = ckpt.resume(parts).value();
    resumed = true;
    if (rt.main()) std::cout << "resumed from " << *latest << " at step " << step << ", epoch " << pos.epoch << "\n";
  } else if (o.resume && rt.main()) {
    std::cout << "--resume: no checkpoint in " << o.out << " yet; starting from the beginning\n";
  }

  // Metrics (rank 0): metrics.csv, and with --tensorboard the train/... scalars. A resumed run redoes the steps
  // after its checkpoint's: the rows and points from step + 1 on (steps count from 1) are dropped.
  task.resume_step = resumed ? step + 1 : -1;
  kiln::monitor::MetricsLogger metrics(
      {.csv = out / "metrics.csv",
       .columns = {"epoch", "step", "loss", "lr", "samples_per_s", "data_wait", "elapsed_s"},
       .tensorboard_dir = o.tensorboard,
       .tag_prefix = "train/",
       .resume_step = task.resume_step,
       .enabled = rt.main()});
  task.tensorboard = metrics.tensorboard();
  if (task.before_training) task.before_training();
  const int64_t samples_per_step = o.batch * o.accum * env.world_size;
  if (rt.main()) {
    std::cout << task.name << ": " << env.world_size << " process(es) on " << rt.device << ", global batch "
              << samples_per_step << " (" << o.batch << " x " << o.accum << " accum x " << env.world_size << "), "
              << steps_per_epoch << " steps per epoch, " << total << " steps, warmup " << warmup << ", " << opt->name()
              << " lr " << lr << ", amp " << amp_name(rt) << (o.checkpointing ? ", gradient checkpointing" : "")
              << (o.cuda_graph ? ", CUDA graph from the 3rd step" : "") << "\n";
  }
  ex::Progress progress(total, samples_per_step, rt.device);
  // --profile / --nvtx: kiln's profiler over a few steps (the top ops and a trace file), NVTX ranges for nsys.
  ex::StepProfiler profiler(o.profiling,
                            o.profiling.trace == "<out>/trace.json" ? (out / "trace.json").string() : o.profiling.trace,
                            rt.main(), env.rank, env.world_size);

  const std::vector<Tensor> params = task.model->parameters();
  const int64_t stop_at = o.stop_after > 0 ? std::min(total, step + o.stop_after) : total;
  const auto t0 = std::chrono::steady_clock::now();
  auto t_log = t0;
  int64_t steps_done = 0, logged_step = step, saved_step = resumed ? step : -1;
  Tensor loss_sum;  // the detached losses since the last log, on the device: read only when logging
  int64_t loss_count = 0;

  // --cuda-graph: the step from forward to zero_grad on static inputs (each batch is copied into them); it leaves
  // its loss in graph_loss, which each replay writes. The scheduler steps outside it, on the host.
  ex::StaticBatch graph_inputs;
  Tensor graph_loss;  // 0-d float32
  std::optional<ex::GraphedStep> graphed;
  if (o.cuda_graph) {
    graph_loss = kiln::zeros({}, {.dtype = DType::Float32, .device = rt.device});
    graphed.emplace([&] {
      Tensor loss;
      {
        std::optional<kiln::amp::Autocast> cast;
        rt.enter_training_autocast(cast);
        loss = task.loss(graph_inputs.batch());  // 0-d
      }
      scaler.scale(loss / static_cast<double>(o.accum)).backward();  // accum is 1: the eager step's ops
      graph_loss.copy_(loss.detach());
      if (o.clip > 0) {
        scaler.unscale_(*opt);
        nn::utils::clip_grad_norm_(params, o.clip);
      }
      scaler.step(*opt);  // skipped (on the device) when an fp16 gradient overflowed
      scaler.update();
      opt->zero_grad();
    });
  }

  auto save = [&](int64_t s) {
    ckpt.save(s, parts);  // every rank calls it: rank files hold each one's generators and loader position
    saved_step = s;
  };
  auto log = [&](int64_t epoch, double lr_used, double wait_fraction) {
    Tensor mean = (loss_sum / static_cast<double>(loss_count)).reshape({1}).contiguous();
    dist::all_reduce(mean, dist::ReduceOp::Average);  // every rank logs at the same steps; a no-op alone
    const double loss = mean.item<double>();          // the one host wait of the interval
    loss_sum = Tensor();
    loss_count = 0;
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - t_log).count();
    const double rate = seconds > 0 ? static_cast<double>((step - logged_step) * samples_per_step) / seconds : 0;
    t_log = now;
    logged_step = step;
    if (!rt.main()) return;
    std::cout << progress.line(epoch, step, steps_done, loss, lr_used, wait_fraction) << std::endl;
    metrics.log(step, {{"epoch", epoch},
                       {"loss", loss},
                       {"lr", lr_used},
                       {"samples_per_s", rate},
                       {"data_wait", wait_fraction},
                       {"elapsed_s", std::chrono::duration<double>(now - t0).count()}});
  };

  while (step < stop_at) {
    if (pos.batch >= steps_per_epoch * o.accum) {  // resumed exactly at an epoch's end
      pos = {pos.epoch + 1, 0};
      continue;
    }
    const int64_t epoch = static_cast<int64_t>(pos.epoch);
    auto range = loader.epoch(pos);  // skips, without loading them, the batches trained on before a resume
    int64_t micro = 0;
    bool epoch_done = false;
    for (data::Batch& batch : range) {
      const bool last_micro = ++micro == o.accum;
      if (graphed) {  // one micro-batch per step: the whole step (the loss is a copy, the next replay rewrites it)
        graph_inputs.copy_from(batch);
        if (graphed->run() && rt.main()) {
          std::cout << "cuda graph: the training step was captured at step " << step + 1
                    << "; the later steps replay it" << std::endl;
        }
        loss_sum = loss_sum.defined() ? loss_sum + graph_loss : graph_loss.clone();
        ++loss_count;
      } else {
        // Only the last micro-batch of a step all-reduces; the others accumulate locally.
        std::optional<dist::DataParallel::NoSyncGuard> local;
        if (!last_micro) local.emplace(ddp);
        Tensor loss;
        {
          std::optional<kiln::amp::Autocast> cast;
          rt.enter_training_autocast(cast);
          loss = task.loss(batch);  // 0-d
        }
        scaler.scale(loss / static_cast<double>(o.accum)).backward();
        kiln::NoGradGuard no_grad;
        const Tensor l = loss.detach().to(DType::Float32);
        loss_sum = loss_sum.defined() ? loss_sum + l : l;
        ++loss_count;
      }
      if (!last_micro) continue;
      micro = 0;

      const double lr_used = opt->lr(0);
      if (!graphed) {
        if (o.clip > 0) {
          scaler.unscale_(*opt);  // clip the true gradients, not the scaled ones
          nn::utils::clip_grad_norm_(params, o.clip);
        }
        scaler.step(*opt);  // skipped (on the device) when an fp16 gradient overflowed
        scaler.update();
      }
      sched->step();  // a replay reads the optimizer's learning rate before it runs
      if (!graphed) opt->zero_grad();
      ++step;
      ++steps_done;
      profiler.step();
      pos = range.position();
      epoch_done = pos.batch >= steps_per_epoch * o.accum;

      if (step % o.log_every == 0 || step == stop_at) log(epoch, lr_used, range.stats().wait_fraction);
      if (epoch_done || step >= stop_at) break;
      if (o.ckpt_every > 0 && step % o.ckpt_every == 0) save(step);
    }
    if (!epoch_done && step < stop_at) epoch_done = true;  // the loader ran out early (cannot happen with drop_last)
    if (epoch_done) {
      if (task.after_epoch) task.after_epoch(epoch, step);
      pos = {pos.epoch + 1, 0};
      // Saved here rather than in the loop above: after the evaluation, so that a resumed run never skips one.
      if (task.after_epoch || (o.ckpt_every > 0 && step % o.ckpt_every == 0)) save(step);
    }
  }
  if (saved_step != step) save(step);
  if (rt.fp8 && env.world_size > 1) check_fp8_scales_agree(*task.model, rt);
  if (o.print_checksum && rt.main()) std::cout << "parameter checksum " << parameter_checksum(*task.model) << "\n";
  return step;
}

}  // namespace bert_example
