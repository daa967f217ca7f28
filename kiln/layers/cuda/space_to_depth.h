// kiln/layers/cuda/space_to_depth.h — an image batch's 2 x 2 blocks as channels, in one pass (internal; the
// space-to-depth form of a strided first layer, nn::detail::space_to_depth_input, calls it for CUDA tensors).
//
//   if (cuda_impl::space_to_depth_fits(x, 16)) {
//     Tensor blocks = cuda_impl::space_to_depth(x, {3, 3}, 16);   // (N, 3, 224, 224) -> (N, 16, 115, 115)
//   }
//
// x (N, C, H, W) channels-last, zero-padded by `padding` on each side and by one more row or column where that
// leaves an odd size, becomes (N, channels, ceil(Hp / 2), ceil(Wp / 2)) channels-last: block (i, j)'s element
// (a, b, c) at channel (2 a + b) C + c, the channels from 4 C on zero. A bit copy: the values are x's exactly. One
// thread writes one block's channels (with 16-byte stores where they fill whole vectors) and reads its 4 pixels.
#pragma once

#include <array>
#include <cstdint>

#include "kiln/tensor/tensor.h"

namespace kiln::nn::cuda_impl {

// The most channels a block may have.
inline constexpr int64_t kSpaceToDepthMaxChannels = 16;

// Whether the kernel takes x: a 4-d CUDA tensor, dense channels-last, of a 2-, 4- or 8-byte dtype, with
// 4 C <= channels <= kSpaceToDepthMaxChannels.
bool space_to_depth_fits(const Tensor& x, int64_t channels);

// The blocks as above; x must fit (space_to_depth_fits) and padding be >= 0.
Tensor space_to_depth(const Tensor& x, std::array<int64_t, 2> padding, int64_t channels);

}  // namespace kiln::nn::cuda_impl
