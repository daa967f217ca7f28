// CPU kernels: random numbers with the element numbering of generator.h, so CUDA can reproduce them; and the
// fused dropout, whose keep/drop decisions are those of a Bernoulli draw.
#include <array>

#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/parallel.h"
#include "kiln/tensor/cpu/strided_loop.h"  // StridedWalker
#include "kiln/tensor/dispatch.h"

namespace kiln::cpu {

void CpuBackend::random(const Tensor& out, const RandomParams& params, GeneratorState draw) {
  const Shape& sizes = out.shape();
  const Strides& strides = out.strides();
  const int64_t n = out.numel();
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* base = out.data_ptr<T>();
    constexpr bool kDouble = std::is_same_v<T, double>;
    auto value = [&](uint64_t i) -> T {
      switch (params.kind) {
        case RandomKind::Uniform: {
          if constexpr (kDouble) {
            return params.a + (params.b - params.a) * philox::uniform_double(draw.seed, draw.offset, i);
          } else {
            const float u = philox::uniform_float(draw.seed, draw.offset, i);
            return static_cast<T>(static_cast<float>(params.a) + static_cast<float>(params.b - params.a) * u);
          }
        }
        case RandomKind::Normal:
          return static_cast<T>(params.a + params.b * philox::normal_value(draw.seed, draw.offset, i, kDouble));
        case RandomKind::Randint: {
          const uint64_t range = static_cast<uint64_t>(params.high - params.low);
          return static_cast<T>(params.low + static_cast<int64_t>(philox::bits64(draw.seed, draw.offset, i) % range));
        }
        case RandomKind::Bernoulli: {
          const double u = kDouble ? philox::uniform_double(draw.seed, draw.offset, i)
                                   : philox::uniform_float(draw.seed, draw.offset, i);
          return static_cast<T>(u < params.a ? 1 : 0);
        }
      }
      return T{};
    };
    parallel_for(0, n, kGrainSize / 8, [&](int64_t begin, int64_t end) {
      StridedWalker<1> walker(sizes, {strides});  // row-major logical order, whatever the layout
      walker.seek(begin);
      for (int64_t i = begin; i < end; ++i, walker.next()) base[walker.offset(0)] = value(static_cast<uint64_t>(i));
    });
  });
}

void CpuBackend::dropout(const Tensor& out, const Tensor& mask, const Tensor& x, double p, GeneratorState draw) {
  const philox::KeepThreshold keep = philox::keep_threshold(1.0 - p);  // bernoulli(1 - p)'s decisions
  const Shape& sizes = x.shape();
  const std::array<Strides, 3> strides = {out.strides(), mask.strides(), x.strides()};
  const int64_t n = x.numel();
  visit_floating_dtype(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    constexpr bool kDouble = std::is_same_v<T, double>;
    const T scale = Scalar(1.0 / (1.0 - p)).to<T>();  // the mask value of a kept element, as fill stores it
    const C scale_c = static_cast<C>(scale);
    T* o = out.data_ptr<T>();
    T* m = mask.data_ptr<T>();
    const T* in = x.data_ptr<T>();
    parallel_for(0, n, kGrainSize / 8, [&](int64_t begin, int64_t end) {
      StridedWalker<3> walker(sizes, strides);  // row-major logical order, whatever the layouts
      walker.seek(begin);
      // One Philox block serves 4 elements (float numbering) or 2 (float64): computed once per block.
      constexpr uint64_t kPerBlock = kDouble ? 2 : 4;
      uint32_t w[4];
      uint64_t block = ~uint64_t{0};
      for (int64_t i = begin; i < end; ++i, walker.next()) {
        const auto u = static_cast<uint64_t>(i);
        if (u / kPerBlock != block) {
          block = u / kPerBlock;
          philox::block(draw.seed, block, draw.offset, w);
        }
        bool kept;
        if constexpr (kDouble) {
          kept = philox::keep_double(w[2 * (u % 2)], w[2 * (u % 2) + 1], keep.below53);
        } else {
          kept = philox::keep_float(w[u % 4], keep.below24);
        }
        const C mc = kept ? scale_c : C(0);
        m[walker.offset(1)] = kept ? scale : static_cast<T>(0.0f);
        // x * 0 where dropped, not 0: NaN and inf give NaN and -x gives -0, as x * mask does.
        o[walker.offset(0)] = static_cast<T>(static_cast<C>(in[walker.offset(2)]) * mc);
      }
    });
  });
}

}  // namespace kiln::cpu
