// Whole training steps on one GPU, the cases of the performance issue: forward, loss, backward and the optimizer
// step, timed as one block of steps between two CUDA events after warm-up steps, on random (not zero) data made
// once on the GPU: --batches distinct batches (8 by default; 64 for the CIFAR case) that the steps cycle through
// (the JPEG case reads a folder of photos through the DataLoader instead). The ResNet cases' images carry a pattern
// of their class and 10% of their labels are redrawn (bench/model_cases.h), so that their loss can fall but not to
// zero; BERT's labels are tokens of the input. The learning rate rises
// linearly over the warm-up steps to the case's rate (the same recipe as pytorch_train.py's), which keeps fp16 from
// diverging early. Every step's loss (and the GradScaler's scale) is logged on the device and judged after the timing
// (bench/train_log.h): a case whose loss is not finite, whose timed steps were skipped, or whose loss did not fall
// is reported with "trained": false and the reason in "failed", and bench_train exits 1 (not with --quick, whose
// tiny batches at full learning rates are not expected to train: there the verdict is only shown). One JSON line per
// case, with the last step's loss ("loss") and the log ("losses", "loss_first", "loss_last", "skipped_steps");
// bench/pytorch_train.py prints the same cases through PyTorch's modes, and bench/train_table.py puts both side
// by side with the goals.
//
//   bench_train [--case NAME]... [--steps N] [--warmup N] [--batches N] [--seed N] [--photos DIR] [--no-graphs]
//               [--profile N] [--quick] [--selftest]
//
// --seed N: the generator's seed before the cases build their weights and data (default 1234).
// --selftest: checks the training rules of bench/train_log.h on made-up logs, and exits.
// --profile N: after a case's timing, N more eager steps under kiln's profiler; the top ops by GPU time go to
// standard error (the JSON lines on standard output stay as they are).
// --quick: tiny sizes and 2 steps, to check the code runs (on the CPU where there is no GPU; CTest does that).
// The cases are static-shape steps: on a GPU each is timed eagerly, then captured in a cuda::Graph and timed as
// replays; the line reports the replays ("cuda_graph": true) with the eager figures of the same run beside them
// ("eager_step_ms", "eager_peak_gib"), and "conv_accumulations": the convolution input gradients added into a
// residual sum by the backward-data graph per eager step (kiln/layers/cuda/conv_cudnn_graph.h). The JPEG cases'
// graph reads static input tensors that each batch from the loader is copied into before its replay (as the
// examples' --cuda-graph). --no-graphs times them eagerly only.
// Checkpointed BERT stays eager (its recomputed dropout rewinds the generator, which a replay cannot follow).
//
// Cases: resnet50_bf16, resnet50_fp16 (GradScaler), resnet18_cifar_bf16, bert_base_128, bert_base_512,
// bert_large_128, bert_base_128_ckpt (gradient checkpointing), resnet50_fp32 and bert_base_128_fp32 (float32, TF32
// products), bert_base_128_fp8 and bert_large_128_fp8 (FP8 Linears, kiln/layers/fp8_linear.h), bert_base_128_p20
// and bert_large_128_p20 (20 labelled positions per sequence, listed as Google's BERT data lists them, and the
// masked-LM head on those rows only: BertForMaskedLM's masked_positions; bert_base_128_fp8_p20 and
// bert_large_128_fp8_p20 in FP8), bert_base_dynamic
// (sequence classification on batches of varying length; see dynamic_case), resnet50_jpeg (--photos, or
// KILN_BENCH_IMAGES), resnet50_jpeg_gpu (the same photos decoded by nvJPEG on the GPU: ImageFolderOptions::decode =
// Decode::Gpu). ResNets: channels-last, SGD (lr 0.1, momentum 0.9, weight decay 5e-5); BERT: AdamW (lr 1e-4, weight
// decay 0.01); bf16 (or fp16) autocast; cuDNN benchmark mode on. Peak memory: the most the caching allocator handed out
// to tensors during the timed steps (parameters, optimizer state and data included).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "json_text.h"  // bench::json_escape, json_number
#include "kiln/kiln.h"
#include "kiln/layers/cuda/conv_cudnn_graph.h"  // conv2d_graph_accumulations_run
#include "kiln/tensor/cuda.h"
#include "model_cases.h"  // bench::make_resnet, bench::make_bert
#include "train_log.h"    // bench::judge_training

using namespace kiln;
using bench::json_escape;
using bench::json_number;

