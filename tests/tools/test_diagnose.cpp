// The diagnosis layer on made-up facts: one test per failure kiln-doctor names, each asserting the finding,
// its fix and the exit code.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "diagnose.h"
#include "doctor_facts.h"
#include "report.h"

namespace kiln::doctor {
namespace {

using testing::cpu_only_machine;
using ::testing::HasSubstr;
using testing::healthy_gpu_machine;
using testing::lib;
using ::testing::Not;

// The only finding with `code`; fails the test when there is none or several.
Finding only(const std::vector<Finding>& findings, const std::string& code) {
  std::vector<Finding> hits;
  for (const auto& f : findings) {
    if (f.code == code) hits.push_back(f);
  }
  std::string all;
  for (const auto& f : findings) all += std::string(to_string(f.severity)) + " " + f.code + ": " + f.problem + "\n";
  EXPECT_EQ(hits.size(), 1u) << "findings:\n" << all;
  return hits.empty() ? Finding{} : hits.front();
}

TEST(Diagnose, HealthyGpuMachineIsFine) {
  const auto findings = diagnose(healthy_gpu_machine(), {});
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].code, "ok");
  EXPECT_EQ(findings[0].severity, Severity::Info);
  EXPECT_THAT(findings[0].problem, HasSubstr("1 GPU"));
  EXPECT_EQ(exit_code(findings), 0);
  EXPECT_EQ(exit_code(diagnose(healthy_gpu_machine(), {.require_gpu = true})), 0);
}

TEST(Diagnose, NoDriverAndNoGpuRunsOnTheCpu) {
  const auto findings = diagnose(cpu_only_machine(), {});
  const Finding f = only(findings, "no-gpu");
  EXPECT_EQ(f.severity, Severity::Info);
  EXPECT_THAT(f.problem, HasSubstr("no GPU visible"));
  EXPECT_THAT(f.problem, HasSubstr("kiln runs on the CPU"));
  EXPECT_EQ(exit_code(findings), 0);
}

TEST(Diagnose, NoGpuWithRequireGpuIsAnError) {
  const auto findings = diagnose(cpu_only_machine(), {.require_gpu = true});
  const Finding f = only(findings, "no-gpu");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("--require-gpu"));
  EXPECT_THAT(f.fix, HasSubstr("nvidia-smi"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, DeviceFilesButNoDriverLibraryIsAnError) {
  Facts facts = cpu_only_machine();
  facts.system.nvidia_device_files = {"/dev/nvidia0", "/dev/nvidiactl"};
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "driver-library-missing");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("/dev/nvidia0"));
  EXPECT_THAT(f.problem, HasSubstr("libcuda.so.1"));
  EXPECT_THAT(f.fix, HasSubstr("--gpus all"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, CudaVisibleDevicesHidingEveryGpu) {
  Facts facts = healthy_gpu_machine();
  facts.system.cuda_visible_devices = "7";
  facts.driver.init_result = 100;  // CUDA_ERROR_NO_DEVICE
  facts.driver.init_error = "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected";
  facts.driver.device_count = 0;
  facts.driver.nvml_device_count = 2;
  facts.gpus.clear();
  facts.checks = {};
  facts.checks.requested = true;
  facts.checks.skipped_reason = "no GPU is visible to CUDA";
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "cuda-visible-devices");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("CUDA_VISIBLE_DEVICES=\"7\" hides every GPU"));
  EXPECT_THAT(f.problem, HasSubstr("2 (NVML)"));
  EXPECT_THAT(f.fix, HasSubstr("unset CUDA_VISIBLE_DEVICES"));
  EXPECT_THAT(f.fix, HasSubstr("0..1"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, DriverLoadedButNoDeviceVisible) {
  Facts facts = healthy_gpu_machine();
  facts.driver.init_result = 100;
  facts.driver.init_error = "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected";
  facts.driver.device_count = 0;
  facts.driver.nvml_ok = false;
  facts.driver.nvml_device_count = 0;
  facts.gpus.clear();
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "no-device");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("CUDA sees none"));
  EXPECT_THAT(f.problem, HasSubstr("CUDA_ERROR_NO_DEVICE"));
  EXPECT_THAT(f.fix, HasSubstr("nvidia-smi"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, DriverOlderThanTheRuntimeNeeds) {
  Facts facts = healthy_gpu_machine();
  facts.driver.cuda_version = 12040;  // a 550 driver: CUDA 12.4 at most
  facts.driver.driver_version = "550.54.15";
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "driver-too-old");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("550.54.15 supports CUDA up to 12.4"));
  EXPECT_THAT(f.problem, HasSubstr("CUDA 13.0 runtime"));
  EXPECT_THAT(f.fix, HasSubstr("580.65.06 or newer"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, DriverOlderMinorVersionOnlyWarns) {
  Facts facts = healthy_gpu_machine();
  facts.build.cudart_version = 13010;
  const auto findings = diagnose(facts, {});
  EXPECT_EQ(only(findings, "driver-older-minor").severity, Severity::Warning);
  EXPECT_EQ(exit_code(findings), 0);
}

TEST(Diagnose, LibraryMissing) {
  Facts facts = healthy_gpu_machine();
  LibraryFacts& cudnn = lib(facts, "cuDNN");
  cudnn.found = false;
  cudnn.path.clear();
  cudnn.has_version_function = false;
  cudnn.major = cudnn.minor = cudnn.patch = -1;
  cudnn.load_error = "libcudnn.so.9: cannot open shared object file: No such file or directory";
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "library-missing");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("cuDNN (libcudnn.so.9) is not found"));
  EXPECT_THAT(f.problem, HasSubstr("fails to start"));
  EXPECT_THAT(f.fix, HasSubstr("libcudnn9"));
  EXPECT_THAT(f.fix, HasSubstr("LD_LIBRARY_PATH"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, LibraryOfTheWrongMajorVersion) {
  Facts facts = healthy_gpu_machine();
  LibraryFacts& cudnn = lib(facts, "cuDNN");
  cudnn.major = 8;
  cudnn.minor = 9;
  cudnn.patch = 7;
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "library-wrong-version");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("cuDNN 8.9.7 is loaded"));
  EXPECT_THAT(f.problem, HasSubstr("built against cuDNN 9.14.0"));
  EXPECT_THAT(f.fix, HasSubstr("install cuDNN 9"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, LibraryWithoutItsVersionFunction) {
  Facts facts = healthy_gpu_machine();
  LibraryFacts& nccl = lib(facts, "NCCL");
  nccl.has_version_function = false;
  nccl.major = nccl.minor = nccl.patch = -1;
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "library-no-version");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("has no ncclGetVersion()"));
  EXPECT_THAT(f.fix, HasSubstr("NCCL 2"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, OlderMinorLibraryOnlyWarns) {
  Facts facts = healthy_gpu_machine();
  lib(facts, "cuDNN").minor = 2;
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "library-older");
  EXPECT_EQ(f.severity, Severity::Warning);
  EXPECT_THAT(f.problem, HasSubstr("cuDNN 9.2.0"));
  EXPECT_EQ(exit_code(findings), 0);
}

