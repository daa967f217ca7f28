// kiln-doctor: what is this machine, what was kiln built with, does the GPU path work, and if not, why and
// what to do. See tools/doctor/README.md.
#include <CLI/CLI.hpp>  // the options and --help
#include <iostream>

#include "diagnose.h"
#include "gather.h"
#include "report.h"

int main(int argc, char** argv) {
  bool json = false, skip_checks = false, require_gpu = false;
  CLI::App app(
      "Reports the OS, the build, the NVIDIA driver and libraries, the GPUs, runs small checks on each GPU (a kernel\n"
      "launch, copies each way, a cuBLAS GEMM, a cuDNN convolution, an NCCL all-reduce), and diagnoses what is wrong,\n"
      "with the fix.",
      "kiln-doctor");
  app.set_help_flag("-h,--help", "this text");
  app.add_flag("--json", json, "one JSON document instead of the text report (default: the text report)");
  app.add_flag("--skip-checks", skip_checks, "do not run the GPU checks, only look (default: run them)");
  app.add_flag("--require-gpu", require_gpu,
               "no usable GPU is an error (exit 1); without it a machine with no GPU at all is fine (default: off)");
  app.footer("exit codes: 0 nothing is broken (warnings allowed), 1 something kiln needs is broken, 2 bad arguments");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ExtrasError&) {
    const std::string first = app.remaining().front();
    std::cerr << "kiln-doctor: " << (first.rfind('-', 0) == 0 ? "unknown option '" : "unexpected argument '") << first
              << "' (run kiln-doctor --help for the options)\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    std::cerr << "kiln-doctor: " << e.what() << " (run kiln-doctor --help for the options)\n";
    return 2;
  }
  using namespace kiln::doctor;
  const Facts facts = gather_facts({.run_checks = !skip_checks});
  const auto findings = diagnose(facts, {.require_gpu = require_gpu});
  const int code = exit_code(findings);
  std::cout << (json ? json_report(facts, findings, code) : text_report(facts, findings, code)) << std::flush;
  return code;
}