namespace {

struct Settings {
  Device device = Device::cuda(0);  // the CPU only for --quick without a GPU (a smoke run of the code)
  std::set<std::string> cases;      // empty: all
  int steps = 30;
  int warmup = 10;
  int batches = 8;             // distinct batches the steps cycle through (--batches N)
  bool batches_given = false;  // --batches was given: every case uses it (else resnet18_cifar_bf16 uses kCifarBatches)
  std::string photos;
  bool quick = false;
  bool graphs = true;    // capture the static-shape steps in CUDA graphs (--no-graphs: eager only)
  int profile = 0;       // eager steps profiled after each case's timing (--profile N)
  uint64_t seed = 1234;  // --seed N
};

const std::vector<std::string> kCases = {
    "resnet50_bf16",      "resnet50_fp16",         "resnet18_cifar_bf16",   "bert_base_128",      "bert_base_512",
    "bert_large_128",     "bert_base_128_ckpt",    "resnet50_fp32",         "bert_base_128_fp32", "bert_base_128_fp8",
    "bert_large_128_fp8", "bert_base_dynamic",     "resnet50_jpeg",         "resnet50_jpeg_gpu",  "bert_base_128_p20",
    "bert_large_128_p20", "bert_base_128_fp8_p20", "bert_large_128_fp8_p20"};

// "bf16", "fp16" or "fp32" (float32 products in TF32, kiln's default as PyTorch's with allow_tf32).
std::string precision_name(DType precision) {
  if (precision == DType::Float8_e4m3fn) return "fp8";
  return precision == DType::Float16 ? "fp16" : precision == DType::BFloat16 ? "bf16" : "fp32";
}

// What a case reports besides its timing.
struct Info {
  std::string model, input, precision, optimizer, unit;
  int64_t batch = 0;
};

// Warm-up steps, then `steps` steps between two events on the current stream.
struct Measured {
  double step_ms = 0, peak_gib = 0;
};

// Every step's loss, and the GradScaler's scale after it, written on the device as the steps run (a copy each,
// no host sync); read and judged once the case is timed.
class StepLog {
 public:
  // Room for the eager warm-up and timed steps, the profiled ones, and the graph's warm-up and timed replays (or
  // `at_least` steps).
  StepLog(const Settings& s, int warmup, const amp::GradScaler* scaler = nullptr, int64_t at_least = 0)
      : capacity_(std::max<int64_t>(at_least, 2 * (warmup + s.steps) + 2 * s.profile + 64)), scaler_(scaler) {
    losses_ = zeros({capacity_}, {.device = s.device});
    if (scaler_ != nullptr && scaler_->is_enabled()) scales_ = zeros({capacity_}, {.device = s.device});
  }
  // After a step (eager, or a graph replay): its loss, as the step left it.
  void record(const Tensor& loss) {
    if (n_ >= capacity_)
      throw Error("bench_train: more steps than the step log holds (" + std::to_string(capacity_) + ")");
    NoGradGuard no_grad;
    losses_.select(0, n_).copy_(loss.detach().reshape({}).to(DType::Float32));
    if (scales_.defined()) scales_.select(0, n_).copy_(scaler_->scale_tensor().reshape({}));
    ++n_;
  }
  int64_t count() const { return n_; }
  void mark_timed(int64_t begin, int64_t end) { timed_.emplace_back(begin, end); }
  // The verdict and the log as JSON fields; `ok` tells whether the run trained.
  std::string judge(int64_t cycle, bool& ok) const {
    const std::vector<double> losses = host(losses_), scales = host(scales_);
    const bench::TrainingVerdict v =
        bench::judge_training(losses, scales, scaler_ != nullptr ? scaler_->options().init_scale : 0.0, timed_, cycle);
    ok = v.ok;
    return bench::training_fields(v, losses, cycle);
  }

 private:
  std::vector<double> host(const Tensor& t) const {
    if (!t.defined() || n_ == 0) return {};
    return t.narrow(0, 0, n_).to_vector<double>();
  }
  int64_t capacity_;
  const amp::GradScaler* scaler_;
  Tensor losses_, scales_;
  int64_t n_ = 0;
  std::vector<std::pair<int64_t, int64_t>> timed_;
};

bool g_failed = false;  // a case did not train: bench_train exits 1

// The distinct batches a case cycles through (each a list of the tensors one step reads), and their static copies
// for a CUDA graph: an eager step takes the next batch, a feed copies the next one into the static tensors.
class BatchCycle {
 public:
  // columns[j][b]: tensor j of batch b (e.g. {images, labels}).
  explicit BatchCycle(const std::vector<std::vector<Tensor>>& columns) {
    for (size_t b = 0; b < columns.at(0).size(); ++b) {
      batches_.emplace_back();
      for (const auto& column : columns) batches_.back().push_back(column.at(b));
    }
    for (const Tensor& t : batches_.at(0)) statics_.push_back(t.clone());
  }
  const std::vector<Tensor>& next() { return batches_[next_++ % batches_.size()]; }
  void feed() {
    const std::vector<Tensor>& b = next();
    for (size_t j = 0; j < b.size(); ++j) statics_[j].copy_(b[j]);
  }
  const std::vector<Tensor>& statics() const { return statics_; }

 private:
  std::vector<std::vector<Tensor>> batches_;
  std::vector<Tensor> statics_;
  size_t next_ = 0;
};

// The learning rate over the eager warm-up steps: step k < warmup trains at base * (k + 1) / warmup, later steps at
// base (every group of `opt`).
class LrWarmup {
 public:
  LrWarmup(optim::Optimizer& opt, int warmup) : opt_(opt), warmup_(warmup) {
    for (size_t g = 0; g < opt.num_param_groups(); ++g) base_.push_back(opt.lr(g));
  }
  void before_step() {
    const double f = k_ < warmup_ ? static_cast<double>(k_ + 1) / warmup_ : 1.0;
    if (k_ <= warmup_)
      for (size_t g = 0; g < base_.size(); ++g) opt_.set_lr(g, base_[g] * f);
    ++k_;
  }

