// io::CheckpointManager: numbered files, keep_last, latest() skipping incomplete and damaged files, resume();
// and the multi-rank file protocol, with ranks simulated by threads (rank/world_size options).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint_test_util.h"
#include "kiln/io/checkpoint_internal.h"
#include "kiln/io/checkpoint_manager.h"
#include "kiln/io/hdf5_tensors.h"
#include "support/temp_folder.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(IoCheckpointManager, KeepsTheLastAndResumesTheNewest) {
  TempFolder dir;
  io::CheckpointManager ckpt(dir.file("run"), {.keep_last = 3, .prefix = "ckpt"});
  EXPECT_FALSE(ckpt.latest().has_value());
  manual_seed(1);
  TinyNet net;
  io::Metadata meta;
  for (int64_t step : {100, 200, 300, 400, 500}) {
    meta.numbers["step"] = static_cast<double>(step);
    // Each checkpoint holds a model whose fc1.bias starts with the step, to tell them apart.
    net.fc1->parameters()[1].detach().fill_(static_cast<double>(step));
    EXPECT_EQ(ckpt.save(step, {.model = &net, .metadata = &meta}),
              dir.file("run/ckpt-00000" + std::to_string(step) + ".h5"));
  }
  EXPECT_EQ(files_in(dir / "run"),
            (std::vector<std::string>{"ckpt-00000300.h5", "ckpt-00000400.h5", "ckpt-00000500.h5"}));
  EXPECT_EQ(ckpt.latest(), dir.file("run/ckpt-00000500.h5"));

  // A newer file that never completed, and a damaged one, are skipped.
  fs::copy_file(dir / "run/ckpt-00000500.h5", dir / "run/ckpt-00000600.h5");
  io::H5File(dir.file("run/ckpt-00000600.h5"), io::H5File::Mode::ReadWrite).set_attr("/", "complete", int64_t{0});
  io::detail::seal_checkpoint(dir.file("run/ckpt-00000600.h5"));  // its file-level crc matches: complete=0 counts
  dir.write("run/ckpt-00000700.h5", std::string(3000, '\7'));
  std::string flipped = read_file_bytes(dir / "run/ckpt-00000500.h5");
  flipped[flipped.size() / 2] ^= 0x10;
  dir.write("run/ckpt-00000800.h5", flipped);
  EXPECT_EQ(ckpt.latest(), dir.file("run/ckpt-00000500.h5"));

  manual_seed(2);
  TinyNet fresh;
  io::Metadata loaded;
  EXPECT_EQ(ckpt.resume({.model = &fresh, .metadata = &loaded}), std::optional<int64_t>(500));
  EXPECT_EQ(fresh.fc1->parameters()[1].to_vector<float>()[0], 500.f);
  EXPECT_EQ(loaded.numbers.at("step"), 500.0);
  // Another manager's prefix is ignored.
  io::CheckpointManager other(dir.file("run"), {.prefix = "other"});
  EXPECT_FALSE(other.resume({.model = &fresh}).has_value());
}

TEST(IoCheckpointManager, BadOptions) {
  TempFolder dir;
  expect_error([&] { io::CheckpointManager(dir.file("x"), {.keep_last = -1}); }, {"keep_last"});
  expect_error([&] { io::CheckpointManager(dir.file("x"), {.prefix = "a/b"}); }, {"prefix"});
  expect_error([&] { io::CheckpointManager(dir.file("x"), {.rank = 2, .world_size = 2}); }, {"rank 2"});
}

// Two ranks saving in two threads: one main file with the shared parts, one file per rank with its own
// generator states and loader position; each rank resumes its own.
TEST(IoCheckpointManager, RanksWriteTheirOwnFilesAndRankZeroWaitsForThem) {
  TempFolder dir;
  manual_seed(3);
  TinyNet net;
  io::Metadata meta{.numbers = {{"step", 40}}};
  auto manager = [&](int rank) {
    return io::CheckpointManager(dir.file("run"), {.keep_last = 2, .prefix = "ckpt", .rank = rank, .world_size = 2});
  };
  for (int64_t step : {10, 20, 30}) {
    data::LoaderPosition pos0{2, step}, pos1{2, step + 1};
    std::thread rank1([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));  // rank 0 must wait for this file
      manager(1).save(step, {.generators = true, .loader = &pos1});
    });
    manager(0).save(step, {.model = &net, .generators = true, .loader = &pos0, .metadata = &meta});
    rank1.join();
  }
  EXPECT_EQ(files_in(dir / "run"),
            (std::vector<std::string>{"ckpt-00000020.h5", "ckpt-00000020.h5.rank0.h5", "ckpt-00000020.h5.rank1.h5",
                                      "ckpt-00000030.h5", "ckpt-00000030.h5.rank0.h5", "ckpt-00000030.h5.rank1.h5"}));
  io::H5File main(dir.file("run/ckpt-00000030.h5"), io::H5File::Mode::Read);
  EXPECT_TRUE(main.has_group("/model"));
  EXPECT_FALSE(main.has_group("/loader"));  // rank-local parts live in the rank files
  EXPECT_FALSE(main.has_group("/rng"));

  for (int rank : {0, 1}) {
    data::LoaderPosition pos;
    TinyNet fresh;
    auto m = manager(rank);
    EXPECT_EQ(m.resume({.model = &fresh, .generators = true, .loader = &pos}), std::optional<int64_t>(30));
    EXPECT_EQ(pos, (data::LoaderPosition{2, 30 + rank}));
    expect_same_state(net.state_dict(), fresh.state_dict());
  }
  // Resuming the rank-local parts with another world size is refused.
  data::LoaderPosition pos;
  io::CheckpointManager three(dir.file("run"), {.prefix = "ckpt", .rank = 0, .world_size = 3});
  expect_error([&] { three.resume({.loader = &pos}); }, {"saved by 2 rank(s), resumed by 3"});
}

TEST(IoCheckpointManager, RankZeroGivesUpWhenARankNeverSaves) {
  TempFolder dir;
  manual_seed(3);
  TinyNet net;
  data::LoaderPosition pos;
  io::CheckpointManager solo(dir.file("run"), {.prefix = "ckpt"});
  solo.save(5, {.model = &net});
  io::CheckpointManager rank0(dir.file("run"), {.prefix = "ckpt", .rank = 0, .world_size = 2, .rank_timeout_s = 0.3});
  expect_error([&] { rank0.save(6, {.model = &net, .loader = &pos}); },
               {"ckpt-00000006.h5", "rank(s) 1", "ckpt-00000006.h5.rank1.h5"});
  // No main file for step 6 (only rank 0's own file); the previous checkpoint is still the latest.
  EXPECT_FALSE(fs::exists(dir / "run/ckpt-00000006.h5"));
  EXPECT_EQ(solo.latest(), dir.file("run/ckpt-00000005.h5"));
  for (const auto& name : files_in(dir / "run")) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
}

}  // namespace
}  // namespace kiln::testing
