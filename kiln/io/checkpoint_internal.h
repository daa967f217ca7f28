// kiln/io/checkpoint_internal.h — the pieces save_checkpoint, load_checkpoint and CheckpointManager share
// (internal to kiln_io and its tests): writing the parts into an open file, reading and checking them
// (staging) before any object changes, applying them, and the atomic temporary-file-then-rename write.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/io/checkpoint.h"
#include "kiln/io/hdf5_tensors.h"
#include "kiln/tensor/generator.h"

namespace kiln::io::detail {

// Writes every part `parts` asks for into `f` (one group each), calling the fault hook after each.
void write_parts(H5File& f, const CheckpointParts& parts);

// What a file holds for the parts asked for: read, checksummed and checked against the objects, not applied.
struct StagedParts {
  nn::StateDict model;              // CPU tensors, in the model's state_dict order
  optim::OptimizerState optimizer;  // CPU tensors
  optim::SchedulerState scheduler;
  std::map<std::string, double> scaler;
  GeneratorState cpu_generator;
  std::vector<GeneratorState> cuda_generators;  // one per visible GPU
  data::LoaderPosition loader;
  Metadata metadata;
};
// Throws a kiln::Error naming f's file and every problem (missing parts, names, shapes, dtypes, types).
StagedParts stage_parts(const H5File& f, const CheckpointParts& parts);
// Loads the staged parts into the objects: optimizer, scheduler and scaler first (restored as they were if one
// of them refuses its state), then the model, generators, loader position and metadata (checked already).
void apply_parts(StagedParts& staged, const CheckpointParts& parts);

// Throws naming the file unless it has format="kiln-checkpoint", a format_version this kiln reads and
// complete=1.
void check_format(const H5File& f, bool require_complete = true);

// The HDF5 user block that holds kiln's header (magic KILNCKPT, the file's length, a crc32 of every byte after
// the block; layout in checkpoint_header.cpp).
inline constexpr uint64_t kCheckpointUserBlock = 512;
// Writes kiln's header into the user block of the closed HDF5 file `path`: reads the file back for its crc32.
void seal_checkpoint(const std::string& path);
// Checks kiln's header before HDF5 sees the file: throws naming the file when it is missing, empty, not a kiln
// checkpoint (or one without the header), truncated, longer than written, or its crc32 does not match.
void verify_checkpoint_file(const std::string& path);

// fsync of a file or folder; `what` names it in the error.
void fsync_path(const std::string& path, bool folder, const std::string& what);

// The temporary file a save of `path` by this process writes: ".<name>.tmp-<host>-<pid>" in the same folder.
std::string temporary_path(const std::string& path);
// Removes the files of `folder` whose names start with `name_prefix` (e.g. ".ckpt-") and are temporary files of
// a process of this host that no longer runs (kill(pid, 0) gives ESRCH), printing a line to stderr for each;
// returns their paths. Names without a host (".<name>.tmp-<pid>", from earlier versions) count as this host's.
std::vector<std::string> remove_stale_temporaries(const std::string& folder, const std::string& name_prefix);

// Writes `path` atomically: a temporary file (temporary_path) beside it gets the root attributes
// (complete = 0), then fill(f), then complete = 1; it is flushed, closed, sealed (seal_checkpoint), fsynced and
// renamed over `path`, and the folder is fsynced. On any error the temporary file is removed and `path` is
// untouched. Stale temporary files of earlier saves of `path` (remove_stale_temporaries) are removed first.
void write_atomically(const std::string& path, const std::function<void(H5File&)>& fill);

// For tests: called with the name of each part once it is written ("model", "optimizer", ...); a hook that
// throws simulates a crash mid-save. Empty: none.
void set_save_fault_hook(std::function<void(const std::string& part)> hook);

}  // namespace kiln::io::detail