 private:
  optim::Optimizer& opt_;
  int warmup_;
  int k_ = 0;
  std::vector<double> base_;
};

Measured measure(const Settings& s, int warmup, const std::function<void()>& step, StepLog& log) {
  for (int i = 0; i < warmup; ++i) step();
  double step_ms = 0, peak_gib = 0;
  const int64_t first = log.count();
  if (s.device.is_cuda()) {
    cuda::synchronize();
    cuda::reset_peak_memory_stats();
    cuda::Event start(true), stop(true);
    cuda::profiler_start();  // the timed steps are the range an attached profiler records (bench/kernel_trace.cpp)
    start.record();
    for (int i = 0; i < s.steps; ++i) step();
    stop.record();
    stop.synchronize();
    cuda::profiler_stop();
    step_ms = start.elapsed_ms(stop) / s.steps;
    peak_gib = static_cast<double>(cuda::memory_stats().peak_allocated_bytes) / (1ull << 30);
  } else {  // a smoke run on the CPU: host time, no memory figure
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < s.steps; ++i) step();
    step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / s.steps;
  }
  log.mark_timed(first, log.count());
  return {step_ms, peak_gib};
}

// One JSON line; `extra` is appended inside the object (", \"key\": value" pairs, or empty).
void report(const std::string& name, const Info& info, const Settings& s, int warmup, const Measured& m,
            const std::string& extra) {
  std::printf(
      "{\"bench\": \"train\", \"framework\": \"kiln\", \"case\": \"%s\", \"model\": \"%s\", \"batch\": %lld, "
      "\"input\": \"%s\", \"precision\": \"%s\", \"optimizer\": \"%s\", \"step_ms\": %.3f, \"throughput\": %.1f, "
      "\"unit\": \"%s\", \"peak_gib\": %.3f, \"steps\": %d, \"warmup\": %d%s}\n",
      name.c_str(), info.model.c_str(), static_cast<long long>(info.batch), info.input.c_str(), info.precision.c_str(),
      info.optimizer.c_str(), m.step_ms, static_cast<double>(info.batch) * 1000.0 / m.step_ms, info.unit.c_str(),
      m.peak_gib, s.steps, warmup, extra.c_str());
  std::fflush(stdout);
}

// ", \"loss\": value" of the last step (a host sync, after the timing), or nothing without a loss tensor; then the
// step log's verdict, the fall judged over `cycle` steps (default: --batches; a failed verdict marks the run failed).
std::string loss_field(const Tensor* loss, const StepLog& log, const Settings& s, int64_t cycle = 0) {
  std::string out;
  if (loss != nullptr && loss->defined()) out = ", \"loss\": " + json_number(loss->item<double>(), 4);
  bool ok = true;
  out += log.judge(cycle > 0 ? cycle : s.batches, ok);
  if (!ok && !s.quick) g_failed = true;  // --quick: tiny batches at full learning rates; the verdict is shown only
  return out;
}

// --profile N: one step recorded and thrown away, then N steps kept; the table goes to standard error.
void profile_steps(const std::string& name, const Settings& s, const std::function<void()>& step) {
  if (s.profile <= 0) return;
  profiler::Profile prof({.schedule = {.wait = 0, .warmup = 1, .active = s.profile}});
  for (int i = 0; i < 1 + s.profile; ++i) {
    step();
    prof.step();
  }
  const profiler::Result& r = prof.result();
  std::fprintf(stderr, "profile of %s (%d eager steps):\n%s\n", name.c_str(), s.profile, r.table(40).c_str());
  // The same GPU time split by the op's shapes and the range it ran in (a module or a backward node).
  struct Row {
    int64_t calls = 0, gpu_ns = 0;
  };
  std::map<std::string, Row> rows;
  const auto& events = r.events();
  for (const profiler::Event& e : events) {
    if (e.kind != trace::Kind::Op || e.gpu_ns() <= 0) continue;
    const std::string parent = e.parent >= 0 ? events[static_cast<size_t>(e.parent)].name : "-";
    Row& row = rows[e.name + " | " + parent + " | " + e.shapes];
    row.calls += 1;
    row.gpu_ns += e.gpu_ns();
  }
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.gpu_ns > b.second.gpu_ns; });
  std::fprintf(stderr, "GPU ms per step | calls per step | op | enclosing range | shapes\n");
  for (size_t i = 0; i < sorted.size() && i < 80; ++i)
    std::fprintf(stderr, "%8.3f %6.1f  %s\n", static_cast<double>(sorted[i].second.gpu_ns) / 1e6 / s.profile,
                 static_cast<double>(sorted[i].second.calls) / s.profile, sorted[i].first.c_str());
  std::fprintf(stderr, "\n");
}

void time_and_report(const std::string& name, const Info& info, const Settings& s, int warmup,
                     const std::function<void()>& step, StepLog& log, const Tensor* loss = nullptr) {
  const Measured m = measure(s, warmup, step, log);
  report(name, info, s, warmup, m, ", \"cuda_graph\": false" + loss_field(loss, log, s));
  profile_steps(name, s, step);
}

// A case timed eagerly (`eager`, after `warmup` steps; it logs its own loss), then captured in a CUDA graph
// (`captured`, two warm-up steps inside capture(), which log their loss; the recorded run does not) and timed as
// replays (after `replay_warmup` of them), each replay after `feed` (it copies the next batch into the tensors
// `captured` reads; called once before the capture too) and logged after. The line reports the replays, with the
// eager figure of the same run beside them. Without a GPU, or with --no-graphs: eager only.
struct GraphedCase {
  std::function<void()> eager;
  std::function<void()> captured;
  std::function<void()> feed;
  int warmup = 0;
  int replay_warmup = 3;
  const Tensor* loss = nullptr;  // where the step leaves its loss: the last step's value goes in the line
  StepLog* log = nullptr;
  int64_t cycle = 0;                   // distinct batches the steps cycle through (0: --batches)
  std::function<std::string()> extra;  // more fields for the line (", \"key\": value"), asked at the end
};

