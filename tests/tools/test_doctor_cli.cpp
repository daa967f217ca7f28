// The real kiln-doctor, run as a user would: on this machine as it is, and with fake libraries put first on
// LD_LIBRARY_PATH to simulate a wrong cuDNN and a broken NCCL. The GPU case (CudaDoctor) runs every check
// and prints the report.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "kiln/monitor/nvml/nvml_library.h"  // built_with_header: the fake NVML is read only with nvml.h

namespace {

using ::testing::HasSubstr;

struct DoctorRun {
  int exit_code = -1;
  std::string output;
};

// Runs kiln-doctor with `args`, after the environment assignments in `env` ("A=b C=d"), stdout and stderr together.
DoctorRun run_doctor(const std::string& args, const std::string& env = "") {
  const std::string command = "env " + env + " '" KILN_DOCTOR_EXE "' " + args + " 2>&1";
  DoctorRun r;
  FILE* p = popen(command.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

nlohmann::json doctor_json(const std::string& args = "--skip-checks", const std::string& env = "") {
  const DoctorRun r = run_doctor("--json " + args, env);
  auto j = nlohmann::json::parse(r.output, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.output;
  if (!j.is_discarded()) {
    EXPECT_EQ(j["exit_code"], r.exit_code);
  }
  return j;
}

bool machine_has_gpu() {
  static const bool has = [] {
    const auto j = doctor_json();
    return !j.is_discarded() && !j["gpus"].empty();
  }();
  return has;
}

TEST(DoctorCli, HelpAndBadOptions) {
  DoctorRun r = run_doctor("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--require-gpu"));
  // Every option with its default and what it does.
  EXPECT_THAT(r.output, HasSubstr("--skip-checks"));
  EXPECT_THAT(r.output, HasSubstr("do not run the GPU checks, only look (default: run them)"));
  EXPECT_THAT(r.output, HasSubstr("--json"));
  EXPECT_THAT(r.output, HasSubstr("exit codes: 0"));
  r = run_doctor("--frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown option '--frobnicate'"));
  r = run_doctor("--json extra");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("unexpected argument 'extra'"));
  r = run_doctor("--json=maybe");  // a flag takes true/false at most
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--json"));
}

TEST(DoctorCli, ReportsTheMachineWithoutAGpu) {
  if (machine_has_gpu()) GTEST_SKIP() << "this machine has a GPU (CudaDoctor covers it)";
  const DoctorRun r = run_doctor("");
  std::cout << r.output;
  EXPECT_EQ(r.exit_code, 0) << "no GPU at all is not an error without --require-gpu";
  for (const char* part : {"System\n", "OS ", "glibc", "compiled by", "HDF5", "Eigen", "NVIDIA driver", "GPUs\n",
                           "none visible to CUDA", "Diagnosis\n", "no GPU visible", "kiln runs on the CPU"}) {
    EXPECT_THAT(r.output, HasSubstr(part));
  }
#if KILN_TEST_DOCTOR_CUDA
  for (const char* part : {"cuBLAS ", "cuBLASLt", "cuDNN ", "NCCL "}) EXPECT_THAT(r.output, HasSubstr(part));
#endif
}

TEST(DoctorCli, RequireGpuFailsWithoutAGpu) {
  if (machine_has_gpu()) GTEST_SKIP() << "this machine has a GPU";
  const DoctorRun r = run_doctor("--require-gpu --skip-checks");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("error: no GPU visible"));
  EXPECT_THAT(r.output, HasSubstr("fix: "));
}

TEST(DoctorCli, JsonHasEverySection) {
  const auto j = doctor_json();
  ASSERT_FALSE(j.is_discarded());
  for (const char* key : {"system", "build", "driver", "libraries", "gpus", "checks", "findings", "exit_code"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_FALSE(j["system"]["os"].get<std::string>().empty());
  EXPECT_FALSE(j["build"]["compiler"].get<std::string>().empty());
  EXPECT_EQ(j["build"]["cuda"].get<bool>(), KILN_TEST_DOCTOR_CUDA != 0);
  EXPECT_FALSE(j["findings"].empty());
  for (const auto& f : j["findings"]) {
    EXPECT_TRUE(f.contains("severity") && f.contains("code") && f.contains("problem") && f.contains("fix")) << f.dump();
  }
  if (!machine_has_gpu()) {
    EXPECT_FALSE(j["driver"]["libcuda_found"].get<bool>());
    EXPECT_EQ(j["findings"][0]["code"], "no-gpu");
  }
}

#if KILN_TEST_DOCTOR_CUDA
TEST(DoctorCli, CudnnOfTheWrongVersionFirstOnTheLibraryPath) {
  // libcudnn.so.9 that says it is 8.9.7, found before the real one.
  const DoctorRun r = run_doctor("--skip-checks", "LD_LIBRARY_PATH=" KILN_FAKE_CUDNN8_DIR);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("error: cuDNN 8.9.7 is loaded (from " KILN_FAKE_CUDNN8_DIR "/libcudnn.so.9)"));
  EXPECT_THAT(r.output, HasSubstr("fix: install cuDNN 9"));
  const auto j = doctor_json("--skip-checks", "LD_LIBRARY_PATH=" KILN_FAKE_CUDNN8_DIR);
  bool found = false;
  for (const auto& f : j["findings"]) found |= f["code"] == "library-wrong-version" && f["severity"] == "error";
  EXPECT_TRUE(found) << j["findings"].dump(2);
}

TEST(DoctorCli, NcclWithoutItsVersionFunction) {
  const DoctorRun r = run_doctor("", "LD_LIBRARY_PATH=" KILN_FAKE_NCCL_DIR);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("libnccl.so.2 has no ncclGetVersion()"));
  EXPECT_THAT(r.output, HasSubstr("fix: "));
  // The checks link NCCL: they are not attempted with a broken one.
  EXPECT_THAT(r.output, HasSubstr("not run: NCCL (libnccl.so.2) is not usable"));
}

