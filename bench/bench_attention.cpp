// scaled_dot_product_attention forward + backward on a GPU, fused (cuDNN) and math paths, beside PyTorch
// (bench/pytorch_attention.py times torch's cuDNN, flash and math backends on the same shapes).
//
//   bench_attention [--quick]
//   bench_attention --bert [--quick]
//
// Shapes (batch x heads x tokens x head dim): BERT-base's 128 x 12 x 128 x 64 and 64 x 12 x 512 x 64, bf16,
// no mask, no dropout. q, k, v require grad; one step is out = sdpa(q, k, v), out.backward(dout). Median of 50
// steps after 10 warm-up steps, timed with CUDA events.
//
// --bert: the attention of bench_train's BERT cases, as BertSelfAttention runs it in training, at BERT-base's
// 128 x 12 x 128 x 64 and BERT-large's 64 x 16 x 128 x 64, in four steps from the plain problem to BERT's:
//   bhsd     q, k, v contiguous (batch, heads, tokens, head dim), no mask, no dropout;
//   packed   q, k, v views of one (batch, tokens, 3 x heads x head dim) projection output, as BERT's stacked
//            projection makes them;
//   +mask    and the key-padding mask of bench_train (Bool (batch, 1, 1, tokens): the last 16 tokens of every other
//            sequence masked);
//   +dropout and dropout 0.1 on the probabilities (BERT's attention_probs_dropout_prob).
// Each is captured as a CUDA graph (forward alone, and forward + backward) and timed over replays, so the figures are
// GPU time without host launches: median of 50 replays after 10. The forward's bandwidth counts q, k, v and the output
// once each. bench/pytorch_attention.py --bert times PyTorch's backends on the same variants.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_timing.h"  // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"

using namespace kiln;

namespace {

void run(int64_t b, int64_t h, int64_t l, int64_t e, bool quick) {
  const TensorOptions o{.dtype = DType::BFloat16, .device = Device::cuda(0)};
  Tensor q = randn({b, h, l, e}, o).requires_grad_();
  Tensor k = randn({b, h, l, e}, o).requires_grad_();
  Tensor v = randn({b, h, l, e}, o).requires_grad_();
  Tensor dout = randn({b, h, l, e}, o);
  const int warmup = quick ? 1 : 10, steps = quick ? 3 : 50;
  auto step = [&] {
    q.mutable_grad() = Tensor();
    k.mutable_grad() = Tensor();
    v.mutable_grad() = Tensor();
    nn::scaled_dot_product_attention(q, k, v).backward(dout);
  };
  std::string why;
  const bool fused = nn::attention_backend(q, k, v, {}, &why) != nn::AttentionBackend::Math;
  const double t = bench::median_step_ms(warmup, steps, step);
  std::printf("kiln  sdpa bf16 fwd+bwd %3lld x %lld x %4lld x %lld  %-10s %8.3f ms%s%s\n", static_cast<long long>(b),
              static_cast<long long>(h), static_cast<long long>(l), static_cast<long long>(e), fused ? "cudnn" : "math",
              t, fused ? "" : "  (", fused ? "" : (why + ")").c_str());
}

struct Variant {
  const char* name;
  bool packed, mask;
  double dropout;
};

// The median GPU time of one replay of `step` captured as a CUDA graph.
double graphed_ms(const std::function<void()>& step, bool quick) {
  cuda::Graph graph;
  graph.capture(step, /*warmup=*/2);
  return bench::median_step_ms(quick ? 1 : 10, quick ? 3 : 50, [&] { graph.replay(); });
}

void run_bert(const char* model, int64_t n, int64_t heads, int64_t l, int64_t d, bool quick) {
  const TensorOptions o{.dtype = DType::BFloat16, .device = Device::cuda(0)};
  const int64_t hidden = heads * d;
  Tensor packed = randn({n, l, 3 * hidden}, o).requires_grad_();
  std::vector<Tensor> plain;
  for (int i = 0; i < 3; ++i) plain.push_back(randn({n, heads, l, d}, o).requires_grad_());
  const Tensor dout = randn({n, heads, l, d}, o);
  // bench_train's BERT mask: the last 16 tokens of every other sequence are padding.
  Tensor allowed = ones({n, 1, 1, l}, {.dtype = DType::Bool, .device = o.device});
  for (int64_t i = 1; i < n; i += 2) allowed[i].narrow(-1, l - 16, 16).fill_(false);
  const Variant variants[] = {{"bhsd", false, false, 0.0},
                              {"packed", true, false, 0.0},
                              {"+mask", true, true, 0.0},
                              {"+dropout", true, true, 0.1}};
  for (const Variant& var : variants) {
    auto forward = [&] {
      Tensor q = plain[0], k = plain[1], v = plain[2];
      if (var.packed) {
        // (N, L, 3 H D) -> three (N, L, H D) views -> (N, H, L, D), as BertSelfAttention::forward.
        const std::vector<Tensor> parts = split(packed, hidden, -1);
        auto heads_of = [&](const Tensor& x) { return permute(reshape(x, {n, l, heads, d}), {0, 2, 1, 3}); };
        q = heads_of(parts[0]);
        k = heads_of(parts[1]);
        v = heads_of(parts[2]);
      }
      return nn::scaled_dot_product_attention(q, k, v,
                                              {.attn_mask = var.mask ? allowed : Tensor(), .dropout_p = var.dropout});
    };
    auto clear = [&] {
      packed.mutable_grad() = Tensor();
      for (Tensor& t : plain) t.mutable_grad() = Tensor();
    };
    std::string why;
    Tensor probe_q =
        var.packed ? permute(reshape(split(packed, hidden, -1)[0], {n, l, heads, d}), {0, 2, 1, 3}) : plain[0];
    const bool fused = nn::attention_backend(probe_q, probe_q, probe_q,
                                             {.attn_mask = var.mask ? allowed : Tensor(), .dropout_p = var.dropout},
                                             &why) != nn::AttentionBackend::Math;
    const double fwd = graphed_ms([&] { forward(); }, quick);
    const double both = graphed_ms(
        [&] {
          clear();
          forward().backward(dout);
        },
        quick);
    const double bytes = 4.0 * static_cast<double>(n * heads * l * d) * 2.0;
    std::printf(
        "kiln  %-5s %3lld x %2lld x %lld x %lld  %-8s %-6s fwd %7.4f ms (%5.2f TB/s)  fwd+bwd %7.4f ms  bwd %7.4f "
        "ms%s%s\n",
        model, static_cast<long long>(n), static_cast<long long>(heads), static_cast<long long>(l),
        static_cast<long long>(d), var.name, fused ? "cudnn" : "math", fwd, bytes / (fwd * 1e9), both, both - fwd,
        fused ? "" : "  (", fused ? "" : (why + ")").c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, bert = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--bert") == 0) {
      bert = true;
    } else {
      std::fprintf(stderr, "bench_attention: unknown argument %s; usage: bench_attention [--bert] [--quick]\n",
                   argv[i]);
      return 2;
    }
  }
  if (!cuda::is_available()) {
    std::printf("bench_attention: no GPU visible; nothing to measure\n");
    return 0;
  }
  if (bert) {
    run_bert("base", quick ? 8 : 128, 12, 128, 64, quick);
    run_bert("large", quick ? 4 : 64, 16, 128, 64, quick);
    return 0;
  }
  run(quick ? 8 : 128, 12, 128, 64, quick);
  run(quick ? 4 : 64, 12, 512, 64, quick);
  return 0;
}
