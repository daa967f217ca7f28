// kiln/data/gpu_decode/nvjpeg_library.h — nvJPEG loaded at run time with dlopen (private to kiln_data).
//
//   const nvjpeg::Functions& f = nvjpeg::functions();   // loads once; throws kiln::Error saying what to do
//   f.create_ex(...);                                    // nvjpeg.h's functions, resolved with dlsym
//
// Why loaded and not linked: libnvjpeg.so.13 is not part of every CUDA toolkit (it comes from PyPI's
// nvidia-nvjpeg, which PyTorch installs too), so a kiln linked to it would not start without it. Looked for,
// in order: $KILN_NVJPEG_LIBRARY alone when it is set; "libnvjpeg.so.13" through the dynamic loader's search
// (LD_LIBRARY_PATH, ldconfig); kiln's own third_party/nvjpeg/lib (scripts/setup.sh puts it there); the same
// folder above the running program; then Python's site-packages (nvidia/cu13/lib, nvidia/nvjpeg/lib) of the
// system, the user, $VIRTUAL_ENV and $CONDA_PREFIX.
#pragma once

#include <string>
#include <vector>

namespace kiln::data::nvjpeg {

struct Functions;  // nvjpeg_functions.h (needs nvjpeg.h)

// Whether this build had nvjpeg.h (third_party/nvjpeg/include, from scripts/setup.sh) and CUDA.
bool built_with_header();

// Where functions() looks for the library, in order (see the top of this file).
std::vector<std::string> candidate_paths();

// The result of trying paths in order: the first that opens and has every function kiln uses.
struct LoadResult {
  const Functions* functions = nullptr;  // null on failure
  std::string path;                      // the file loaded
  std::string error;                     // on failure: each path tried and why, and what to do
};
LoadResult load(const std::vector<std::string>& paths);

// The process's nvJPEG, loaded on first use from candidate_paths(). Throws kiln::Error naming what is
// missing and how to install it (scripts/setup.sh) or to decode on the CPU instead.
const Functions& functions();
// The file functions() loaded (empty before, or when it failed).
std::string library_path();

// Whether decoding uses the GPU's JPEG engines (nvJPEG's hardware backend) where it has them:
// KILN_NVJPEG_HARDWARE=1. Off by default: with training on the same GPU, ResNet-50 fed by the engines stepped
// slower than fed by nvJPEG's default backend in every run measured on H100s (47.5 against 42.9 ms, 2026-12-06,
// bench/results/2026-12-06i; with 32 hardware queues, 47.0 against 40.8 ms, bench/results/2026-12-07b), though the
// engines decode twice as fast on an idle GPU.
bool hardware_engines_wanted();

}  // namespace kiln::data::nvjpeg