// A fake driver first on LD_LIBRARY_PATH (tests/tools/fake/fake_libcuda.cpp): one "Fake GPU", whose driver
// version and compute capability the test chooses.
const std::string kFakeDriver = "LD_LIBRARY_PATH=" KILN_FAKE_DRIVER_DIR;

TEST(DoctorCli, FakeDriverOlderThanTheRuntime) {
  const DoctorRun r = run_doctor("", kFakeDriver + " FAKE_CUDA_DRIVER_VERSION=12040");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("supports CUDA up to 12.4, but kiln was built with the CUDA"));
  EXPECT_THAT(r.output, HasSubstr("fix: update the NVIDIA driver to"));
  EXPECT_THAT(r.output, HasSubstr("not run: the driver is too old for kiln's CUDA runtime"));
}

TEST(DoctorCli, FakeGpuTheBuildWasNotCompiledFor) {
  const DoctorRun r = run_doctor("--skip-checks", kFakeDriver + " FAKE_CUDA_CC=75");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cuda:0  Fake GPU  compute capability 7.5"));
  EXPECT_THAT(r.output, HasSubstr("error: cuda:0 (Fake GPU, compute capability 7.5) cannot run this build"));
  EXPECT_THAT(r.output, HasSubstr("fix: reconfigure with -DCMAKE_CUDA_ARCHITECTURES=75"));
}

TEST(DoctorCli, FakeCudaVisibleDevicesHidingTheGpus) {
  // Only NVML (or device files, which this machine may lack) tells that the hidden GPUs exist.
  if (!kiln::monitor::nvml::built_with_header()) GTEST_SKIP() << "built without nvml.h";
  const DoctorRun r = run_doctor("", kFakeDriver + " CUDA_VISIBLE_DEVICES=7");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(
      r.output,
      HasSubstr("error: CUDA_VISIBLE_DEVICES=\"7\" hides every GPU: CUDA sees none, while the machine has 2 (NVML)"));
  EXPECT_THAT(r.output, HasSubstr("fix: unset CUDA_VISIBLE_DEVICES"));
}

TEST(DoctorCli, FakeDriverTheRuntimeCannotUse) {
  // The probes pass (a driver with one GPU of compute capability 9.0), so the checks module is loaded from
  // beside kiln-doctor; the CUDA runtime in it then finds nothing usable in the fake libcuda.so.1.
  const DoctorRun r = run_doctor("", kFakeDriver);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("sees no GPU, while the driver"));
  EXPECT_THAT(r.output, HasSubstr("fix: reinstall the NVIDIA driver"));
  const auto j = doctor_json("", kFakeDriver);
  EXPECT_TRUE(j["checks"]["ran"].get<bool>()) << j["checks"].dump(2);
  EXPECT_THAT(j["checks"]["module_path"].get<std::string>(), HasSubstr("kiln-doctor-checks"));
  EXPECT_EQ(j["gpus"][0]["name"], "Fake GPU");
  if (kiln::monitor::nvml::built_with_header()) {
    EXPECT_EQ(j["driver"]["nvml_device_count"], 2);
  }
}
#endif

TEST(CudaDoctor, EveryCheckPassesOnThisGpu) {
  if (!machine_has_gpu()) GTEST_SKIP() << "no GPU visible";
  const DoctorRun r = run_doctor("--require-gpu");
  std::cout << r.output;  // the report, for the GPU run's log
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("FAILED")));
  const auto j = doctor_json("--require-gpu");
  ASSERT_TRUE(j["checks"]["ran"].get<bool>()) << j["checks"].dump(2);
  const int gpus = static_cast<int>(j["gpus"].size());
  EXPECT_EQ(j["checks"]["results"].size(), static_cast<size_t>(5 * gpus + 1));
  for (const auto& c : j["checks"]["results"]) {
    EXPECT_EQ(c["status"], "passed") << c.dump();
    if (c["unit"] == "GB/s" || c["unit"] == "TFLOP/s") {
      EXPECT_GT(c["value"].get<double>(), 0) << c.dump();
    }
  }
  for (const auto& g : j["gpus"]) {
    EXPECT_TRUE(g["nvml"].get<bool>()) << g.dump();  // nvml.h travels in third_party/
    EXPECT_GT(g["memory_bytes"].get<int64_t>(), 0);
  }
}

}  // namespace
