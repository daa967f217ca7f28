// CPU kernels: random numbers with the element numbering of generator.h, so CUDA can reproduce them.
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

}  // namespace kiln::cpu
