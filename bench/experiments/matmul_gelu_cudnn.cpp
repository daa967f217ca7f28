// Experiment: a transformer MLP's first product with its GELU (erf form, as BERT's) fused into the product, through
// cuDNN's graph API, against kiln's path (cuBLASLt's product with the bias epilogue, then the GELU kernel), in bf16 on
// a GPU. cuBLASLt's own GELU epilogues compute the tanh form, so BERT cannot use them; cuDNN's runtime fusion has the
// erf form (GELU_FWD / GELU_BWD). Shapes: BERT-base (16384 tokens, 768 -> 3072 -> 768) and BERT-large (8192 tokens,
// 1024 -> 4096 -> 1024). For each:
//   forward:  kiln linear (bias epilogue) alone, kiln gelu alone, both; cuDNN matmul alone; cuDNN matmul + bias + GELU
//             writing y only, and writing y and the pre-activation (what backward needs);
//   backward: kiln's product dY W2 alone, and with gelu_backward_with_column_sums (today's path: the GELU's gradient
//             and fc1's bias gradient in one pass); kiln's column sums of dh alone (what a fused product without
//             them would add); cuDNN matmul + GELU_BWD(., pre), and the same with the column sums
//             as a reduction node of the graph.
// Each time is the median of 20 steps after 5 (bench::median_step_ms); each fused result is compared with kiln's
// (largest absolute difference, and kiln's largest magnitude). A graph cuDNN cannot build prints its failed step.
//
//   g++ -std=c++20 -O2 -I . -I build/include -I bench -I third_party/cudnn_frontend/include -I /usr/local/cuda/include
//       bench/experiments/matmul_gelu_cudnn.cpp -L build/kiln -lkiln -L /usr/local/cuda/lib64 -lcudart -lcudnn -lnvrtc
//       -Wl,-rpath,'$ORIGIN' -o matmul_gelu_cudnn
//
// Not part of the build: a measurement, run where the choice of fusing the GELU into the product is to be made.
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cstdio>

#include "experiments/cudnn_graph_bench.h"  // handle, new_graph, finish, plan_name, max_diff
#include "gpu_timing.h"                     // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/internal_ops.h"  // internal::gelu_backward

using namespace kiln;

