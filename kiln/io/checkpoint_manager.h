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
// complete when its root attribute complete = 1 (written last, before the rename) and it opens as a kiln
// checkpoint; latest() and resume() skip any other file.
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

struct CheckpointManagerOptions {
  int keep_last = 3;  // complete checkpoints kept after a save; 0 keeps all
  std::string prefix = "ckpt";
  int digits = 8;               // zero-padding of the step in file names
  int rank = -1;                // -1: data::distributed_env().rank (set both to simulate ranks in tests)
  int world_size = -1;          // -1: data::distributed_env().world_size
  double rank_timeout_s = 600;  // how long rank 0 waits for the other ranks' files
};

class CheckpointManager {
 public:
  explicit CheckpointManager(std::string folder, CheckpointManagerOptions options = {});

  // Saves the checkpoint of `step` (>= 0) and deletes complete ones older than the newest keep_last. Returns
  // the main file's path.
  std::string save(int64_t step, const CheckpointParts& parts);
  // The newest complete checkpoint's main file, if any.
  std::optional<std::string> latest() const;
  // Loads the newest complete checkpoint into `parts` and returns its step; nothing when there is none.
  std::optional<int64_t> resume(const CheckpointParts& parts);
  // Complete checkpoints, oldest first: (step, main file path).
  std::vector<std::pair<int64_t, std::string>> list() const;

  std::string path_for(int64_t step) const;                 // <folder>/<prefix>-<step>.h5
  std::string rank_path_for(int64_t step, int rank) const;  // <main file>.rank<r>.h5
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

 private:
  std::vector<std::pair<int64_t, std::string>> scan(bool complete_only) const;
  void prune(int64_t newest_step) const;

  std::string folder_;
  CheckpointManagerOptions options_;
  int rank_ = 0;
  int world_size_ = 1;
};

}  // namespace kiln::io
