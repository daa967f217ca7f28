// tools/doctor/diagnose.h — from facts to findings: what is wrong, how bad, and the fix in one sentence.
//
//   auto findings = doctor::diagnose(facts, {.require_gpu = true});
//   for (const auto& f : findings) std::cout << to_string(f.severity) << ": " << f.problem << "\n  fix: " << f.fix;
//   return doctor::exit_code(findings);  // 1 when any finding is an error
//
// Pure functions of their arguments (no probing here), so each failure is tested with made-up facts.
//
// Severity policy:
//   Error    kiln cannot do what this machine or build is meant for: a library a kiln program links is
//            missing or of another major version; the driver is older than the CUDA runtime needs; a GPU
//            the build has no code for; a failed check; a GPU that should be there (device files, the
//            kernel module, CUDA_VISIBLE_DEVICES set) but cannot be used; a build without CUDA on a
//            machine with a GPU; and, with --require-gpu, no usable GPU at all.
//   Warning  works, but not as well as it could: an older minor version than kiln was built against,
//            GPU code only as PTX (compiled at first start), no NVML (no GPU monitoring).
//   Info     facts worth saying: no GPU at all (kiln runs on the CPU), everything in order.
#pragma once

#include <string>
#include <vector>

#include "facts.h"

namespace kiln::doctor {

enum class Severity { Info, Warning, Error };
const char* to_string(Severity s);  // "info", "warning", "error"

struct Finding {
  Severity severity = Severity::Info;
  std::string code;     // stable, for scripts: "no-driver", "driver-too-old", "library-missing", ...
  std::string problem;  // what is wrong, with the numbers
  std::string fix;      // what to do, one sentence; empty for information
};

struct DiagnoseOptions {
  bool require_gpu = false;  // no usable GPU is an error
};

std::vector<Finding> diagnose(const Facts& facts, const DiagnoseOptions& options);

// 1 when any finding is an error, else 0.
int exit_code(const std::vector<Finding>& findings);

// Whether code built for CMAKE_CUDA_ARCHITECTURES `architectures` runs on a GPU of compute capability
// major.minor: "native" SASS (cubins), or only by JIT-compiling PTX at start-up (*through_ptx = true).
// Unknown lists ("native", "all") are taken to run.
bool architectures_run_on(const std::string& architectures, int major, int minor, bool* through_ptx);

// The oldest Linux driver a CUDA major version needs (CUDA 13: 580), as "580.65.06"; "" if not known.
std::string minimum_driver_for_cuda(int cuda_major);

// 13000 -> "13.0"; 0 -> "unknown".
std::string cuda_version_string(int version);

}  // namespace kiln::doctor
