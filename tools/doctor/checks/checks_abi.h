// tools/doctor/checks/checks_abi.h — the one function kiln-doctor calls in the kiln-doctor-checks module.
//
//   void* m = dlopen(".../kiln-doctor-checks.so", RTLD_NOW);        // fails naming a missing library
//   auto run = (KilnDoctorRunChecks)dlsym(m, kKilnDoctorRunChecks);
//   std::string report = run(0);                                    // JSON, owned by the module
//
// A C name and a JSON answer keep the two sides independent of each other's C++ types.
#pragma once

// Runs every check on every visible GPU and returns
//   {"runtime_version": 13000, "driver_version": 13000, "device_error": "cudaErrorInsufficientDriver (...)",
//    "results": [{"name": ..., "device": 0, "status": "passed"|"failed"|"skipped", "detail": ...,
//                 "value": 25.1, "unit": "GB/s", "error": ...}, ...]}
// The text stays valid until the next call. flags: 0 (reserved).
extern "C" const char* kiln_doctor_run_checks(int flags);
using KilnDoctorRunChecks = const char* (*)(int);
inline constexpr const char* kKilnDoctorRunChecks = "kiln_doctor_run_checks";
