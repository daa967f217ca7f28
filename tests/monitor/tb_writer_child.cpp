// tests/monitor/tb_writer_child.cpp — a training run's metrics, as the reference-reader test needs them
// (check_tensorboard.py runs it): MetricsLogger writes DIR/metrics.csv and DIR/tb/.
//
//   tb_writer_child DIR first     steps 0..9:  loss = 0.5 * step,   acc = step / 100
//   tb_writer_child DIR resume    resumed at step 5 (as from a checkpoint of 5 steps, counted from 0),
//                                 steps 5..12: loss = 100 + step,   acc = 1 - step / 100
#include <cstdio>
#include <exception>
#include <string>

#include "kiln/monitor/metrics.h"

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[2] : "";
  if (mode != "first" && mode != "resume") {
    std::fprintf(stderr, "usage: tb_writer_child DIR first|resume\n");
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    const bool resume = mode == "resume";
    kiln::monitor::MetricsLogger log({.csv = dir / "metrics.csv",
                                      .columns = {"step", "loss", "acc"},
                                      .tensorboard_dir = dir / "tb",
                                      .resume_step = resume ? 5 : -1});
    for (int64_t step = resume ? 5 : 0; step <= (resume ? 12 : 9); ++step) {
      const double s = static_cast<double>(step);
      log.log(step, {{"loss", resume ? 100 + s : 0.5 * s}, {"acc", resume ? 1 - s / 100 : s / 100}});
    }
    std::printf("%s: wrote %s\n", mode.c_str(), log.tensorboard()->path().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tb_writer_child: %s\n", e.what());
    return 1;
  }
}