TEST(Diagnose, GpuTheBuildWasNotCompiledFor) {
  Facts facts = healthy_gpu_machine();
  facts.gpus[0].name = "NVIDIA A100-SXM4-80GB";
  facts.gpus[0].cc_major = 8;
  facts.gpus[0].cc_minor = 0;
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "gpu-not-compiled-for");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("compute capability 8.0"));
  EXPECT_THAT(f.problem, HasSubstr("CMAKE_CUDA_ARCHITECTURES=90"));
  EXPECT_THAT(f.fix, HasSubstr("-DCMAKE_CUDA_ARCHITECTURES=80"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, NewerGpuRunsThroughPtxOnly) {
  Facts facts = healthy_gpu_machine();
  facts.gpus[0].cc_major = 10;
  facts.gpus[0].cc_minor = 0;
  auto findings = diagnose(facts, {});
  EXPECT_EQ(only(findings, "gpu-ptx-only").severity, Severity::Warning);
  EXPECT_EQ(exit_code(findings), 0);
  facts.build.cuda_architectures = "90-real";  // no PTX: nothing runs on 10.0
  findings = diagnose(facts, {});
  EXPECT_EQ(only(findings, "gpu-not-compiled-for").severity, Severity::Error);
}

TEST(Diagnose, ArchitectureRules) {
  bool ptx = true;
  EXPECT_TRUE(architectures_run_on("90", 9, 0, &ptx));
  EXPECT_FALSE(ptx);
  EXPECT_TRUE(architectures_run_on("80", 8, 6, &ptx));  // sm_80 SASS runs on 8.x, x >= 0
  EXPECT_FALSE(ptx);
  EXPECT_FALSE(architectures_run_on("86", 8, 0, &ptx));  // but not on an older minor
  EXPECT_TRUE(architectures_run_on("90", 12, 0, &ptx));  // PTX is compiled by the driver for later GPUs
  EXPECT_TRUE(ptx);
  EXPECT_FALSE(architectures_run_on("90a", 10, 0, &ptx));  // arch-specific: 9.0 only
  EXPECT_TRUE(architectures_run_on("90a", 9, 0, &ptx));
  EXPECT_TRUE(architectures_run_on("90-virtual", 9, 0, &ptx));
  EXPECT_TRUE(ptx);
  EXPECT_TRUE(architectures_run_on("80,90-real", 9, 0, &ptx));
  EXPECT_FALSE(ptx);
  EXPECT_FALSE(architectures_run_on("70-real;75-real", 8, 0, &ptx));
  EXPECT_TRUE(architectures_run_on("native", 7, 5, &ptx));  // decided by CMake: not judged
  EXPECT_EQ(minimum_driver_for_cuda(13), "580.65.06");
  EXPECT_EQ(cuda_version_string(12040), "12.4");
}

TEST(Diagnose, BuildWithoutCudaOnAMachineWithAGpu) {
  Facts facts = healthy_gpu_machine();
  facts.build.cuda = false;
  facts.libraries.clear();  // a CPU build probes none of the CUDA libraries
  facts.checks = {};
  facts.checks.requested = true;
  facts.checks.skipped_reason = "this kiln was built without CUDA";
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "build-without-cuda");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("built without CUDA"));
  EXPECT_THAT(f.fix, HasSubstr("-DKILN_CUDA=ON"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, BuildWithoutCudaOnACpuMachineIsFine) {
  Facts facts = cpu_only_machine();
  facts.build.cuda = false;
  facts.libraries.clear();
  const auto findings = diagnose(facts, {});
  EXPECT_EQ(only(findings, "no-gpu").severity, Severity::Info);
  EXPECT_EQ(exit_code(findings), 0);
  EXPECT_EQ(exit_code(diagnose(facts, {.require_gpu = true})), 1);
}

TEST(Diagnose, FailedCheckNamesTheGpuAndTheFix) {
  Facts facts = healthy_gpu_machine();
  facts.checks.results[0].status = CheckStatus::Failed;
  facts.checks.results[0].error = "mul: CUDA error cudaErrorNoKernelImageForDevice (no kernel image is available)";
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "check-failed");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("kernel launch on cuda:0 failed"));
  EXPECT_THAT(f.fix, HasSubstr("CMAKE_CUDA_ARCHITECTURES"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, ChecksModuleThatDoesNotLoadNamesTheLibrary) {
  Facts facts = healthy_gpu_machine();
  facts.checks.ran = false;
  facts.checks.results.clear();
  facts.checks.module_path = "/opt/kiln/lib/kiln/kiln-doctor-checks.so";
  facts.checks.load_error = "libcudnn_graph.so.9: cannot open shared object file: No such file or directory";
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "checks-module-load");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("libcudnn_graph.so.9"));
  EXPECT_THAT(f.fix, HasSubstr("LD_LIBRARY_PATH"));
  EXPECT_EQ(exit_code(findings), 1);
}

