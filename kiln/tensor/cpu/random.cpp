// CPU kernels: random numbers with the element numbering of generator.h, so CUDA can reproduce them; and the
// fused dropout, whose keep/drop decisions are those of a Bernoulli draw.
#include <array>
#include <cmath>  // std::log, std::sqrt, std::cos, std::sin: Box-Muller

#include "kiln/tensor/cpu/cpu_backend.h"
#include "kiln/tensor/cpu/parallel.h"
#include "kiln/tensor/cpu/strided_loop.h"  // StridedWalker
#include "kiln/tensor/dispatch.h"

namespace kiln::cpu {

namespace {

// Element i's value of one draw, as philox::uniform_float / uniform_double / normal_value / bits64 compute it, for
// increasing i: a Philox block serves 4 (float numbering) or 2 (float64) elements and a Box-Muller radius 2, so each is
// computed once for its elements instead of once per element (the same expressions, so the same bits).
class DrawWalker {
 public:
  DrawWalker(GeneratorState draw, bool float64) : draw_(draw), per_block_(float64 ? 2 : 4), float64_(float64) {}

  float uniform_float(uint64_t i) { return philox::to_unit_float(words(i)[i % 4]); }
  double uniform_double(uint64_t i) {
    const uint32_t* w = words(i);
    return philox::to_unit_double(w[2 * (i % 2)], w[2 * (i % 2) + 1]);
  }
  uint64_t bits64(uint64_t i) {
    const uint32_t* w = words(i);
    return static_cast<uint64_t>(w[2 * (i % 2)]) << 32 | w[2 * (i % 2) + 1];
  }
  double normal(uint64_t i) {
    if (i / 2 != pair_) {
      pair_ = i / 2;
      const uint32_t* w = words(i);
      double u1, u2;
      if (float64_) {
        u1 = philox::to_unit_double(w[0], w[1]);
        u2 = philox::to_unit_double(w[2], w[3]);
      } else {
        const int p = static_cast<int>((i % 4) / 2);
        u1 = philox::to_unit_float(w[2 * p]);
        u2 = philox::to_unit_float(w[2 * p + 1]);
      }
      r_ = std::sqrt(-2.0 * std::log(1.0 - u1));
      theta_ = 6.283185307179586 * u2;
    }
    // cos for the even element, sin for the odd one, each called alone: sincos (which a compiler may form from the
    // two) does not always give sin's last bit.
    return i % 2 == 0 ? r_ * std::cos(theta_) : r_ * std::sin(theta_);
  }

 private:
  const uint32_t* words(uint64_t i) {
    if (i / per_block_ != block_) {
      block_ = i / per_block_;
      philox::block(draw_.seed, block_, draw_.offset, w_);
    }
    return w_;
  }

  GeneratorState draw_;
  uint64_t per_block_;
  bool float64_;
  uint64_t block_ = ~uint64_t{0}, pair_ = ~uint64_t{0};
  uint32_t w_[4] = {};
  double r_ = 0, theta_ = 0;
};

}  // namespace

void CpuBackend::random(const Tensor& out, const RandomParams& params, GeneratorState draw) {
  const Shape& sizes = out.shape();
  const Strides& strides = out.strides();
  const int64_t n = out.numel();
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* base = out.data_ptr<T>();
    constexpr bool kDouble = std::is_same_v<T, double>;
    auto value = [&](DrawWalker& d, uint64_t i) -> T {
      switch (params.kind) {
        case RandomKind::Uniform: {
          if constexpr (kDouble) {
            return params.a + (params.b - params.a) * d.uniform_double(i);
          } else {
            const float u = d.uniform_float(i);
            return static_cast<T>(static_cast<float>(params.a) + static_cast<float>(params.b - params.a) * u);
          }
        }
        case RandomKind::Normal: return static_cast<T>(params.a + params.b * d.normal(i));
        case RandomKind::Randint: {
          const uint64_t range = static_cast<uint64_t>(params.high - params.low);
          return static_cast<T>(params.low + static_cast<int64_t>(d.bits64(i) % range));
        }
        case RandomKind::Bernoulli: {
          const double u = kDouble ? d.uniform_double(i) : d.uniform_float(i);
          return static_cast<T>(u < params.a ? 1 : 0);
        }
      }
      return T{};
    };
    // Randint numbers its elements 2 per block whatever the dtype (bits64); the others by the output's dtype.
    const bool two_per_block = kDouble || params.kind == RandomKind::Randint;
    parallel_for(0, n, kGrainSize / 8, [&](int64_t begin, int64_t end) {
      DrawWalker d(draw, two_per_block);
      StridedWalker<1> walker(sizes, {strides});  // row-major logical order, whatever the layout
      walker.seek(begin);
      for (int64_t i = begin; i < end; ++i, walker.next()) base[walker.offset(0)] = value(d, static_cast<uint64_t>(i));
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
