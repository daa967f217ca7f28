// fuzz/fuzz_checkpoint.cpp — libFuzzer targets: any bytes, read as a whole kiln checkpoint file.
//
// The input is written to a file in /dev/shm and given to io::inspect_checkpoint and to io::load_checkpoint
// into a small model, an AdamW optimizer and every other part (scheduler, scaler, generators, loader position,
// metadata). kiln::Error is the expected outcome for bad input; any other exception or crash is a finding.
//
// Two targets from this file:
//   fuzz_checkpoint         the bytes as they are: kiln's header check (magic, length, file-level crc32) must
//                           refuse every damaged file before HDF5 parses it.
//   fuzz_checkpoint_sealed  (KILN_FUZZ_SEALED) the header is rewritten to match the mutated bytes before loading
//                           (io::detail::seal_checkpoint), so the file reaches HDF5 and kiln's checks of the parts
//                           (names, shapes, dtypes, per-tensor crc32). A crash inside libhdf5 here is a finding
//                           about HDF5, from which the file-level crc protects kiln's users.
//
// Seeds: KILN_FUZZ_WRITE_SEEDS=<folder> ./fuzz_checkpoint writes valid checkpoints of this target's model to
// the folder and exits (fuzz/corpus/checkpoint/ holds them). KILN_FUZZ_VERBOSE=1 prints, for each input, the
// kiln::Error each call refused it with (or "accepted").
#include <unistd.h>  // getpid

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "kiln/autograd/functions.h"  // sum
#include "kiln/io/checkpoint.h"
#include "kiln/io/checkpoint_internal.h"
#include "kiln/layers/containers.h"  // nn::Sequential
#include "kiln/layers/layers.h"
#include "kiln/optim/adam.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/generator.h"
#include "kiln/tensor/internal_ops.h"

namespace {

using namespace kiln;

// The objects a checkpoint loads into: small, so each run is quick. (4 -> 3 -> 2, AdamW, warmup + cosine.)
struct Objects {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::LRScheduler> sched;
  amp::GradScaler scaler;
  data::LoaderPosition pos;
  io::Metadata meta;

  Objects() {
    manual_seed(1);
    model = std::make_shared<nn::Sequential>(
        std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::Linear>(3, 2)});
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-2});
    sched = optim::linear_warmup_cosine_decay(*opt, 2, 10);
  }
  io::CheckpointParts all() {
    return {.model = model.get(),
            .optimizer = opt.get(),
            .scheduler = sched.get(),
            .scaler = &scaler,
            .generators = true,
            .loader = &pos,
            .metadata = &meta};
  }
  void step() {  // one AdamW step, so the optimizer has state tensors
    opt->zero_grad();
    Tensor x = internal::from_vector<float>({1, 2, 3, 4, -1, 0.5f, 2, 0}, {2, 4});
    sum((*model)(x)).backward();
    opt->step();
    sched->step();
  }
};

void write_seeds(const std::string& folder) {
  std::filesystem::create_directories(folder);
  Objects o;
  io::save_checkpoint(folder + "/model-only.h5", {.model = o.model.get()});
  io::save_checkpoint(folder + "/fresh-optimizer.h5", {.model = o.model.get(), .optimizer = o.opt.get()});
  o.step();
  io::save_checkpoint(folder + "/model-optimizer.h5", {.model = o.model.get(), .optimizer = o.opt.get()});
  o.pos = {.epoch = 2, .batch = 17};
  o.meta = {.numbers = {{"step", 1000}, {"val_loss", 0.25}}, .strings = {{"config", "{\"lr\": 0.01}"}}};
  io::save_checkpoint(folder + "/everything.h5", o.all());
}

std::string input_path() { return "/dev/shm/kiln-fuzz-checkpoint-" + std::to_string(::getpid()) + ".h5"; }

}  // namespace

// The kiln libraries are compiled with UBSan's recoverable checks (top CMakeLists.txt's KILN_FUZZ flags): make
// every report fatal, so that libFuzzer records it as a finding instead of printing it and going on.
extern "C" const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* folder = std::getenv("KILN_FUZZ_WRITE_SEEDS")) {
    write_seeds(folder);
    std::printf("seeds written to %s\n", folder);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = input_path();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) std::abort();  // /dev/shm full: not a finding about kiln, but stop rather than fuzz nothing
  }
#ifdef KILN_FUZZ_SEALED
  if (size > io::detail::kCheckpointUserBlock) io::detail::seal_checkpoint(path);
#endif
  static Objects objects;  // built once: loading into them is what is fuzzed (a refused load changes nothing)
  // KILN_FUZZ_VERBOSE=1 prints why kiln refused the file (to triage one input: where does it stop?).
  static const bool verbose = std::getenv("KILN_FUZZ_VERBOSE") != nullptr;
  const auto attempt = [&](const char* what, const auto& call) {
    try {
      call();
      if (verbose) std::fprintf(stderr, "%s: accepted\n", what);
    } catch (const Error& e) {
      if (verbose) std::fprintf(stderr, "%s: kiln::Error: %s\n", what, e.what());
    }
  };
  attempt("inspect_checkpoint", [&] { io::inspect_checkpoint(path); });
  attempt("load_checkpoint(model, optimizer)",
          [&] { io::load_checkpoint(path, {.model = objects.model.get(), .optimizer = objects.opt.get()}); });
  attempt("load_checkpoint(every part)", [&] { io::load_checkpoint(path, objects.all()); });
  std::remove(path.c_str());
  return 0;
}
