// The optimizer step on a GPU: AdamW over BERT-base's parameters (about 110M in ~200 tensors), every gradient
// set; bench/pytorch_optim.py times torch.optim.AdamW (fused=True and foreach=True) on the same parameters.
//
//   bench_optim [--quick]
//
// Median of 50 steps after 10 warm-up steps, timed with CUDA events.
#include <cstdio>
#include <cstring>

#include "gpu_timing.h"  // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (!cuda::is_available()) {
    std::printf("bench_optim: no GPU visible; nothing to measure\n");
    return 0;
  }
  nn::models::BertConfig config = nn::models::BertConfig::base();
  if (quick) config.num_hidden_layers = 1;
  auto model = std::make_shared<nn::models::BertForMaskedLM>(config);
  model->to(Device::cuda(0));
  const std::vector<Tensor> params = model->parameters();
  int64_t count = 0;
  for (const Tensor& p : params) {
    Tensor g = p;  // handles share the parameter
    g.mutable_grad() = randn(p.shape(), {.dtype = p.dtype(), .device = p.device()}) * 1e-3;
    count += p.numel();
  }
  optim::AdamW opt(params, {.lr = 1e-4, .weight_decay = 0.01});
  const double ms = bench::median_step_ms(quick ? 1 : 10, quick ? 3 : 50, [&] { opt.step(); });
  std::printf("kiln  adamw step  bert-base  %zu tensors  %.1fM params  %8.3f ms\n", params.size(),
              static_cast<double>(count) / 1e6, ms);
  return 0;
}
