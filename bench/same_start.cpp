// ResNet-50 trained with bench_train's recipe from a start that PyTorch wrote (bench/same_start.py export): the
// same weights and the same batch on both sides, so that kiln's and PyTorch's losses can be compared step by step
// at the benchmarked configuration (batch 256, 224x224, 1000 classes, channels-last, SGD lr 0.1, momentum 0.9,
// weight decay 5e-5, one batch memorised).
//
//   python3 bench/same_start.py export DIR --seed 1234     # DIR/weights.pt, DIR/batch.pt
//   bench_same_start DIR [--steps 75] [--precision bf16|fp32]
//   python3 bench/same_start.py train DIR [--steps 75] [--precision bf16|fp32]
//
// Prints one JSON line: the loss of every step. fp32 runs with TF32 off on both sides.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>

#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

namespace {

// The batch PyTorch wrote: {"x": (B, 3, H, W) float32, "y": (B,) int64}.
std::pair<Tensor, Tensor> load_batch(const std::string& path) {
  Tensor x, y;
  for (auto& [name, t] : io::load_torch_file(path)) {
    if (name == "x") x = t;
    if (name == "y") y = t;
  }
  KILN_CHECK(x.defined() && y.defined(), path, " must hold tensors named x and y (bench/same_start.py export writes ",
             "them); found ", x.defined() ? "x" : "no x", " and ", y.defined() ? "y" : "no y");
  return {x, y};
}

int run(const std::string& dir, int steps, const std::string& precision) {
  const Device dev = cuda::is_available() ? Device::cuda(0) : Device::cpu();  // the CPU: slow, for a check only
  if (dev.is_cuda()) {
    nn::set_cudnn_benchmark(true);
    cuda::set_allow_tf32(false);  // matmuls and convolutions
  }
  auto model = nn::models::resnet50({.num_classes = 1000});
  model->load_state_dict(io::load_torch_file(dir + "/weights.pt"));
  model->to(dev, MemoryFormat::ChannelsLast);
  model->train();
  auto [x, y] = load_batch(dir + "/batch.pt");
  x = x.to(dev).contiguous(MemoryFormat::ChannelsLast);  // (256, 3, 224, 224) float32
  y = y.to(dev);                                          // (256,) int64
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-5});
  std::string losses;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad(true);
    Tensor loss;
    {
      amp::Autocast cast(DType::BFloat16, /*enabled=*/precision == "bf16");
      loss = nn::cross_entropy((*model)(x), y);
    }
    loss.backward();
    opt.step();
    char v[32];
    std::snprintf(v, sizeof v, "%s%.6g", i ? ", " : "", loss.item<double>());
    losses += v;
  }
  std::printf("{\"framework\": \"kiln\", \"precision\": \"%s\", \"steps\": %d, \"losses\": [%s]}\n", precision.c_str(),
              steps, losses.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_same_start DIR [--steps N] [--precision bf16|fp32]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int steps = 75;
  std::string precision = "bf16";
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      char* end = nullptr;
      const long n = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || n < 1 || n > 1000000) {
        std::fprintf(stderr, "bench_same_start: --steps takes a whole number from 1 to 1000000, not '%s'\n", argv[i]);
        return 2;
      }
      steps = static_cast<int>(n);
    } else if (a == "--precision" && i + 1 < argc) {
      precision = argv[++i];
    } else {
      std::fprintf(stderr, "bench_same_start: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (precision != "bf16" && precision != "fp32") {
    std::fprintf(stderr, "bench_same_start: --precision takes bf16 or fp32, not '%s'\n", precision.c_str());
    return 2;
  }
  try {
    return run(dir, steps, precision);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_same_start: %s\n", e.what());
    return 1;
  }
}
