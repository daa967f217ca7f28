// nn::Module's smallest contract: a module without a one-tensor forward says so.
#include <gtest/gtest.h>

#include "kiln/layers/module.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

TEST(ModuleBasics, ForwardOfAModuleWithOtherInputsIsAClearError) {
  nn::Module m("PairScorer");
  expect_error([&] { m.forward(zeros({2})); }, {"PairScorer", "forward"});
}

}  // namespace
}  // namespace kiln::testing
