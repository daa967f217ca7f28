// autograd::queue_callback: callbacks queued during backward run once, after every node and hook, at the end of
// the outermost backward (not of a checkpoint's nested one).
#include <gtest/gtest.h>

#include "kiln/kiln.h"
#include "support/test_support.h"

using namespace kiln;

namespace {

TEST(QueueCallback, RunsAfterEveryHookOfTheOutermostBackward) {
  Tensor a = internal::ones({3}).requires_grad_();
  Tensor b = internal::ones({3}).requires_grad_();
  std::vector<std::string> log;
  for (auto [t, name] : {std::pair{a, "a"}, std::pair{b, "b"}}) {
    t.register_post_accumulate_grad_hook([&log, name = std::string(name)](const Tensor&) {
      log.push_back(name);
      EXPECT_TRUE(autograd::in_backward());
      autograd::queue_callback([&log, name] {
        log.push_back("end after " + name);
        if (name == "b") autograd::queue_callback([&log] { log.push_back("queued by a callback"); });
      });
    });
  }
  // a is used inside a checkpointed segment: its gradient arrives in a nested backward.
  Tensor y = autograd::checkpoint([&](const Tensor& x) { return x * a; }, b);
  y.sum().backward();
  ASSERT_EQ(log.size(), 5u);
  // Both hooks first (in the engine's order), then the callbacks in the order queued.
  EXPECT_TRUE((log[0] == "a" && log[1] == "b") || (log[0] == "b" && log[1] == "a"));
  EXPECT_EQ(log[2], "end after " + log[0]);
  EXPECT_EQ(log[3], "end after " + log[1]);
  EXPECT_EQ(log[4], "queued by a callback");
  EXPECT_FALSE(autograd::in_backward());
  // The next backward starts with no callback left over.
  log.clear();
  (a * b).sum().backward();
  EXPECT_EQ(log.size(), 5u);  // the same five: nothing left over from the first
}

TEST(QueueCallback, OutsideBackwardIsAnError) {
  kiln::testing::expect_error([] { autograd::queue_callback([] {}); }, {"queue_callback", "no backward"});
}

TEST(QueueCallback, AnErrorInACallbackLeavesBackwardAndDropsTheRest) {
  Tensor a = internal::ones({2}).requires_grad_();
  int ran = 0;
  a.register_post_accumulate_grad_hook([&](const Tensor&) {
    autograd::queue_callback([] { throw Error("callback failed"); });
    autograd::queue_callback([&] { ++ran; });
  });
  kiln::testing::expect_error([&] { (a * 2.0).sum().backward(); }, {"callback failed"});
  EXPECT_EQ(ran, 0);
  EXPECT_FALSE(autograd::in_backward());
  a.mutable_grad() = Tensor();
  kiln::testing::expect_error([&] { (a * 2.0).sum().backward(); }, {"callback failed"});
}

}  // namespace
