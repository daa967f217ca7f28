// CheckpointManager in a real 2-process job (mpirun -np 2) with DataParallel: rank 0 writes the model and the
// optimizer, each rank its own generator and loader position; a fresh model and optimizer resumed from the
// checkpoint continue bit for bit like the run that never stopped (CPU), and each rank gets its own state back.
#include <gtest/gtest.h>

#include <filesystem>

#include "distributed/mpi_test_util.h"
#include "kiln/kiln.h"
#include "support/temp_folder.h"
#include "support/test_support.h"

using namespace kiln;

namespace {

// One folder that every rank sees: rank 0 makes it and broadcasts its name.
std::string shared_folder(const std::string& made_by_rank0) {
  std::vector<uint8_t> bytes(512, 0);
  if (dist::rank() == 0) std::copy(made_by_rank0.begin(), made_by_rank0.end(), bytes.begin());
  Tensor t = internal::from_vector(bytes, {512});
  dist::broadcast(t, 0);
  const auto back = t.to_vector<uint8_t>();
  return std::string(back.begin(), std::find(back.begin(), back.end(), uint8_t{0}));
}

struct TrainingRun {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<dist::DataParallel> ddp;
  std::unique_ptr<optim::AdamW> opt;
  data::LoaderPosition pos;

  TrainingRun() {
    manual_seed(1);
    model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(6, 12), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(12, 3)});
    ddp = std::make_unique<dist::DataParallel>(model);
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-2});
  }
  io::CheckpointParts parts() {
    return {.model = model.get(), .optimizer = opt.get(), .generators = true, .loader = &pos};
  }
  // A step whose data comes from the default CPU generator, which differs per rank after seeding by rank.
  double step() {
    Tensor x = internal::randn({4, 6});
    Tensor y = internal::randn({4, 3});
    opt->zero_grad();
    Tensor loss = nn::mse_loss((*ddp)(x), y);
    loss.backward();
    opt->step();
    ++pos.batch;
    return loss.item<double>();
  }
};

TEST(MpiCheckpoint, TwoRanksSaveAndResumeExactly) {
  if (dist::init().world_size != 2) GTEST_SKIP() << "run under mpirun -np 2";
  kiln::testing::TempFolder tmp;
  const std::string folder = shared_folder(tmp.path().string());
  io::CheckpointManager ckpt(folder, {.keep_last = 2});
  EXPECT_EQ(ckpt.world_size(), 2);

  std::vector<double> straight, resumed;
  std::vector<std::vector<double>> params_straight;
  {
    TrainingRun run;
    manual_seed(100 + dist::rank());  // each rank draws its own data
    for (int i = 0; i < 3; ++i) run.step();
    ckpt.save(3, run.parts());
    for (int i = 0; i < 3; ++i) straight.push_back(run.step());
    for (const Tensor& p : run.model->parameters()) params_straight.push_back(kiln::testing::values(p));
  }
  dist::barrier();
  EXPECT_TRUE(std::filesystem::exists(ckpt.path_for(3)));
  EXPECT_TRUE(std::filesystem::exists(ckpt.rank_path_for(3, dist::rank())));

  TrainingRun fresh;
  manual_seed(999);  // whatever: the checkpoint's generator state replaces it
  ASSERT_EQ(ckpt.resume(fresh.parts()), std::optional<int64_t>(3));
  EXPECT_EQ(fresh.pos.batch, 3);
  for (int i = 0; i < 3; ++i) resumed.push_back(fresh.step());
  EXPECT_EQ(resumed, straight) << "rank " << dist::rank();
  const auto ps = fresh.model->parameters();
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(kiln::testing::values(ps[i]), params_straight[i]);
  // The ranks drew different data (their own generator states came back): their losses differ.
  Tensor mine = internal::from_vector(straight, {3}, Device::cpu());
  Tensor other = kiln::testing::the_other_ranks(mine);
  EXPECT_NE(kiln::testing::values(mine), kiln::testing::values(other));
  dist::barrier();  // rank 0's TempFolder goes only after every rank is done with it
}

}  // namespace
