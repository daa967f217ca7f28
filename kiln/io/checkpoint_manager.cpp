// kiln/io/checkpoint_manager.cpp — numbered checkpoints in a folder, keeping the last K, and the file-based
// protocol by which several ranks save one checkpoint (see checkpoint_manager.h).
#include "kiln/io/checkpoint_manager.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include "kiln/data/distributed_env.h"
#include "kiln/io/checkpoint_internal.h"
#include "kiln/tensor/error.h"

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

// The step of "<prefix>-<digits>.h5" (or, with rank_file, "<prefix>-<digits>.h5.rank<r>.h5"), or -1.
int64_t parse_step(const std::string& name, const std::string& prefix, bool rank_file) {
  const std::string head = prefix + "-";
  if (name.rfind(head, 0) != 0) return -1;
  size_t end = name.find(".h5", head.size());
  if (end == std::string::npos || end == head.size()) return -1;
  const std::string tail = name.substr(end);
  const bool ok =
      rank_file ? (tail.rfind(".h5.rank", 0) == 0 && tail.size() > 11 && tail.compare(tail.size() - 3, 3, ".h5") == 0 &&
                   std::all_of(tail.begin() + 8, tail.end() - 3, ::isdigit))
                : tail == ".h5";
  if (!ok) return -1;
  const std::string digits = name.substr(head.size(), end - head.size());
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

// The parts each file of a multi-rank checkpoint holds.
CheckpointParts shared_parts(CheckpointParts p) {
  p.generators = false;
  p.loader = nullptr;
  return p;
}
CheckpointParts rank_parts(const CheckpointParts& p) {
  return CheckpointParts{.generators = p.generators, .loader = p.loader};
}

// Empty when `path` is a complete checkpoint (of `step`, unless -1), else why not (the error, naming the file).
std::string file_problem(const std::string& path, int64_t step) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return path + ": missing";
  try {
    detail::verify_checkpoint_file(path);
    H5File f(path, H5File::Mode::Read);
    detail::check_format(f);
    if (step >= 0 && !(f.has_attr("/", "step") && f.attr_int("/", "step") == step)) {
      return path + ": its root attribute step is not " + std::to_string(step) + ", the step its name says";
    }
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

bool is_complete(const std::string& path, int64_t step) { return file_problem(path, step).empty(); }

}  // namespace

CheckpointManager::CheckpointManager(std::string folder, CheckpointManagerOptions options)
    : folder_(std::move(folder)), options_(std::move(options)) {
  const data::DistributedEnv env = data::distributed_env();
  rank_ = options_.rank >= 0 ? options_.rank : env.rank;
  world_size_ = options_.world_size >= 1 ? options_.world_size : env.world_size;
  KILN_CHECK(rank_ < world_size_, "CheckpointManager: rank ", rank_, " is not below the world size ", world_size_);
  KILN_CHECK(options_.keep_last >= 0, "CheckpointManager: keep_last is ", options_.keep_last,
             "; use >= 0 (0: keep all)");
  KILN_CHECK(!options_.prefix.empty() && options_.prefix.find('/') == std::string::npos,
             "CheckpointManager: the prefix '", options_.prefix, "' must be a non-empty file name part");
  KILN_CHECK(options_.digits >= 1 && options_.digits <= 18, "CheckpointManager: digits is ", options_.digits,
             "; use 1 to 18");
  std::error_code ec;
  fs::create_directories(folder_, ec);
  KILN_CHECK(fs::is_directory(folder_, ec), "CheckpointManager: cannot create the folder ", folder_);
}

std::string CheckpointManager::path_for(int64_t step) const {
  std::ostringstream s;
  s << options_.prefix << "-" << std::setw(options_.digits) << std::setfill('0') << step << ".h5";
  return (fs::path(folder_) / s.str()).string();
}

std::string CheckpointManager::rank_path_for(int64_t step, int rank) const {
  return path_for(step) + ".rank" + std::to_string(rank) + ".h5";
}

std::string CheckpointManager::save(int64_t step, const CheckpointParts& parts) {
  KILN_CHECK(step >= 0, "CheckpointManager.save: step is ", step, "; use >= 0");
  const std::string main = path_for(step);
  remove_stale_temporaries();
  // A damaged file of this step (skipped by resume) is kept aside rather than overwritten.
  auto keep_aside = [](const std::string& path, int64_t file_step) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return;
    const std::string why = file_problem(path, file_step);
    if (why.empty()) return;
    std::string aside = path + ".damaged";
    for (int i = 1; fs::exists(aside, ec); ++i) aside = path + ".damaged." + std::to_string(i);
    fs::rename(path, aside, ec);
    KILN_CHECK(!ec, path, ": cannot move this damaged checkpoint aside to ", aside, " before saving over it (",
               ec.message(), "); move it yourself");
    std::cerr << "kiln: moved the damaged checkpoint " << path << " to " << aside << " before saving step " << file_step
              << " (" << why << ")\n";
  };
  if (rank_ == 0) keep_aside(main, step);
  auto write = [&](H5File& f, const CheckpointParts& p) {
    f.set_attr("/", "step", step);
    f.set_attr("/", "world_size", static_cast<int64_t>(world_size_));
    detail::write_parts(f, p);
  };
  if (world_size_ == 1) {
    detail::write_atomically(main, [&](H5File& f) { write(f, parts); });
    prune(step);
    return main;
  }
  // Every rank: its own file, complete before rank 0 can see it.
  detail::write_atomically(rank_path_for(step, rank_), [&](H5File& f) {
    f.set_attr("/", "rank", static_cast<int64_t>(rank_));
    write(f, rank_parts(parts));
  });
  if (rank_ != 0) return main;
  detail::write_atomically(main, [&](H5File& f) {
    write(f, shared_parts(parts));
    // Wait (without holding the HDF5 lock) until every rank's file of this step is there and complete.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.rank_timeout_s);
    std::vector<int> missing;
    for (;;) {
      missing.clear();
      for (int r = 0; r < world_size_; ++r) {
        if (!is_complete(rank_path_for(step, r), step)) missing.push_back(r);
      }
      if (missing.empty() || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!missing.empty()) {
      std::ostringstream s;
      for (size_t i = 0; i < missing.size(); ++i) s << (i ? ", " : "") << missing[i];
      KILN_FAIL(main, ": gave up after ", options_.rank_timeout_s, " s waiting for the checkpoint files of rank(s) ",
                s.str(), " (e.g. ", rank_path_for(step, missing[0]),
                "); did every rank call save() with this step, and do all ranks see this folder?");
    }
  });
  prune(step);
  return main;
}

std::vector<std::pair<int64_t, std::string>> CheckpointManager::scan(bool complete_only) const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder_, ec)) {
    const int64_t step = parse_step(entry.path().filename().string(), options_.prefix, false);
    if (step < 0) continue;
    if (complete_only && !problem(step, entry.path().string()).empty()) continue;
    found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string CheckpointManager::problem(int64_t step, const std::string& main) const {
  std::string why = file_problem(main, step);
  if (!why.empty()) return why;
  // A checkpoint saved by several ranks is loadable only with every rank file: every rank checks all of them,
  // so that all ranks take the same one.
  int64_t saved_world = 1;
  try {
    H5File f(main, H5File::Mode::Read);
    saved_world = f.has_attr("/", "world_size") ? f.attr_int("/", "world_size") : 1;
  } catch (const Error& e) {
    return e.what();
  }
  for (int64_t r = 0; r < saved_world && saved_world > 1; ++r) {
    why = file_problem(rank_path_for(step, static_cast<int>(r)), step);
    if (!why.empty()) return why;
  }
  return "";
}

std::vector<std::pair<int64_t, std::string>> CheckpointManager::list() const { return scan(true); }

std::vector<std::string> CheckpointManager::remove_stale_temporaries() const {
  return detail::remove_stale_temporaries(folder_, "." + options_.prefix + "-");
}

std::optional<std::pair<int64_t, std::string>> CheckpointManager::find_newest() const {
  skipped_.clear();
  const auto all = scan(false);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    std::string why = problem(it->first, it->second);
    if (why.empty()) return *it;
    skipped_.push_back({it->first, it->second, std::move(why)});
  }
  if (skipped_.empty()) return std::nullopt;
  std::ostringstream s;
  s << folder_ << ": none of its " << skipped_.size() << " checkpoint(s) can be loaded:\n";
  for (const auto& k : skipped_) s << "  " << k.reason << "\n";
  s << "Nothing was loaded and no checkpoint was changed: kiln neither starts over nor overwrites checkpoints it "
       "cannot "
       "read. Restore them from a copy, or, to start from the beginning anyway, move them out of "
    << folder_ << " (or use another folder).";
  throw Error(s.str());
}

