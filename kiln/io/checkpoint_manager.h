// kiln/io/checkpoint_manager.h — a folder of numbered checkpoints: save every N steps, keep the last K,
// resume from the newest complete one; in multi-process jobs each rank saves what is its own.
//
//   io::CheckpointManager ckpt("run/", {.keep_last = 3, .prefix = "ckpt"});
//   io::CheckpointParts parts{.model = model.get(), .optimizer = &opt, .generators = true, .loader = &pos};
//   int64_t step = ckpt.resume(parts).value_or(0);     // loads run/ckpt-00001200.h5 if it is the newest
//   for (; step < total; ++step) {
//     ...
//     if ((step + 1) % 200 == 0) ckpt.save(step + 1, parts);   // writes run/ckpt-<step+1>.h5, deletes the oldest
//   }
//
// Files: <folder>/<prefix>-<step, 8 digits>.h5 (the step is also its root attribute "step"). A checkpoint is
// loadable when its kiln header and crc32 check out, its root attribute complete = 1 (written last, before the
// rename), its step attribute matches its name, and (for a checkpoint saved by several ranks) every rank file of
// it is loadable too. A damaged checkpoint is never passed over in silence nor overwritten:
// - resume() takes the newest loadable one and prints one line to stderr for each newer file it skipped, naming
//   it and why (rank 0 only); skipped() returns the same as a list.
// - When the folder holds checkpoint files but none is loadable, latest() and resume() throw a kiln::Error
//   listing each file and its problem, and change nothing (a run must not start over and overwrite them). To
//   start from the beginning anyway, move those files out of the folder.
// - save() over a damaged file of the same step first renames it to <file>.damaged (with a line to stderr).
// - keep_last counts loadable checkpoints only: damaged files never push a loadable one out.
// Every rank takes the same decision, from the same files, so no rank resumes from another step than the others.
// Temporary files (.<name>.tmp-<host>-<pid>) of saves whose process died (kill -9 mid-save) are removed by the
// next save() or resume() on the same host, with a line to stderr; those of live processes, and of other hosts,
// are kept. (Processes in separate PID namespaces that share a host name and a folder cannot see each other:
// give such containers distinct host names.)
//
// Several ranks (world_size > 1, from data::distributed_env() unless the options say otherwise): every rank
// calls save(step, parts) with the same step. Rank-local parts — the generators and the loader position — go
// to <prefix>-<step>.h5.rank<r>.h5, written atomically by rank r. Rank 0 writes everything else (model,
// optimizer, scheduler, scaler, metadata) into the main file's temporary copy, then waits (polling every
// 50 ms, up to rank_timeout_s) until every rank file of that step exists and is complete, and only then marks
// the main file complete and renames it into place: a main file that exists implies all its rank files do.
// No message passing is needed, only a folder every rank sees (a shared file system for several nodes).
// If the wait times out, rank 0 throws naming the missing ranks and the previous checkpoints are kept. Rank 0
// also deletes old checkpoints (main and rank files). resume() on rank r loads the shared parts from the main
// file and its own parts from its rank file. Rank files left from an earlier, failed save of the same step
// are indistinguishable from new ones: after such a failure, save the next time under another step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/io/checkpoint.h"

namespace kiln::io {

// How many checkpoints a CheckpointManager keeps, how it names them, and how long rank 0 waits for the other ranks'
// files.
struct CheckpointManagerOptions {
  int keep_last = 3;            // complete checkpoints kept after a save; 0 keeps all
  std::string prefix = "ckpt";  // file names <prefix>-<step>.h5; non-empty, no '/'
  int digits = 8;               // zero-padding of the step in file names
  int rank = -1;                // -1: data::distributed_env().rank (set both to simulate ranks in tests)
  int world_size = -1;          // -1: data::distributed_env().world_size
  double rank_timeout_s = 600;  // how long rank 0 waits for the other ranks' files
};

// A checkpoint that latest() and resume() passed over, and why.
struct SkippedCheckpoint {
  int64_t step = 0;      // the training step it was saved at
  std::string path{};    // the main file of that step
  std::string reason{};  // what reading it (or one of its rank files) gave, naming the file
};

// Numbered checkpoints in a folder: saves every N steps, keeps the last K, finds the latest complete one to resume
// from (several ranks included).
class CheckpointManager {
 public:
  // Creates `folder` if needed. kiln::Error for options out of range, rank >= world_size, or a folder that cannot
  // be created.
  explicit CheckpointManager(std::string folder, CheckpointManagerOptions options = {});

  // Saves the checkpoint of `step` (>= 0) and deletes complete ones older than the newest keep_last. Returns
  // the main file's path.
  std::string save(int64_t step, const CheckpointParts& parts);
  // The newest loadable checkpoint's main file; nothing when the folder holds no checkpoint file. Throws a
  // kiln::Error listing every file and its problem when it holds some but none is loadable.
  std::optional<std::string> latest() const;
  // Loads the newest loadable checkpoint into `parts` and returns its step; nothing when the folder holds no
  // checkpoint file. Each newer, damaged one is named on stderr (and in skipped()); when none is loadable it
  // throws as latest() does, and `parts` and the folder are unchanged. Removes stale temporary files first.
  std::optional<int64_t> resume(const CheckpointParts& parts);
  // The checkpoints the last latest() or resume() passed over, newest first (every one when it threw).
  const std::vector<SkippedCheckpoint>& skipped() const { return skipped_; }
  // Loadable checkpoints, oldest first: (step, main file path).
  std::vector<std::pair<int64_t, std::string>> list() const;
  // Removes this folder's temporary files left by dead processes of this host; returns their paths.
  std::vector<std::string> remove_stale_temporaries() const;

  std::string path_for(int64_t step) const;                 // <folder>/<prefix>-<step>.h5
  std::string rank_path_for(int64_t step, int rank) const;  // <main file>.rank<r>.h5
  // This process's rank: options.rank, or data::distributed_env()'s.
  int rank() const { return rank_; }
  // The number of ranks: options.world_size, or data::distributed_env()'s.
  int world_size() const { return world_size_; }

 private:
  std::vector<std::pair<int64_t, std::string>> scan(bool complete_only) const;
  // Empty when the checkpoint of `step` at `main` is loadable, else why not.
  std::string problem(int64_t step, const std::string& main) const;
  // The newest loadable checkpoint, filling skipped_; throws when files exist but none is loadable.
  std::optional<std::pair<int64_t, std::string>> find_newest() const;
  void prune(int64_t newest_step) const;

  std::string folder_;
  CheckpointManagerOptions options_;
  int rank_ = 0;
  int world_size_ = 1;
  mutable std::vector<SkippedCheckpoint> skipped_;
};

}  // namespace kiln::io
