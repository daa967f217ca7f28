// tests/io/resume_child.cpp — the second half of test_resume's run, in a fresh process:
//   resume_child <checkpoint> <steps> <output file> [no-generators]
// builds the run with another seed, loads the checkpoint (everything, or all but the generators), trains
// <steps> more steps and writes the fingerprint (losses and parameters' bytes) to <output file>.
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "io/resume_training.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: resume_child <checkpoint> <steps> <output file> [no-generators]\n");
    return 2;
  }
  try {
    kiln::testing::ResumeRun run(/*seed=*/987654);
    kiln::io::CheckpointParts parts = run.parts();
    if (argc > 4 && std::string(argv[4]) == "no-generators") parts.generators = false;
    kiln::io::load_checkpoint(argv[1], parts);
    std::vector<float> losses;
    run.train(std::stoi(argv[2]), losses);
    std::ofstream out(argv[3], std::ios::binary);
    out << run.fingerprint(losses);
    return out.good() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resume_child: %s\n", e.what());
    return 1;
  }
}