void time_and_report_graphed(const std::string& name, const Info& info, const Settings& s, const GraphedCase& c) {
  StepLog& log = *c.log;
  const int64_t accumulations = nn::cuda_impl::conv2d_graph_accumulations_run();
  const Measured eager = measure(s, c.warmup, c.eager, log);
  // Convolution input gradients added into a residual sum by the backward-data graph, per eager step.
  const double accumulations_per_step =
      static_cast<double>(nn::cuda_impl::conv2d_graph_accumulations_run() - accumulations) /
      std::max(1, c.warmup + s.steps);
  profile_steps(name, s, c.eager);
  if (!s.device.is_cuda() || !s.graphs) {
    report(name, info, s, c.warmup, eager,
           ", \"cuda_graph\": false" + (c.extra ? c.extra() : "") + loss_field(c.loss, log, s, c.cycle));
    return;
  }
  c.feed();
  cuda::Graph graph;
  cuda::synchronize();
  cuda::reset_peak_memory_stats();
  try {
    graph.capture(
        [&] {
          c.captured();
          if (!cuda::Graph::capturing()) log.record(*c.loss);  // capture()'s eager warm-up steps
        },
        /*warmup=*/2);
  } catch (const std::exception& e) {  // the eager figure, and why there is no graph one
    report(name, info, s, c.warmup, eager,
           ", \"cuda_graph\": false, \"graph_error\": \"" + json_escape(e.what()) + "\"" +
               loss_field(c.loss, log, s, c.cycle));
    return;
  }
  cuda::synchronize();
  // The capture's tensors are the graph's memory for good: its peak is the warm-up and capture's.
  const double capture_peak = static_cast<double>(cuda::memory_stats().peak_allocated_bytes) / (1ull << 30);
  Measured graphed = measure(
      s, c.replay_warmup,
      [&] {
        c.feed();
        graph.replay();
        log.record(*c.loss);
      },
      log);
  graphed.peak_gib = std::max(graphed.peak_gib, capture_peak);
  char extra[220];
  std::snprintf(
      extra, sizeof extra,
      ", \"cuda_graph\": true, \"eager_step_ms\": %.3f, \"eager_peak_gib\": %.3f, \"conv_accumulations\": %.1f",
      eager.step_ms, eager.peak_gib, accumulations_per_step);
  report(name, info, s, c.warmup, graphed, extra + (c.extra ? c.extra() : "") + loss_field(c.loss, log, s, c.cycle));
}

void report_other(const std::string& name, const char* key, const std::string& why) {
  std::printf("{\"bench\": \"train\", \"framework\": \"kiln\", \"case\": \"%s\", \"%s\": \"%s\"}\n", name.c_str(), key,
              json_escape(why).c_str());
  std::fflush(stdout);
}

// The CIFAR case's distinct batches unless --batches says otherwise: its ~100 steps of 256 small images would
// otherwise see each of 8 batches a dozen times, and ResNet-18 memorises 2,048 images (even their redrawn labels) in
// that many passes. 64 batches (50 MB of images) are each seen about once or twice.
constexpr int kCifarBatches = 64;

