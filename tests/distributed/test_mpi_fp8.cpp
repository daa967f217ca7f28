// FP8 delayed scaling across 2 processes (mpirun -np 2): with amp::Fp8Recipe::amax_reduction set to
// dist::fp8_amax_reduction(), every rank's scales come from the maximum of the ranks' amaxes, so the ranks agree;
// without it each rank scales by its own. On the CPU (the MPI group; kiln's FP8 reference) and, where each rank has
// a GPU of compute capability 8.9 or newer, on it (NCCL).
#include <gtest/gtest.h>

#include <cfloat>
#include <vector>

#include "distributed/mpi_test_util.h"
#include "kiln/kiln.h"
#include "kiln/tensor/cuda.h"
#include "support/test_support.h"

using namespace kiln;

namespace {

class MpiFp8 : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (dist::world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2";
    if (dev().is_cuda() && cuda::compute_capability(dev().index()) < 89) GTEST_SKIP() << "FP8 needs sm_89+";
  }
  Device dev() const { return GetParam(); }
  int rank() const { return dist::rank(); }
  Tensor on_dev(const std::vector<double>& v, const Shape& shape) const {
    return kiln::testing::make(v, shape, {.dtype = DType::Float32, .device = dev()});
  }
};

// A Linear's state (columns: input, weight, gradient) with different amaxes recorded on each rank, one column seen
// on one rank only: after update() both ranks hold the maxima in the history's last row and the scales they give
// (448 / a for the E4M3 columns, 57344 / a for the E5M2 gradient), the same bits on both.
TEST_P(MpiFp8, UpdateReducesTheAmaxesOverTheRanks) {
  amp::Fp8Recipe recipe{.amax_history_len = 3};
  recipe.amax_reduction = dist::fp8_amax_reduction();
  amp::Fp8ScalingState state = amp::Fp8ScalingState::for_linear(recipe, dev());
  const std::vector<double> mine =
      rank() == 0 ? std::vector<double>{2.0, 7.0, 0.0} : std::vector<double>{5.0, 3.0, 4.0};
  for (int64_t j = 0; j < 3; ++j) {
    if (mine[j] != 0) state.record_amax(j, on_dev({mine[j], -mine[j] / 2}, {2}));
  }
  state.update();
  const std::vector<double> scale = kiln::testing::values(state.scale()),
                            history = kiln::testing::values(state.amax_history());
  EXPECT_EQ(scale[0], static_cast<double>(448.0f / 5.0f));
  EXPECT_EQ(scale[1], static_cast<double>(448.0f / 7.0f));
  EXPECT_EQ(scale[2], static_cast<double>(57344.0f / 4.0f));
  EXPECT_EQ((std::vector<double>{history[6], history[7], history[8]}), (std::vector<double>{5.0, 7.0, 4.0}));
  EXPECT_EQ((std::vector<double>{history[0], history[1], history[2]}), (std::vector<double>{0.0, 0.0, 0.0}));
  const Tensor other = kiln::testing::the_other_ranks(state.scale());
  EXPECT_EQ(kiln::testing::values(other), scale) << "the ranks' scales differ";
}

// Two FP8 Linear steps on different data per rank: with the reduction the scales (and so the quantised products)
// agree across the ranks; without it they differ, so the test can tell the two apart.
TEST_P(MpiFp8, LinearScalesAgreeOnlyWithTheReduction) {
  for (bool reduce : {true, false}) {
    SCOPED_TRACE(reduce ? "with the reduction" : "without it");
    amp::Fp8Recipe recipe{.amax_history_len = 4};
    if (reduce) recipe.amax_reduction = dist::fp8_amax_reduction();
    auto fc = std::make_shared<nn::Linear>(32, 16);
    fc->to(dev());
    amp::prepare_fp8(*fc, recipe, dev());
    for (int step = 0; step < 2; ++step) {
      const double range = rank() == 0 ? 1.0 : 3.0;  // rank 1's inputs are larger
      const Tensor x = kiln::testing::make(kiln::testing::uniform(8 * 32, -range, range, 40 + step), {8, 32},
                                           {.dtype = DType::Float32, .device = dev()});
      Tensor y;
      {
        amp::Autocast cast(DType::BFloat16, {.device_type = dev().type(), .fp8 = recipe});
        y = (*fc)(x);
      }
      sum(y.to(DType::Float32)).backward();
    }
    const Tensor scale = fc->fp8_state()->scale();
    const std::vector<double> mine = kiln::testing::values(scale),
                              other = kiln::testing::values(kiln::testing::the_other_ranks(scale));
    if (reduce) {
      EXPECT_EQ(mine, other);
    } else {
      EXPECT_NE(mine[0], other[0]) << "the input scales should differ without the reduction";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, MpiFp8, ::testing::ValuesIn(kiln::testing::mpi_devices()),
                         kiln::testing::device_param_name);

}  // namespace
