// checkpoint_sequential: the same outputs and gradients as running the Sequential plainly, bit for bit,
// with dropout inside (the recomputation replays the random numbers).
#include <gtest/gtest.h>

#include "support/test_support.h"

namespace kiln::testing {
namespace {

class CheckpointSequentialTest : public BackendTest {
 protected:
  std::shared_ptr<nn::Sequential> make_model() {
    manual_seed(11);  // the same initial weights for every model made here
    auto m = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(8, 8), std::make_shared<nn::Tanh>(), std::make_shared<nn::Dropout>(0.2),
        std::make_shared<nn::Linear>(8, 8), std::make_shared<nn::GELU>(), std::make_shared<nn::Dropout>(0.2),
        std::make_shared<nn::Linear>(8, 4)});
    m->to(dev());
    return m;
  }
};

TEST_P(CheckpointSequentialTest, MatchesThePlainForwardAndBackwardBitForBit) {
  Tensor x0 = make(uniform(24, -1, 1, 5), {3, 8}, opts());
  for (int64_t segments : {1, 2, 3, 7}) {
    SCOPED_TRACE("segments " + std::to_string(segments));
    auto plain = make_model();
    auto ckpt = make_model();
    manual_seed(99);
    Tensor x = x0.clone().requires_grad_();
    Tensor y = (*plain)(x);
    y.square().sum().backward();

    manual_seed(99);
    Tensor xc = x0.clone().requires_grad_();
    Tensor yc = nn::checkpoint_sequential(*ckpt, segments, xc);
    if (segments > 1) {
      ASSERT_NE(yc.grad_fn(), nullptr);
    }
    EXPECT_TRUE(equal(y.detach(), yc.detach()));
    yc.square().sum().backward();
    EXPECT_TRUE(equal(x.grad(), xc.grad()));
    const auto p = plain->named_parameters(), c = ckpt->named_parameters();
    ASSERT_EQ(p.size(), c.size());
    for (size_t i = 0; i < p.size(); ++i) {
      ASSERT_TRUE(c[i].second.grad().defined()) << c[i].first;
      EXPECT_TRUE(equal(p[i].second.grad(), c[i].second.grad())) << p[i].first;
    }
  }
}

TEST_P(CheckpointSequentialTest, SegmentCountMustFitTheModules) {
  auto m = make_model();
  Tensor x = zeros({1, 8}, opts());
  expect_error([&] { nn::checkpoint_sequential(*m, 0, x); }, {"checkpoint_sequential", "segments", "[1, 7]", "got 0"});
  expect_error([&] { nn::checkpoint_sequential(*m, 8, x); }, {"checkpoint_sequential", "got 8"});
}

KILN_INSTANTIATE_BACKENDS(CheckpointSequentialTest);

}  // namespace
}  // namespace kiln::testing
