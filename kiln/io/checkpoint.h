// kiln/io/checkpoint.h — training checkpoints: one HDF5 file holding any of the model, the optimizer, the LR
// scheduler, the GradScaler, the random generators, the data loader's position and user metadata.
//
//   io::Metadata meta{.numbers = {{"step", 1000}, {"val_loss", 0.31}}, .strings = {{"config", config_json}}};
//   data::LoaderPosition pos = range.position();
//   io::save_checkpoint("run/ckpt.h5", {.model = model.get(), .optimizer = &opt, .scheduler = sched.get(),
//                                       .generators = true, .loader = &pos, .metadata = &meta});
//   ...
//   io::load_checkpoint("run/ckpt.h5", {.model = model.get(), .optimizer = &opt, .scheduler = sched.get(),
//                                       .generators = true, .loader = &pos, .metadata = &meta});
//   for (auto& batch : loader.epoch(pos.epoch, pos.batch)) ...   // continues exactly where the save was
//
// Saving is atomic: the file is written under a temporary name in the same folder (".<name>.tmp-<host>-<pid>"),
// flushed, fsynced and renamed over `path`, and the folder is fsynced; an error mid-save leaves the previous file
// untouched and no temporary file behind. A process killed mid-save leaves its temporary file: the next save of
// `path` (or CheckpointManager's next save or resume) removes it once its process no longer runs.
// Loading reads and checks everything first — each part asked for is present, the model's names, shapes and
// dtypes, the optimizer's type and group sizes, the scheduler's type, every tensor's crc32 — and only then
// changes the objects; a bad file gives a kiln::Error naming the file and every problem found.
// Tensors go to each parameter's (state's) device on load. The layout (what h5py or h5ls shows) is in
// kiln/io/README.md. For several checkpoints in a folder, keeping the last K, and multi-process jobs, see
// checkpoint_manager.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/data/dataloader.h"     // data::LoaderPosition
#include "kiln/layers/module.h"       // nn::Module
#include "kiln/optim/grad_scaler.h"   // amp::GradScaler
#include "kiln/optim/lr_scheduler.h"  // optim::LRScheduler
#include "kiln/optim/optimizer.h"     // optim::Optimizer

namespace kiln::io {

// What a run wants to remember beside the tensors: the step, metrics, and its configuration. Stored as
// attributes of /metadata (numbers as float64: integers up to 2^53 are exact; strings as UTF-8).
struct Metadata {
  std::map<std::string, double> numbers{};       // "step", "epoch", "val_loss", ...
  std::map<std::string, std::string> strings{};  // "config" (e.g. a JSON text), "run_name", "git_commit", ...
  // Equal when both maps are.
  friend bool operator==(const Metadata&, const Metadata&) = default;
};

// The parts of a checkpoint: each non-null pointer (and `generators` when true) is saved, or loaded into.
// Loading a part the file does not hold is an error naming it; parts of the file not asked for are ignored.
struct CheckpointParts {
  nn::Module* model = nullptr;              // /model/<dotted name>: parameters and persistent buffers
  optim::Optimizer* optimizer = nullptr;    // /optimizer: state tensors and group options
  optim::LRScheduler* scheduler = nullptr;  // /scheduler
  amp::GradScaler* scaler = nullptr;        // /scaler
  bool generators = false;                  // /rng: the CPU default generator and every visible GPU's
  data::LoaderPosition* loader = nullptr;   // /loader: the next batch (epoch, batch)
  Metadata* metadata = nullptr;             // /metadata
};

// The format version save_checkpoint writes (the root attribute "format_version").
inline constexpr int kCheckpointFormatVersion = 1;

// Writes the non-null parts to the HDF5 file `path` atomically: into a temporary file in the same folder, synced to
// disk, then renamed over `path`. kiln::Error if the folder does not exist; on failure `path` is left as it was.
void save_checkpoint(const std::string& path, const CheckpointParts& parts);
// Reads the asked-for parts of a complete checkpoint written by save_checkpoint into the objects. The file is
// verified and every part read and checked before any object changes; kiln::Error naming the file otherwise.
void load_checkpoint(const std::string& path, const CheckpointParts& parts);

// What a checkpoint holds, read from its root attributes and groups (no tensor data is read).
struct CheckpointInfo {
  int64_t format_version = 0;        // the file's format version (kCheckpointFormatVersion when written)
  std::string kiln_version{};        // the kiln that wrote it; empty if not recorded
  std::string created{};             // UTC, ISO 8601
  bool complete = false;             // the last attribute written (see CheckpointManager)
  std::vector<std::string> parts{};  // "model", "optimizer", "scheduler", "scaler", "rng", "loader", "metadata"
};
// Throws a kiln::Error naming the file when it is not a kiln checkpoint of a version this kiln reads.
CheckpointInfo inspect_checkpoint(const std::string& path);

}  // namespace kiln::io