void CheckpointManager::prune(int64_t newest_step) const {
  if (options_.keep_last == 0) return;
  const auto complete = scan(true);
  if (complete.size() <= static_cast<size_t>(options_.keep_last)) return;
  // Everything older than the oldest kept checkpoint goes: main files (complete or not) and rank files.
  const int64_t oldest_kept = complete[complete.size() - static_cast<size_t>(options_.keep_last)].first;
  if (oldest_kept > newest_step) return;  // a save of an older step than those present: delete nothing
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(folder_, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t step = parse_step(name, options_.prefix, false);
    if (step < 0) step = parse_step(name, options_.prefix, true);
    if (step >= 0 && step < oldest_kept) doomed.push_back(entry.path());
  }
  for (const auto& p : doomed) fs::remove(p, ec);  // best effort: a file already gone is fine
}

std::optional<std::string> CheckpointManager::latest() const {
  const auto newest = find_newest();
  if (!newest) return std::nullopt;
  return newest->second;
}

std::optional<int64_t> CheckpointManager::resume(const CheckpointParts& parts) {
  remove_stale_temporaries();
  const auto newest = find_newest();
  if (!newest) return std::nullopt;
  if (rank_ == 0) {
    for (const auto& k : skipped_) {
      std::cerr << "kiln: skipped the checkpoint " << k.path << " (" << k.reason << "); resuming from the older "
                << newest->second << "\n";
    }
  }
  const std::optional<std::string> main = newest->second;
  const bool split = world_size_ > 1 && (parts.generators || parts.loader != nullptr);
  detail::StagedParts shared, own;
  int64_t step = 0;
  {
    detail::verify_checkpoint_file(*main);
    H5File f(*main, H5File::Mode::Read);
    detail::check_format(f);
    KILN_CHECK(f.has_attr("/", "step"), *main, ": no root attribute step; not written by CheckpointManager");
    step = f.attr_int("/", "step");
    const int64_t saved_world = f.has_attr("/", "world_size") ? f.attr_int("/", "world_size") : 1;
    KILN_CHECK(!split || saved_world == world_size_, *main, ": saved by ", saved_world, " rank(s), resumed by ",
               world_size_,
               "; the generators and loader positions are per rank: resume "
               "with as many ranks, or without those parts");
    shared = detail::stage_parts(f, split ? shared_parts(parts) : parts);
  }
  if (split) {
    const std::string mine = rank_path_for(step, rank_);
    detail::verify_checkpoint_file(mine);
    H5File f(mine, H5File::Mode::Read);
    detail::check_format(f);
    own = detail::stage_parts(f, rank_parts(parts));
  }
  detail::apply_parts(shared, split ? shared_parts(parts) : parts);
  if (split) detail::apply_parts(own, rank_parts(parts));
  return step;
}

}  // namespace kiln::io
