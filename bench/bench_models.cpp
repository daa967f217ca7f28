// Training-step speed of whole models on a GPU: forward + loss + backward, beside PyTorch
// (bench/pytorch_models.py times the same models, shapes and settings).
//
//   bench_models [--quick] [--model resnet50|bert-base|all] [--steps N] [--amp bf16|fp16]
//
// ResNet-50: batch 256, 224x224 images, 1000 classes, cross-entropy, NCHW and channels-last.
// BERT-base: batch 128, sequence 128, masked-LM head with 15% of positions labelled (the rest -100),
// an attention mask with the last 16 tokens of every other sequence padded.
// float32 with TF32 tensor cores (kiln's and PyTorch's defaults for convolutions; matmuls set alike),
// cuDNN benchmark mode on. --amp runs the forward under autocast. Reports the median of the timed steps
// (CUDA events around each step, gradients set to none between steps) and the peak memory in tensors.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_timing.h"  // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "model_cases.h"  // bench::make_resnet50, bench::make_bert_base: the models and their random batches

using namespace kiln;

namespace {

struct Settings {
  bool quick = false;
  std::string model = "all";
  int steps = 20;
  int warmup = 5;
  std::optional<DType> amp;
};

struct Timing {
  double median_ms;
  double peak_gib;
};

Timing time_steps(const Settings& s, const std::function<void()>& step) {
  for (int i = 0; i < s.warmup; ++i) step();  // warm-up (cuDNN's algorithm search included) before the peak resets
  cuda::synchronize();
  cuda::reset_peak_memory_stats();
  const double ms = bench::median_step_ms(0, s.steps, step);
  return {ms, static_cast<double>(cuda::memory_stats().peak_allocated_bytes) / (1ull << 30)};
}

Tensor autocast_forward(const Settings& s, const std::function<Tensor()>& f) {
  if (!s.amp) return f();
  autocast::Guard guard(DeviceType::CUDA, *s.amp);
  return f();
}

void bench_resnet50(const Settings& s, MemoryFormat format) {
  bench::ResNetCase c = bench::make_resnet50(Device::cuda(0), format, s.quick);
  auto& model = c.model;
  const Tensor &x = c.x, &y = c.y;
  const int64_t batch = c.batch, size = c.size;
  const Timing t = time_steps(s, [&] {
    model->zero_grad(true);
    Tensor loss = autocast_forward(s, [&] { return nn::cross_entropy((*model)(x), y); });
    loss.backward();
  });
  std::printf("kiln  resnet50  %-13s batch %3lld %3lldx%-3lld  %8.2f ms/step  %8.1f img/s  peak %.2f GiB\n",
              format == MemoryFormat::ChannelsLast ? "channels-last" : "nchw", static_cast<long long>(batch),
              static_cast<long long>(size), static_cast<long long>(size), t.median_ms,
              static_cast<double>(batch) * 1000.0 / t.median_ms, t.peak_gib);
}

void bench_bert_base(const Settings& s) {
  bench::BertCase c = bench::make_bert_base(Device::cuda(0), s.quick);
  auto& model = c.model;
  const Tensor &ids = c.ids, &types = c.types, &mask = c.mask, &labels = c.labels;
  const int64_t batch = c.batch, seq = c.seq;
  const Timing t = time_steps(s, [&] {
    model->zero_grad(true);
    Tensor loss = autocast_forward(s, [&] { return model(ids, types, mask, labels).loss; });
    loss.backward();
  });
  std::printf("kiln  bert-base  mlm           batch %3lld seq %-4lld   %8.2f ms/step  %8.1f seq/s  peak %.2f GiB\n",
              static_cast<long long>(batch), static_cast<long long>(seq), t.median_ms,
              static_cast<double>(batch) * 1000.0 / t.median_ms, t.peak_gib);
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_models: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick") {
      s.quick = true;
      s.steps = 3;
      s.warmup = 1;
    } else if (a == "--model") {
      s.model = next();
    } else if (a == "--steps") {
      s.steps = std::max(1, std::stoi(next()));
    } else if (a == "--amp") {
      const std::string d = next();
      if (d != "bf16" && d != "fp16") {
        std::fprintf(stderr, "bench_models: --amp takes bf16 or fp16, got %s\n", d.c_str());
        return 2;
      }
      s.amp = d == "bf16" ? DType::BFloat16 : DType::Float16;
    } else {
      std::fprintf(stderr,
                   "usage: bench_models [--quick] [--model resnet50|bert-base|all] [--steps N] [--amp bf16|fp16]\n");
      return 2;
    }
  }
  if (!cuda::is_available()) {
    std::printf("bench_models: no GPU visible; nothing to measure\n");
    return 0;
  }
  nn::set_cudnn_benchmark(true);
  std::printf("kiln models: float32 (TF32 %s)%s, median of %d steps\n", cuda::allow_tf32() ? "on" : "off",
              s.amp ? (*s.amp == DType::BFloat16 ? ", autocast bf16" : ", autocast fp16") : "", s.steps);
  if (s.model == "all" || s.model == "resnet50") {
    bench_resnet50(s, MemoryFormat::Contiguous);
    bench_resnet50(s, MemoryFormat::ChannelsLast);
  }
  if (s.model == "all" || s.model == "bert-base") bench_bert_base(s);
  return 0;
}
