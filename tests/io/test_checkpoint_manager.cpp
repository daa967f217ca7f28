// io::CheckpointManager: numbered files, keep_last, latest() skipping incomplete and damaged files, resume();
// and the multi-rank file protocol, with ranks simulated by threads (rank/world_size options).
#include <gtest/gtest.h>
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, getppid

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
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

// ---------------------------------------------------------------- damaged checkpoints

// Every file of a folder (hidden ones included) with its bytes: "touches nothing" is this map unchanged.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = read_file_bytes(e.path());
  return out;
}

// The three ways a checkpoint file is found damaged, and what the reason then says.
struct Damage {
  const char* name;
  const char* reason;
};
const Damage kDamages[] = {
    {"truncated", "truncated"}, {"garbage", "does not start with KILNCKPT"}, {"bad crc", "checksum mismatch"}};

void damage(const fs::path& file, const std::string& how) {
  std::string bytes = read_file_bytes(file);
  if (how == "truncated") {
    bytes.resize(bytes.size() / 2);
  } else if (how == "garbage") {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 7919u + 13u) & 0xFF);
  } else {
    bytes[bytes.size() / 2] ^= 0x10;
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

// Saves steps 100 and 200 (fc1.bias filled with the step, to tell them apart).
void save_two(io::CheckpointManager& ckpt, TinyNet& net) {
  for (int64_t step : {100, 200}) {
    net.fc1->parameters()[1].detach().fill_(static_cast<double>(step));
    ckpt.save(step, {.model = &net});
  }
}

TEST(IoCheckpointManager, ADamagedNewestIsNamedAndTheOlderOneResumed) {
  for (const Damage& d : kDamages) {
    SCOPED_TRACE(d.name);
    TempFolder dir;
    io::CheckpointManager ckpt(dir.file("run"), {.keep_last = 3});
    manual_seed(1);
    TinyNet net;
    save_two(ckpt, net);
    damage(dir / "run/ckpt-00000200.h5", d.name);
    TinyNet fresh;
    ::testing::internal::CaptureStderr();
    const std::optional<int64_t> step = ckpt.resume({.model = &fresh});
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(step, std::optional<int64_t>(100));
    EXPECT_EQ(fresh.fc1->parameters()[1].to_vector<float>()[0], 100.f);
    ASSERT_EQ(ckpt.skipped().size(), 1u);
    EXPECT_EQ(ckpt.skipped()[0].step, 200);
    EXPECT_EQ(ckpt.skipped()[0].path, dir.file("run/ckpt-00000200.h5"));
    EXPECT_NE(ckpt.skipped()[0].reason.find(d.reason), std::string::npos) << ckpt.skipped()[0].reason;
    EXPECT_NE(log.find("kiln: skipped the checkpoint " + dir.file("run/ckpt-00000200.h5") + " ("), std::string::npos)
        << log;
    EXPECT_NE(log.find(d.reason), std::string::npos) << log;
    EXPECT_NE(log.find("resuming from the older " + dir.file("run/ckpt-00000100.h5")), std::string::npos) << log;
    // The run continues and saves step 200 again: the damaged file is kept aside, byte for byte, not overwritten.
    const std::string damaged = read_file_bytes(dir / "run/ckpt-00000200.h5");
    ::testing::internal::CaptureStderr();
    ckpt.save(200, {.model = &fresh});
    const std::string save_log = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(read_file_bytes(dir / "run/ckpt-00000200.h5.damaged"), damaged);
    EXPECT_NE(save_log.find("moved the damaged checkpoint"), std::string::npos) << save_log;
    EXPECT_EQ(ckpt.latest(), dir.file("run/ckpt-00000200.h5"));
    EXPECT_TRUE(ckpt.skipped().empty());
  }
}

TEST(IoCheckpointManager, WhenNoCheckpointLoadsResumeRefusesAndTouchesNothing) {
  for (const Damage& d : kDamages) {
    SCOPED_TRACE(d.name);
    TempFolder dir;
    io::CheckpointManager ckpt(dir.file("run"), {.keep_last = 3});
    manual_seed(1);
    TinyNet net;
    save_two(ckpt, net);
    damage(dir / "run/ckpt-00000100.h5", d.name);
    damage(dir / "run/ckpt-00000200.h5", d.name);
    const auto before = snapshot(dir / "run");
    manual_seed(2);
    TinyNet fresh;
    const auto fresh_state = fresh.state_dict();
    std::vector<nn::StateDict::value_type> copy;
    for (const auto& [name, t] : fresh_state) copy.emplace_back(name, t.clone());
    const std::vector<std::string> want = {dir.file("run") + ": none of its 2 checkpoint(s) can be loaded",
                                           dir.file("run/ckpt-00000200.h5") + ": ",
                                           dir.file("run/ckpt-00000100.h5") + ": ",
                                           d.reason,
                                           "no checkpoint was changed",
                                           "move them out of " + dir.file("run")};
    expect_error([&] { ckpt.resume({.model = &fresh}); }, want);
    expect_error([&] { (void)ckpt.latest(); }, want);
    // A fresh manager (a new run) sees the same.
    expect_error([&] { (void)io::CheckpointManager(dir.file("run")).latest(); }, want);
    EXPECT_EQ(ckpt.skipped().size(), 2u);
    EXPECT_EQ(snapshot(dir / "run"), before);
    const auto after = fresh.state_dict();
    for (size_t i = 0; i < copy.size(); ++i) {
      EXPECT_EQ(bytes_of(after[i].second), bytes_of(copy[i].second)) << after[i].first;
    }
  }
}

// keep_last counts loadable checkpoints: damaged files newer than them never push the last loadable ones out.
TEST(IoCheckpointManager, RotationKeepsLoadableCheckpointsPastDamagedOnes) {
  TempFolder dir;
  io::CheckpointManager ckpt(dir.file("run"), {.keep_last = 2});
  manual_seed(1);
  TinyNet net;
  save_two(ckpt, net);
  for (const char* name : {"ckpt-00000300.h5", "ckpt-00000400.h5", "ckpt-00000500.h5"}) {
    dir.write(std::string("run/") + name, std::string(4000, 'x'));
  }
  ::testing::internal::CaptureStderr();
  ckpt.save(600, {.model = &net});
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(files_in(dir / "run"), (std::vector<std::string>{"ckpt-00000200.h5", "ckpt-00000300.h5", "ckpt-00000400.h5",
                                                             "ckpt-00000500.h5", "ckpt-00000600.h5"}));
  EXPECT_EQ(ckpt.list(), (std::vector<std::pair<int64_t, std::string>>{{200, dir.file("run/ckpt-00000200.h5")},
                                                                       {600, dir.file("run/ckpt-00000600.h5")}}));
}

// A process killed mid-save (kill -9) leaves its temporary file: the next save or resume removes those of dead
// processes of this host, and keeps those of live processes and of other hosts.
TEST(IoCheckpointManager, StaleTemporaryFilesOfDeadProcessesAreRemoved) {
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);  // reaped: no process has this id now
  const pid_t alive = ::getppid();               // this test's parent (ctest or a shell): alive while it runs
  for (const char* when : {"resume", "save"}) {
    SCOPED_TRACE(when);
    TempFolder dir;
    io::CheckpointManager ckpt(dir.file("run"), {});
    // .ckpt-00000005.h5.tmp-<this host>-<this pid>: the name's form, from the writer itself.
    const std::string mine = fs::path(io::detail::temporary_path(dir.file("run/ckpt-00000005.h5"))).filename();
    const std::string stem = mine.substr(0, mine.rfind('-') + 1);  // ".ckpt-00000005.h5.tmp-<host>-"
    const std::string dead_tmp = stem + std::to_string(dead), live_tmp = stem + std::to_string(alive);
    const std::string legacy_dead = ".ckpt-00000007.h5.rank1.h5.tmp-" + std::to_string(dead);
    const std::string other_host = ".ckpt-00000005.h5.tmp-another-host-" + std::to_string(dead);
    const std::string other_prefix = ".other-00000005.h5.tmp-" + std::to_string(dead);
    for (const auto& name : {dead_tmp, live_tmp, legacy_dead, other_host, other_prefix}) {
      dir.write("run/" + name, "partial");
    }
    manual_seed(1);
    TinyNet net;
    ::testing::internal::CaptureStderr();
    if (std::string(when) == "resume") {
      EXPECT_FALSE(ckpt.resume({.model = &net}).has_value());  // temporary files are no checkpoints
    } else {
      ckpt.save(9, {.model = &net});
    }
    const std::string log = ::testing::internal::GetCapturedStderr();
    std::vector<std::string> want = {live_tmp, other_host, other_prefix};
    if (std::string(when) == "save") want.push_back("ckpt-00000009.h5");
    std::sort(want.begin(), want.end());
    EXPECT_EQ(files_in(dir / "run"), want);
    EXPECT_NE(log.find("kiln: removed " + dir.file("run/" + dead_tmp) + ", the temporary file of a save by process " +
                       std::to_string(dead)),
              std::string::npos)
        << log;
    EXPECT_NE(log.find(legacy_dead), std::string::npos) << log;
  }
}

