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

// Which kinds of trace range enable_nvtx turns into NVTX ranges.
struct NvtxOptions {
  bool steps = true;     // trace::Kind::Step (mark_step) ranges
  bool modules = true;   // trace::Kind::Module ranges (Module calls)
  bool backward = true;  // trace::Kind::Backward ranges (autograd nodes)
  bool ops = true;       // trace::Kind::Op ranges (every op: the most numerous)
  bool user = true;      // trace::Kind::User ranges
};

void enable_nvtx(NvtxOptions options = {});  // again: replaces the options
void disable_nvtx();                         // stops emitting NVTX ranges; nothing happens when none are on
bool nvtx_enabled();                         // enable_nvtx is in effect
bool nvtx_compiled();                        // built with the NVTX headers (every CUDA build)

}  // namespace kiln::profiler