namespace {

using namespace bench::cudnn_graph;
enum Uid : int64_t { kA = 1, kB, kBias, kPre, kOut, kSums };

void run_shape(const char* name, int64_t M, int64_t D, int64_t H) {
  const Device dev = Device::cuda(0);
  const TensorOptions bf{.dtype = DType::BFloat16, .device = dev};
  manual_seed(1);
  const Tensor x = randn({M, D}, bf);
  const Tensor w1 = mul(randn({H, D}, bf), 0.03);  // fc1 (H, D)
  const Tensor b1 = mul(randn({H}, bf), 0.1);
  const Tensor w2 = mul(randn({D, H}, bf), 0.03);  // fc2 (D, H)
  const Tensor dy = randn({M, D}, bf);             // fc2's output gradient
  std::printf("%s: %lld tokens, %lld -> %lld\n", name, static_cast<long long>(M), static_cast<long long>(D),
              static_cast<long long>(H));

  // ---- forward
  NoGradGuard no_grad;
  Tensor pre = nn::linear(x, w1, b1), y = gelu(pre);
  const double t_lin = bench::median_step_ms(5, 20, [&] { pre = nn::linear(x, w1, b1); });
  const double t_gelu = bench::median_step_ms(5, 20, [&] { y = gelu(pre); });
  const double t_both = bench::median_step_ms(5, 20, [&] { y = gelu(nn::linear(x, w1, b1)); });
  pre = nn::linear(x, w1, b1);
  y = gelu(pre);
  std::printf("  kiln fwd: linear %.4f  gelu %.4f  both %.4f ms\n", t_lin, t_gelu, t_both);

  Tensor out = empty({M, H}, bf), pre2 = empty({M, H}, bf);
  for (int variant = 0; variant < 3; ++variant) {  // 0: matmul alone, 1: + bias + GELU (y), 2: also pre
    auto g = new_graph();
    Attr A = tensor(*g, "x", kA, {1, M, D}, {M * D, D, 1});
    Attr B = tensor(*g, "w1t", kB, {1, D, H}, {H * D, 1, D});
    Attr P = g->matmul(A, B, fe::graph::Matmul_attributes().set_name("mm"));
    Pack pack{{kA, x.data_ptr()}, {kB, w1.data_ptr()}, {kOut, out.data_ptr()}};
    Attr Y = P;
    if (variant > 0) {
      P->set_data_type(fe::DataType_t::FLOAT);
      Attr Bias = tensor(*g, "b1", kBias, {1, 1, H}, {H, H, 1});
      pack[kBias] = b1.data_ptr();
      Attr Pre =
          g->pointwise(P, Bias, fe::graph::Pointwise_attributes().set_name("bias").set_mode(fe::PointwiseMode_t::ADD));
      Y = g->pointwise(Pre, fe::graph::Pointwise_attributes().set_name("gelu").set_mode(fe::PointwiseMode_t::GELU_FWD));
      if (variant == 2) {
        Pre->set_output(true)
            .set_uid(kPre)
            .set_dim({1, M, H})
            .set_stride({M * H, H, 1})
            .set_data_type(fe::DataType_t::BFLOAT16);
        pack[kPre] = pre2.data_ptr();
      } else {
        Pre->set_data_type(fe::DataType_t::FLOAT);
      }
    }
    Y->set_output(true)
        .set_uid(kOut)
        .set_dim({1, M, H})
        .set_stride({M * H, H, 1})
        .set_data_type(fe::DataType_t::BFLOAT16);
    const char* what = variant == 0   ? "cudnn matmul"
                       : variant == 1 ? "cudnn matmul+bias+gelu (y)"
                                      : "cudnn matmul+bias+gelu (y, pre)";
    Built b = finish(g, pack, dev);
    if (!b.graph) {
      std::printf("  %s: no plan (%s)\n", what, b.why_not.c_str());
      continue;
    }
    const double t = bench::median_step_ms(5, 20, [&] { execute(b, pack); });
    cuda::synchronize();
    const Tensor ref = variant == 0 ? matmul(x, w1.t()) : y;
    std::printf("  %s: %.4f ms  (plan %s of %lld, built and timed in %.1f s)  max |diff| %.4g of max %.4g", what, t,
                plan_name(*b.graph).c_str(), static_cast<long long>(b.plans), b.build_s, max_diff(out, ref),
                max_abs(ref));
    if (variant == 2) std::printf("  pre: max |diff| %.4g", max_diff(pre2, pre));
    std::printf("\n");
  }

  // ---- backward: dh = (dy w2) * gelu'(pre), fc1's bias gradient = column sums of dh
  Tensor gh = matmul(dy, w2);
  const double t_mm = bench::median_step_ms(5, 20, [&] { gh = matmul(dy, w2); });
  std::pair<Tensor, Tensor> ref;
  const double t_gb = bench::median_step_ms(5, 20, [&] { ref = nn::gelu_backward_with_column_sums(gh, pre); });
  const double t_bwd =
      bench::median_step_ms(5, 20, [&] { ref = nn::gelu_backward_with_column_sums(matmul(dy, w2), pre); });
  ref = nn::gelu_backward_with_column_sums(matmul(dy, w2), pre);
  Tensor col;
  const double t_sums =
      bench::median_step_ms(5, 20, [&] { col = internal::sum(ref.first, {0}, false, DType::Float32); });
  std::printf("  kiln bwd: dy w2 %.4f  gelu_backward_with_column_sums %.4f  both %.4f ms; column sums alone %.4f ms\n",
              t_mm, t_gb, t_bwd, t_sums);

  Tensor dh = empty({M, H}, bf);
  Tensor sums = zeros({H}, {.dtype = DType::Float32, .device = dev});
  for (int variant = 0; variant < 2; ++variant) {  // 0: matmul + GELU_BWD, 1: + column sums
    auto g = new_graph();
    Attr A = tensor(*g, "dy", kA, {1, M, D}, {M * D, D, 1});
    Attr B = tensor(*g, "w2", kB, {1, D, H}, {D * H, H, 1});
    Attr G = g->matmul(A, B, fe::graph::Matmul_attributes().set_name("mm"));
    G->set_data_type(fe::DataType_t::FLOAT);
    Attr Pre = tensor(*g, "pre", kPre, {1, M, H}, {M * H, H, 1});
    Attr DH = g->pointwise(G, Pre,
                           fe::graph::Pointwise_attributes().set_name("dgelu").set_mode(fe::PointwiseMode_t::GELU_BWD));
    DH->set_output(true)
        .set_uid(kOut)
        .set_dim({1, M, H})
        .set_stride({M * H, H, 1})
        .set_data_type(fe::DataType_t::BFLOAT16);
    Pack pack{{kA, dy.data_ptr()}, {kB, w2.data_ptr()}, {kPre, pre.data_ptr()}, {kOut, dh.data_ptr()}};
    if (variant == 1) {
      Attr S = g->reduction(DH, fe::graph::Reduction_attributes().set_name("sums").set_mode(fe::ReductionMode_t::ADD));
      S->set_output(true).set_uid(kSums).set_dim({1, 1, H}).set_stride({H, H, 1}).set_data_type(fe::DataType_t::FLOAT);
      pack[kSums] = sums.data_ptr();
    }
    const char* what = variant == 0 ? "cudnn matmul+gelu_bwd" : "cudnn matmul+gelu_bwd+column sums";
    Built b = finish(g, pack, dev);
    if (!b.graph) {
      std::printf("  %s: no plan (%s)\n", what, b.why_not.c_str());
      continue;
    }
    const double t = bench::median_step_ms(5, 20, [&] {
      if (variant == 1) sums.zero_();  // a reduction output may accumulate
      execute(b, pack);
    });
    if (variant == 1) {
      sums.zero_();
      (void)b.graph->execute(handle(), pack, b.workspace.data_ptr());
    }
    cuda::synchronize();
    std::printf("  %s: %.4f ms  (plan %s of %lld, built and timed in %.1f s)  max |diff| %.4g of max %.4g", what, t,
                plan_name(*b.graph).c_str(), static_cast<long long>(b.plans), b.build_s, max_diff(dh, ref.first),
                max_abs(ref.first));
    if (variant == 1)
      std::printf("  sums: max |diff| %.4g of max %.4g", max_diff(sums, ref.second), max_abs(ref.second));
    std::printf("\n");
  }
}

}  // namespace

int main() {
  if (!cuda::is_available()) {
    std::printf("no CUDA device\n");
    return 1;
  }
  std::printf("cuDNN %zu\n", cudnnGetVersion());
  run_shape("BERT-base", 16384, 768, 3072);
  run_shape("BERT-large", 8192, 1024, 4096);
  return 0;
}