void resnet_case(const std::string& name, const Settings& s, int depth, int64_t batch, int64_t size, int64_t classes,
                 bool cifar, DType precision) {
  const Device dev = s.device;
  const int batches = cifar && !s.batches_given && !s.quick ? kCifarBatches : s.batches;
  bench::ResNetCase c = bench::make_resnet(depth, batch, size, classes, cifar, dev, MemoryFormat::ChannelsLast, batches,
                                           /*learnable=*/true);
  optim::SGD opt(c.model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-5});
  amp::GradScaler scaler({.enabled = precision == DType::Float16});
  StepLog log(s, s.warmup, &scaler);
  LrWarmup lr(opt, s.warmup);
  Tensor loss;  // the last step's (in a replay: the captured step's tensor, which each replay rewrites)
  auto train = [&](const Tensor& x, const Tensor& y) {
    opt.zero_grad(true);
    {
      amp::Autocast cast(precision == DType::Float32 ? DType::BFloat16 : precision, precision != DType::Float32);
      loss = nn::cross_entropy(c.model(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  };
  BatchCycle cycle({c.xs, c.ys});
  auto eager = [&] {
    const std::vector<Tensor>& b = cycle.next();
    lr.before_step();
    train(b[0], b[1]);
    log.record(loss);
  };
  const Info info{.model = cifar ? "resnet" + std::to_string(depth) + "-cifar" : "resnet" + std::to_string(depth),
                  .input = std::to_string(size) + "x" + std::to_string(size),
                  .precision = precision_name(precision),
                  .optimizer = "sgd",
                  .unit = "img/s",
                  .batch = batch};
  time_and_report_graphed(name, info, s,
                          {.eager = eager,
                           .captured = [&] { train(cycle.statics()[0], cycle.statics()[1]); },
                           .feed = [&] { cycle.feed(); },
                           .warmup = s.warmup,
                           .loss = &loss,
                           .log = &log,
                           .cycle = batches});
}

// precision: BFloat16 (autocast), Float32 (TF32 products) or Float8_e4m3fn (bf16 autocast with the default FP8
// recipe: every Linear whose sizes are multiples of 16 in FP8, the 30,522-wide MLM decoder in bf16).
void bert_case(const std::string& name, const Settings& s, const nn::models::BertConfig& config, int64_t batch,
               int64_t seq, bool checkpointing, DType precision = DType::BFloat16, int64_t predictions = 0) {
  const Device dev = s.device;
  bench::BertCase c = bench::make_bert(config, batch, seq, dev, s.batches, predictions);
  c.model->bert->set_gradient_checkpointing(checkpointing);
  const bool fp8 = precision == DType::Float8_e4m3fn;
  const amp::Fp8Recipe recipe{};
  if (fp8) amp::prepare_fp8(*c.model, recipe, dev);
  optim::AdamW opt(c.model->parameters(), {.lr = 1e-4, .weight_decay = 0.01});
  StepLog log(s, s.warmup);
  LrWarmup lr(opt, s.warmup);
  Tensor loss;
  auto train = [&](const Tensor& ids, const Tensor& labels, const Tensor& positions) {
    opt.zero_grad(true);
    {
      amp::Autocast cast(DType::BFloat16, {.enabled = precision != DType::Float32,
                                           // on the CPU (--quick) autocast applies only with FP8, which the
                                           // CPU computes by its reference
                                           .device_type = fp8 ? dev.type() : DeviceType::CUDA,
                                           .fp8 = fp8 ? std::optional<amp::Fp8Recipe>(recipe) : std::nullopt});
      loss = c.model(ids, c.types, c.mask, labels, positions).loss;
    }
    loss.backward();
    opt.step();
  };
  BatchCycle cycle(predictions > 0 ? std::vector<std::vector<Tensor>>{c.all_ids, c.all_labels, c.all_positions}
                                   : std::vector<std::vector<Tensor>>{c.all_ids, c.all_labels});
  auto at = [&](const std::vector<Tensor>& b) { return predictions > 0 ? b[2] : Tensor{}; };
  auto eager = [&] {
    const std::vector<Tensor>& b = cycle.next();
    lr.before_step();
    train(b[0], b[1], at(b));
    log.record(loss);
  };
  const Info info{.model = config.hidden_size >= 1024 ? "bert-large" : "bert-base",
                  .input = std::to_string(seq) + " tokens" +
                           (predictions > 0 ? ", " + std::to_string(predictions) + " predicted" : ""),
                  .precision = precision_name(precision),
                  .optimizer = "adamw",
                  .unit = "seq/s",
                  .batch = batch};
  // Checkpointing rewinds the generator to recompute dropout, which replays could not follow: eager only.
  if (checkpointing) return time_and_report(name, info, s, s.warmup, eager, log, &loss);
  time_and_report_graphed(name, info, s,
                          {.eager = eager,
                           .captured = [&] { train(cycle.statics()[0], cycle.statics()[1], at(cycle.statics())); },
                           .feed = [&] { cycle.feed(); },
                           .warmup = s.warmup,
                           .loss = &loss,
                           .log = &log});
}

// BERT-base fine-tuning for sequence classification on batches of varying length: the dynamic-shape case, where no
// CUDA graph applies. 64 batches of 32 sequences (quick: 4 of 2): the 2,048 lengths are drawn uniformly from
// [16, 128], sorted and cut into batches (as length-grouped sampling does), so each batch is padded only to its
// longest sequence and the batches come in dozens of distinct shapes; their order is shuffled once. Tokens are
// uniform over [1, vocab), padding is token 0 with mask 0; the label says whether the first token after position 0
// lies in the upper half of the vocabulary, which the model can learn. AdamW (lr 1e-4, weight decay 0.01, the LR
// warm-up over the first --warmup steps), bf16 autocast. The first epoch, where every shape is new (plans, cuDNN
// autotuning), is timed on its own ("first_epoch_s", host time to the last step's completion); then two more
// epochs are timed as one block ("step_ms", per step; "tokens_per_step", the mean padded tokens of a batch).
void dynamic_case(const std::string& name, const Settings& s) {
  const Device dev = s.device;
  const int64_t batches = s.quick ? 4 : 64, batch = s.quick ? 2 : 32, lo = 16, hi = 128;
  nn::models::BertConfig config = nn::models::BertConfig::base();
  if (s.quick) {
    config.num_hidden_layers = 2;
    config.vocab_size = 1000;
  }
  const int64_t vocab = config.vocab_size;
  std::vector<int64_t> lengths = randint(lo, hi + 1, {batches * batch}, {.dtype = DType::Int64}).to_vector<int64_t>();
  std::sort(lengths.begin(), lengths.end());
  const Tensor order = randperm(batches, {.dtype = DType::Int64});
  struct B {
    Tensor ids, types, mask, labels;
  };
  std::vector<B> data;
  int64_t padded_tokens = 0;
  for (int64_t k = 0; k < batches; ++k) {
    const int64_t b0 = order[k].item<int64_t>() * batch;
    const int64_t len = lengths[static_cast<size_t>(b0 + batch - 1)];  // the batch's longest
    std::vector<int64_t> lens(lengths.begin() + b0, lengths.begin() + b0 + batch);
    const Tensor keep = arange(len, {.dtype = DType::Int64}).reshape({1, len}) <
                        from_vector(lens, {batch, 1});  // (batch, len): inside each sequence
    Tensor ids = where(keep, randint(1, vocab, {batch, len}, {.dtype = DType::Int64}),
                       zeros({batch, len}, {.dtype = DType::Int64}));
    Tensor labels = cast(ids.select(1, 1) >= Scalar(vocab / 2), DType::Int64);
    data.push_back({ids.to(dev), zeros({batch, len}, {.dtype = DType::Int64, .device = dev}),
                    cast(keep, DType::Int64).to(dev), labels.to(dev)});
    padded_tokens += batch * len;
  }
  auto model = nn::make<nn::models::BertForSequenceClassification>(config, 2);
  model->to(dev);
  model->train();
  optim::AdamW opt(model->parameters(), {.lr = 1e-4, .weight_decay = 0.01});
  StepLog log(s, s.warmup, nullptr, 3 * batches + 2 * s.profile + 64);
  LrWarmup lr(opt, s.warmup);
  Tensor loss;
  size_t next = 0;
  auto step = [&] {
    const B& b = data[next++ % data.size()];
    lr.before_step();
    opt.zero_grad(true);
    {
      amp::Autocast cast(DType::BFloat16);
      loss = model(b.ids, b.types, b.mask, b.labels).loss;
    }
    loss.backward();
    opt.step();
    log.record(loss);
  };
  if (dev.is_cuda()) cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < batches; ++i) step();
  if (dev.is_cuda()) cuda::synchronize();
  const double first_epoch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Settings timed = s;
  timed.steps = static_cast<int>(2 * batches);
  const Measured m = measure(timed, 0, step, log);
  const Info info{.model = "bert-base-classifier",
                  .input = std::to_string(lo) + "-" + std::to_string(hi) + " tokens",
                  .precision = "bf16",
                  .optimizer = "adamw",
                  .unit = "seq/s",
                  .batch = batch};
  const std::string extra = ", \"cuda_graph\": false, \"first_epoch_s\": " + json_number(first_epoch_s, 3) +
                            ", \"epoch_batches\": " + std::to_string(batches) + ", \"tokens_per_step\": " +
                            json_number(static_cast<double>(padded_tokens) / static_cast<double>(batches), 1);
  report(name, info, timed, 0, m, extra + loss_field(&loss, log, s, /*cycle=*/batches));  // first epoch vs last
  profile_steps(name, s, step);
}

// ResNet-50 fed from a folder of JPEG photos (ImageFolder layout, bench/make_photos.py): imagenet_train(224)
// in 16 loader threads, pinned batches copied to the GPU ahead on the loader's copy stream. The loader runs
// epoch after epoch; the warm-up covers more than the batches it prefetches, so the timed steps wait for
// decoding as a long run would. With gpu_decode the workers read files and draw crops, and decode each batch on
// the GPU (nvJPEG + one crop/resize/normalise kernel, channels-last float32), which the training stream waits
// for on the GPU.
void jpeg_case(const std::string& name, const Settings& s, bool gpu_decode) {
  if (s.photos.empty()) {
    report_other(name, "skipped", "no --photos DIR given (bench/make_photos.py writes one; or set KILN_BENCH_IMAGES)");
    return;
  }
  const Device dev = s.device;
  const int64_t batch = s.quick ? 2 : 256;
  data::ImageFolderOptions folder_options;
  if (gpu_decode) {
    folder_options.decode = data::Decode::Gpu;
    folder_options.gpu.channels_last = true;
  }
  auto dataset = std::make_shared<data::ImageFolder>(s.photos, data::transforms::imagenet_train(224), folder_options);
  if (static_cast<int64_t>(dataset->size()) < batch) {
    report_other(name, "skipped", "the folder holds fewer photos than one batch");
    return;
  }
  const int workers = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16);
  data::DataLoader loader(dataset, {.batch_size = batch,
                                    .workers = workers,
                                    .shuffle = true,
                                    .drop_last = true,
                                    .pin_memory = dev.is_cuda(),
                                    .device = dev,
                                    .prefetch_next_epoch = true});  // as PyTorch's persistent workers
  auto model = nn::models::resnet50({.num_classes = static_cast<int64_t>(dataset->classes().size())});
  model->to(dev, MemoryFormat::ChannelsLast);
  model->train();
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-5});
  const int warmup = std::max(s.warmup, 4 * workers);
  StepLog log(s, warmup);
  LrWarmup lr(opt, warmup);
  uint64_t epoch = 0;
  auto range = std::make_unique<data::DataLoader::Epoch>(loader.epoch(epoch));
  auto it = range->begin();
  bool first = true;
  // Per batch handed out: how long the host waited for it, and whether its GPU work (the copy, or the decode)
  // was still running then, so that the training stream waited for it on the GPU.
  std::vector<double> waits_ms;
  std::vector<double> loader_waits_ms;  // of waits_ms, the loader's hand-out (its workers, its CUDA calls)
  std::vector<double> copies_ms;        // the host's time in feed's copies (driver calls: a held lock shows there)
  std::vector<int> pending;
  // The next batch, as a range-for would hand it out (the ++ starts the following batch's copy), epoch after
  // epoch. A copy of the Batch shares its tensors.
  auto next_batch = [&]() -> data::Batch {
    const auto start = std::chrono::steady_clock::now();
    if (!first) ++it;
    first = false;
    if (it == range->end()) {
      range = std::make_unique<data::DataLoader::Epoch>(loader.epoch(++epoch));
      it = range->begin();
    }
    data::Batch b = *it;
    waits_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    loader_waits_ms.push_back(1000 * range->stats().last_wait_s);
    pending.push_back(b.ready && !b.ready->query() ? 1 : 0);
    return b;
  };
  // The last `steps` batches' mean host wait (ms) and the share still running on the GPU when handed out.
  auto waits = [&]() -> std::string {
    // The mean of a per-batch figure over the last `steps` batches (0 when there are none).
    auto tail_mean = [&](const auto& v) {
      const size_t n = std::min(v.size(), static_cast<size_t>(s.steps));
      double sum = 0;
      for (size_t i = v.size() - n; i < v.size(); ++i) sum += static_cast<double>(v[i]);
      return n ? sum / static_cast<double>(n) : 0.0;
    };
    std::string out = ", \"batch_wait_ms\": " + json_number(tail_mean(waits_ms), 3) +
                      ", \"loader_wait_ms\": " + json_number(tail_mean(loader_waits_ms), 3) +
                      ", \"batch_gpu_pending\": " + json_number(tail_mean(pending), 3);
    if (!copies_ms.empty()) out += ", \"feed_copy_ms\": " + json_number(tail_mean(copies_ms), 3);
    // A batch's time on one worker since the current epoch began: loading its samples (reading the files, drawing
    // the crops) and collating it (with gpu_decode, the decode).
    const data::LoaderStats ls = range->stats();
    if (ls.batches_loaded > 0) {
      const auto per = static_cast<double>(ls.batches_loaded);
      out += ", \"worker_samples_ms\": " + json_number(1000 * ls.samples_s / per, 2) +
             ", \"worker_collate_ms\": " + json_number(1000 * ls.collate_s / per, 2);
    }
    return out;
  };
  // One training step on (images, labels): float32 images, channels-last as the model.
  Tensor loss;
  auto train = [&](const Tensor& images, const Tensor& labels) {
    opt.zero_grad(true);
    {
      amp::Autocast cast(DType::BFloat16);
      loss = nn::cross_entropy((*model)(images), labels);
    }
    loss.backward();
    opt.step();
  };
  auto step = [&] {
    data::Batch b = next_batch();
    auto [images, labels] = b;  // (N, 3, 224, 224) float32, (N) int64, on the GPU
    lr.before_step();
    train(images.contiguous(MemoryFormat::ChannelsLast), labels);
    log.record(loss);
  };
  const Info info{.model = "resnet50",
                  .input = gpu_decode ? "224x224 jpeg, nvjpeg" : "224x224 jpeg",
                  .precision = "bf16",
                  .optimizer = "sgd",
                  .unit = "img/s",
                  .batch = batch};
  // Graphed as the in-memory case, on static input tensors: each batch is copied into them on the training
  // stream (after the loader's copy or decode, which the stream waits for), then the graph is replayed.
  Tensor static_images, static_labels;
  auto feed = [&] {
    data::Batch b = next_batch();
    auto [images, labels] = b;
    const auto start = std::chrono::steady_clock::now();
    if (!static_images.defined()) {
      static_images = images.contiguous(MemoryFormat::ChannelsLast).clone();
      static_labels = labels.clone();
    } else {
      static_images.copy_(images);  // into the channels-last tensor, whatever the batch's layout
      static_labels.copy_(labels);
    }
    copies_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  };
  time_and_report_graphed(name, info, s,
                          {.eager = step,
                           .captured = [&] { train(static_images, static_labels); },
                           .feed = feed,
                           .warmup = warmup,
                           .replay_warmup = warmup,
                           .loss = &loss,
                           .log = &log,
                           .extra = [&]() -> std::string {
                             if (!gpu_decode) return waits();
                             const data::GpuDecodeCounts n = data::gpu_decode_counts();  // the whole run's
                             return ", \"decoded_by\": {\"engines\": " + std::to_string(n.engines) +
                                    ", \"one_at_a_time\": " + std::to_string(n.one_at_a_time) +
                                    ", \"cpu\": " + std::to_string(n.cpu) + "}" + waits();
                           }});
}

