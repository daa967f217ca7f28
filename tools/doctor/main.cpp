// kiln-doctor: what is this machine, what was kiln built with, does the GPU path work, and if not, why and
// what to do. See tools/doctor/README.md.
#include <cstring>
#include <iostream>

#include "diagnose.h"
#include "gather.h"
#include "report.h"

namespace {

constexpr const char* kUsage = R"(usage: kiln-doctor [--json] [--skip-checks] [--require-gpu]

Reports the OS, the build, the NVIDIA driver and libraries, the GPUs, runs small checks on each GPU (a kernel
launch, copies each way, a cuBLAS GEMM, a cuDNN convolution, an NCCL all-reduce), and diagnoses what is wrong,
with the fix.

  --json          one JSON document instead of the text report
  --skip-checks   do not run the GPU checks (only look)
  --require-gpu   no usable GPU is an error (exit 1); without it a machine with no GPU at all is fine
  -h, --help      this text

exit codes: 0 nothing is broken (warnings allowed), 1 something kiln needs is broken, 2 bad arguments
)";

}  // namespace

int main(int argc, char** argv) {
  bool json = false, skip_checks = false, require_gpu = false;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (!std::strcmp(a, "--json")) {
      json = true;
    } else if (!std::strcmp(a, "--skip-checks")) {
      skip_checks = true;
    } else if (!std::strcmp(a, "--require-gpu")) {
      require_gpu = true;
    } else if (!std::strcmp(a, "-h") || !std::strcmp(a, "--help")) {
      std::cout << kUsage;
      return 0;
    } else {
      std::cerr << "kiln-doctor: unknown option '" << a << "'\n" << kUsage;
      return 2;
    }
  }
  using namespace kiln::doctor;
  const Facts facts = gather_facts({.run_checks = !skip_checks});
  const auto findings = diagnose(facts, {.require_gpu = require_gpu});
  const int code = exit_code(findings);
  std::cout << (json ? json_report(facts, findings, code) : text_report(facts, findings, code)) << std::flush;
  return code;
}
