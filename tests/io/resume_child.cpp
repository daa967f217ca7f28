// tests/io/resume_child.cpp — the second half of test_resume's run, in a fresh process:
//   resume_child <checkpoint> <steps> <output file> [no-generators] [cuda]
// builds the run with another seed (CudaResumeRun on cuda:0 in deterministic mode with `cuda`, else the CPU
// ResumeRun), loads the checkpoint (everything, or all but the generators), trains <steps> more steps and
// writes the fingerprint (losses and parameters' bytes) to <output file>.
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "io/resume_training.h"

namespace {

template <typename Run>
int resume(char** argv, bool generators) {
  Run run(/*seed=*/987654);
  kiln::io::CheckpointParts parts = run.parts();
  parts.generators = generators;
  kiln::io::load_checkpoint(argv[1], parts);
  std::vector<float> losses;
  run.train(std::stoi(argv[2]), losses);
  std::ofstream out(argv[3], std::ios::binary);
  out << run.fingerprint(losses);
  return out.good() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: resume_child <checkpoint> <steps> <output file> [no-generators] [cuda]\n");
    return 2;
  }
  bool generators = true, cuda = false;
  for (int i = 4; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "no-generators") {
      generators = false;
    } else if (arg == "cuda") {
      cuda = true;
    } else if (!arg.empty()) {
      std::fprintf(stderr, "resume_child: unknown argument '%s' (expected no-generators or cuda)\n", argv[i]);
      return 2;
    }
  }
  try {
    return cuda ? resume<kiln::testing::CudaResumeRun>(argv, generators)
                : resume<kiln::testing::ResumeRun>(argv, generators);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resume_child: %s\n", e.what());
    return 1;
  }
}
