// tools/doctor/gather.h — finding out the facts (facts.h): the system, the build, the libraries by dlopen,
// the driver and GPUs through libcuda.so.1 and NVML, and the GPU checks in their own module.
//
//   doctor::Facts facts = doctor::gather_facts({.run_checks = !skip_checks});
//
// Nothing here links CUDA, cuBLAS, cuDNN or NCCL: each is opened by soname at run time, so kiln-doctor
// starts and reports on a machine where any of them is missing or broken.
#pragma once

#include "facts.h"

namespace kiln::doctor {

struct GatherOptions {
  bool run_checks = true;  // load the checks module and run the GPU checks when the probes allow it
};

Facts gather_facts(const GatherOptions& options);

SystemFacts gather_system();
BuildFacts build_facts();                                            // build_info.cpp
std::vector<LibraryFacts> probe_libraries(const BuildFacts& build);  // probe_libraries.cpp
void gather_driver(Facts* facts);                                    // probe_driver.cpp: fills driver and gpus
// Why the checks cannot run given these facts (a library missing, no GPU), or "" when they can.
std::string checks_blocked_reason(const Facts& facts);
ChecksFacts run_checks(const Facts& facts);  // checks_runner.cpp: loads kiln-doctor-checks and runs it

// The file a dlopen handle was loaded from.
std::string loaded_path(void* handle);

}  // namespace kiln::doctor