// save_checkpoint alone removes the stale temporary files of its own target (those of other files are the
// manager's business).
TEST(IoCheckpointManager, SaveCheckpointRemovesItsOwnStaleTemporaryFiles) {
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  TempFolder dir;
  const std::string mine = fs::path(io::detail::temporary_path(dir.file("model.h5"))).filename();
  const std::string stale = mine.substr(0, mine.rfind('-') + 1) + std::to_string(dead);
  const std::string other = ".other.h5.tmp-" + std::to_string(dead);
  dir.write(stale, "partial");
  dir.write(other, "partial");
  manual_seed(1);
  TinyNet net;
  ::testing::internal::CaptureStderr();
  io::save_checkpoint(dir.file("model.h5"), {.model = &net});
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(files_in(dir.path()), (std::vector<std::string>{other, "model.h5"}));
  EXPECT_NE(log.find(stale), std::string::npos) << log;
}

// Several ranks: a checkpoint with a damaged rank file is damaged for every rank, so all ranks resume the same
// older step (rank 1's own file being fine does not matter), and only rank 0 writes the log line.
TEST(IoCheckpointManager, RanksAgreeWhenARankFileIsDamaged) {
  TempFolder dir;
  manual_seed(3);
  TinyNet net;
  auto manager = [&](int rank) {
    return io::CheckpointManager(dir.file("run"), {.keep_last = 3, .prefix = "ckpt", .rank = rank, .world_size = 2});
  };
  for (int64_t step : {10, 20}) {
    data::LoaderPosition pos0{0, step}, pos1{1, step};
    std::thread rank1([&] { manager(1).save(step, {.generators = true, .loader = &pos1}); });
    manager(0).save(step, {.model = &net, .generators = true, .loader = &pos0});
    rank1.join();
  }
  damage(dir / "run/ckpt-00000020.h5.rank0.h5", "bad crc");
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    data::LoaderPosition pos;
    TinyNet fresh;
    auto m = manager(rank);
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(m.resume({.model = &fresh, .generators = true, .loader = &pos}), std::optional<int64_t>(10));
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(pos, (data::LoaderPosition{static_cast<uint64_t>(rank), 10}));
    ASSERT_EQ(m.skipped().size(), 1u);
    EXPECT_NE(m.skipped()[0].reason.find("ckpt-00000020.h5.rank0.h5: corrupted"), std::string::npos)
        << m.skipped()[0].reason;
    EXPECT_EQ(log.empty(), rank != 0) << log;
  }
  // Every file of step 10 damaged too: every rank refuses.
  damage(dir / "run/ckpt-00000010.h5", "truncated");
  for (int rank : {0, 1}) {
    data::LoaderPosition pos;
    auto m = manager(rank);
    expect_error([&] { m.resume({.generators = true, .loader = &pos}); }, {"none of its 2 checkpoint(s)"});
  }
}

}  // namespace
}  // namespace kiln::testing