TEST(Diagnose, NoNvmlOnAGpuMachineWarns) {
  Facts facts = healthy_gpu_machine();
  facts.driver.nvml_ok = false;
  facts.driver.nvml_error = "kiln was built without nvml.h (PyPI's nvidia-nvml-dev): run scripts/setup.sh and rebuild";
  facts.build.nvml_header = false;
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "nvml-unavailable");
  EXPECT_EQ(f.severity, Severity::Warning);
  EXPECT_THAT(f.fix, HasSubstr("scripts/setup.sh"));
  EXPECT_EQ(exit_code(findings), 0);
}

TEST(Diagnose, CudaThatDoesNotStart) {
  Facts facts = healthy_gpu_machine();
  facts.driver.init_result = 999;
  facts.driver.init_error = "CUDA_ERROR_UNKNOWN: unknown error";
  facts.driver.device_count = 0;
  facts.gpus.clear();
  const auto findings = diagnose(facts, {});
  const Finding f = only(findings, "cuda-init-failed");
  EXPECT_EQ(f.severity, Severity::Error);
  EXPECT_THAT(f.problem, HasSubstr("CUDA_ERROR_UNKNOWN"));
  EXPECT_THAT(f.fix, HasSubstr("reboot"));
}

TEST(DoctorReport, TextHasEverySectionAndEachFix) {
  Facts facts = healthy_gpu_machine();
  lib(facts, "cuDNN").major = 8;
  const auto findings = diagnose(facts, {});
  const std::string text = text_report(facts, findings, exit_code(findings));
  for (const char* section : {"System", "Build", "Driver and libraries", "GPUs", "Checks", "Diagnosis"}) {
    EXPECT_THAT(text, HasSubstr(std::string("\n") + section + "\n"));
  }
  EXPECT_THAT(text, HasSubstr("cuda:0  NVIDIA H200  compute capability 9.0"));
  EXPECT_THAT(text, HasSubstr("error: cuDNN 8.14.0 is loaded"));
  EXPECT_THAT(text, HasSubstr("    fix: install cuDNN 9"));
  EXPECT_THAT(text, HasSubstr("exit code 1"));
  EXPECT_THAT(text, Not(HasSubstr("OK: ")));
}

TEST(DoctorReport, JsonIsOneDocumentWithTheFindings) {
  const Facts facts = healthy_gpu_machine();
  const auto findings = diagnose(facts, {});
  const auto j = nlohmann::json::parse(json_report(facts, findings, 0));
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["gpus"][0]["compute_capability"], "9.0");
  EXPECT_EQ(j["findings"][0]["code"], "ok");
  EXPECT_EQ(j["libraries"].size(), 4u);
}

}  // namespace
}  // namespace kiln::doctor
