// Exact resume on the CPU: N steps, a checkpoint, and M steps in a new process (resume_child) give the same
// losses and parameters, bit for bit, as N + M steps straight — the generators (dropout) and the loader's
// position (mid-epoch, shuffled) included. Without the generators the continuation differs, which shows that
// the comparison can fail. CudaIoResume does the same on cuda:0 in deterministic mode, with a conv net (batch
// norm, dropout on the GPU generator) and an embedding (a scatter-add backward).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "io/checkpoint_test_util.h"
#include "io/resume_training.h"
#include "kiln/tensor/cuda.h"
#include "support/temp_folder.h"

namespace kiln::testing {
namespace {

constexpr int kFirst = 10;  // epoch 1, batch 3 of 7: a mid-epoch save
constexpr int kThen = 9;

std::string run_child(const std::string& ckpt, const std::string& out, const std::string& extra = "") {
  const std::string cmd =
      std::string("'") + KILN_RESUME_CHILD + "' '" + ckpt + "' " + std::to_string(kThen) + " '" + out + "' " + extra;
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  return read_file_bytes(out);
}

TEST(IoResume, NewProcessContinuesBitForBit) {
  TempFolder dir;
  std::vector<float> straight_losses;
  ResumeRun straight(42);
  straight.train(kFirst + kThen, straight_losses);
  const std::vector<float> tail(straight_losses.begin() + kFirst, straight_losses.end());
  const std::string expected = straight.fingerprint(tail);

  ResumeRun first(42);
  std::vector<float> first_losses;
  first.train(kFirst, first_losses);
  ASSERT_EQ(first.pos, (data::LoaderPosition{1, 3}));
  for (int i = 0; i < kFirst; ++i) ASSERT_EQ(first_losses[i], straight_losses[i]) << i;
  const std::string ckpt = dir.file("run.h5");
  io::save_checkpoint(ckpt, first.parts());

  EXPECT_TRUE(run_child(ckpt, dir.file("out.bin"), "") == expected)
      << "the resumed process diverged from the straight run";
  // Dropout masks come from the CPU generator: without restoring it, the continuation differs.
  EXPECT_FALSE(run_child(ckpt, dir.file("out_nogen.bin"), "no-generators") == expected);
}

TEST(CudaIoResume, NewProcessContinuesBitForBitOnTheGpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  const bool was_deterministic = deterministic();
  TempFolder dir;
  std::vector<float> straight_losses;
  CudaResumeRun straight(42);  // turns deterministic mode on
  straight.train(kFirst + kThen, straight_losses);
  const std::vector<float> tail(straight_losses.begin() + kFirst, straight_losses.end());
  const std::string expected = straight.fingerprint(tail);

  // The same run again in this process: deterministic mode makes it repeat exactly.
  CudaResumeRun again(42);
  std::vector<float> again_losses;
  again.train(kFirst + kThen, again_losses);
  EXPECT_EQ(again_losses, straight_losses);

  CudaResumeRun first(42);
  std::vector<float> first_losses;
  first.train(kFirst, first_losses);
  ASSERT_EQ(first.pos, (data::LoaderPosition{1, 3}));
  for (int i = 0; i < kFirst; ++i) ASSERT_EQ(first_losses[i], straight_losses[i]) << i;
  const std::string ckpt = dir.file("run.h5");
  io::save_checkpoint(ckpt, first.parts());
  set_deterministic(was_deterministic);

  EXPECT_TRUE(run_child(ckpt, dir.file("out.bin"), "cuda") == expected)
      << "the resumed GPU process diverged from the straight run";
  // Dropout masks come from the GPU generator: without restoring it, the continuation differs.
  EXPECT_FALSE(run_child(ckpt, dir.file("out_nogen.bin"), "no-generators cuda") == expected);
}

}  // namespace
}  // namespace kiln::testing