void run_case(const std::string& name, const Settings& s) {
  const bool q = s.quick;
  nn::models::BertConfig base = nn::models::BertConfig::base(), large = nn::models::BertConfig::large();
  if (q) {  // the code paths only: two layers and a small vocabulary
    base.num_hidden_layers = large.num_hidden_layers = 2;
    base.vocab_size = large.vocab_size = 1000;
  }
  if (name == "resnet50_bf16") return resnet_case(name, s, 50, q ? 2 : 256, q ? 64 : 224, 1000, false, DType::BFloat16);
  if (name == "resnet50_fp16") return resnet_case(name, s, 50, q ? 2 : 256, q ? 64 : 224, 1000, false, DType::Float16);
  if (name == "resnet18_cifar_bf16") return resnet_case(name, s, 18, q ? 2 : 512, 32, 10, true, DType::BFloat16);
  if (name == "bert_base_128") return bert_case(name, s, base, q ? 2 : 128, q ? 32 : 128, false);
  if (name == "bert_base_512") return bert_case(name, s, base, q ? 2 : 64, q ? 32 : 512, false);
  if (name == "bert_large_128") return bert_case(name, s, large, q ? 2 : 64, q ? 32 : 128, false);
  // The masked-LM head on the 20 labelled positions of each sequence only (Google's max_predictions_per_seq at 128).
  if (name == "bert_base_128_p20")
    return bert_case(name, s, base, q ? 2 : 128, q ? 32 : 128, false, DType::BFloat16, q ? 4 : 20);
  if (name == "bert_large_128_p20")
    return bert_case(name, s, large, q ? 2 : 64, q ? 32 : 128, false, DType::BFloat16, q ? 4 : 20);
  if (name == "bert_base_128_fp8_p20")
    return bert_case(name, s, base, q ? 2 : 128, q ? 32 : 128, false, DType::Float8_e4m3fn, q ? 4 : 20);
  if (name == "bert_large_128_fp8_p20")
    return bert_case(name, s, large, q ? 2 : 64, q ? 32 : 128, false, DType::Float8_e4m3fn, q ? 4 : 20);
  if (name == "bert_base_128_ckpt") return bert_case(name, s, base, q ? 2 : 128, q ? 32 : 128, true);
  if (name == "resnet50_fp32") return resnet_case(name, s, 50, q ? 2 : 256, q ? 64 : 224, 1000, false, DType::Float32);
  if (name == "bert_base_128_fp32") return bert_case(name, s, base, q ? 2 : 128, q ? 32 : 128, false, DType::Float32);
  if (name == "bert_base_128_fp8")
    return bert_case(name, s, base, q ? 2 : 128, q ? 32 : 128, false, DType::Float8_e4m3fn);
  if (name == "bert_large_128_fp8")
    return bert_case(name, s, large, q ? 2 : 64, q ? 32 : 128, false, DType::Float8_e4m3fn);
  if (name == "bert_base_dynamic") return dynamic_case(name, s);
  if (name == "resnet50_jpeg") return jpeg_case(name, s, false);
  if (name == "resnet50_jpeg_gpu") return jpeg_case(name, s, true);
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  if (const char* env = std::getenv("KILN_BENCH_IMAGES")) s.photos = env;
  auto usage = [] {
    std::fprintf(
        stderr,
        "usage: bench_train [--case NAME]... [--steps N] [--warmup N] [--batches N] [--seed N] [--photos DIR]\n"
        "                   [--no-graphs] [--profile N] [--quick] [--selftest]\n"
        "cases: resnet50_bf16 resnet50_fp16 resnet18_cifar_bf16 bert_base_128 bert_base_512\n"
        "       bert_large_128 bert_base_128_ckpt resnet50_fp32 bert_base_128_fp32 bert_base_128_fp8\n"
        "       bert_large_128_fp8 bert_base_dynamic resnet50_jpeg resnet50_jpeg_gpu bert_base_128_p20\n"
        "       bert_large_128_p20 bert_base_128_fp8_p20 bert_large_128_fp8_p20\n");
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--selftest") return bench::training_selftest();
    if (a == "--quick") {
      s.quick = true;
      s.steps = 2;
      s.warmup = 1;
      s.batches = 2;
    } else if (a == "--batches" && has_value) {
      char* end = nullptr;
      const long n = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || argv[i][0] == '\0' || n < 1 || n > 4096) {
        std::fprintf(stderr, "bench_train: --batches takes a whole number from 1 to 4096, not '%s'\n", argv[i]);
        return 2;
      }
      s.batches = static_cast<int>(n);
      s.batches_given = true;
    } else if (a == "--case" && has_value) {
      const std::string name = argv[++i];
      if (std::find(kCases.begin(), kCases.end(), name) == kCases.end()) {
        std::fprintf(stderr, "bench_train: no case named '%s'\n", name.c_str());
        return usage();
      }
      s.cases.insert(name);
    } else if (a == "--steps" && has_value) {
      s.steps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--warmup" && has_value) {
      s.warmup = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--seed" && has_value) {
      char* end = nullptr;
      s.seed = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0' || argv[i][0] == '-' || argv[i][0] == '\0') {
        std::fprintf(stderr, "bench_train: --seed takes a non-negative whole number, not '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--profile" && has_value) {
      s.profile = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--no-graphs") {
      s.graphs = false;
    } else if (a == "--photos" && has_value) {
      s.photos = argv[++i];
    } else {
      return usage();
    }
  }
  if (!cuda::is_available()) {
    if (!s.quick) {
      std::printf("bench_train: no GPU visible; nothing to measure (--quick runs the cases' code on the CPU)\n");
      return 0;
    }
    s.device = Device::cpu();
  } else {
    nn::set_cudnn_benchmark(true);
  }
  manual_seed(s.seed);
  std::printf(
      "kiln %s train on %s: %d steps timed as one block after %d warm-up steps, cycling through %d batches; "
      "seed %llu\n",
      KILN_VERSION_STRING, s.device.str().c_str(), s.steps, s.warmup, s.batches,
      static_cast<unsigned long long>(s.seed));
  for (const std::string& name : kCases) {
    if (!s.cases.empty() && !s.cases.count(name)) continue;
    try {
      run_case(name, s);
    } catch (const std::exception& e) {
      std::string what = e.what();
      if (what.size() > 400) what.resize(400);
      report_other(name, "error", what);
    }
    if (s.device.is_cuda()) cuda::empty_cache();  // each case's peak is its own
  }
  if (g_failed) std::fprintf(stderr, "bench_train: a case did not train (its line says why: \"failed\")\n");
  return g_failed ? 1 : 0;
}
