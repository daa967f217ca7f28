// kiln/profiler/nvtx.h — NVTX ranges for Nsight Systems: each step, module, backward node and op of kiln
// shows on nsys's timeline under the domain "kiln".
//
//   profiler::enable_nvtx({.ops = false});   // steps, modules and backward nodes only
//   for (...) { kiln::trace::mark_step(step); train_step(); }
//   // nsys profile --trace=cuda,nvtx ./train ...
//
// NVTX costs almost nothing when no tool is attached (the calls return at once). Built without CUDA,
// enable_nvtx throws a kiln::Error that says so.
#pragma once

namespace kiln::profiler {

struct NvtxOptions {
  bool steps = true;
  bool modules = true;
  bool backward = true;
  bool ops = true;
  bool user = true;  // trace::Kind::User ranges
};

void enable_nvtx(NvtxOptions options = {});  // again: replaces the options
void disable_nvtx();
bool nvtx_enabled();
bool nvtx_compiled();  // built with the NVTX headers (every CUDA build)

}  // namespace kiln::profiler
