// bench/train_log.h — whether a benchmarked training run trained. A step time counts only if the steps behind it
// were real training, so bench_train logs the loss of every step (and, with a GradScaler, the loss scale after
// every step) on the device, without a host sync, and judges the run after the timing:
//
//   - every logged loss is finite;
//   - no step inside a timed block was skipped by the GradScaler (an inf/NaN gradient: the scale went down);
//   - the loss fell: the mean over the last `cycle` logged steps (one pass over the distinct batches, so every
//     batch counts once) is below the mean over the first `cycle` steps. Runs shorter than two cycles are not
//     judged on this point (bench_train --quick), and say so.
//
// bench/pytorch_train.py judges its runs by the same rules (judge_training there), and bench/train_table.py leaves
// out every run that failed them.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "json_text.h"

namespace kiln::bench {

struct TrainingVerdict {
  bool ok = true;
  std::string why;            // the first rule broken (empty when ok)
  double loss_first = NAN;    // mean loss over the first cycle of logged steps
  double loss_last = NAN;     // over the last cycle
  int64_t skipped_timed = 0;  // steps the GradScaler skipped inside the timed blocks
  int64_t skipped_total = 0;  // and over the whole run
  bool fall_checked = false;  // false when the run was shorter than two cycles
};

// `losses[i]`: step i's loss; `scales`: the loss scale after step i (empty without a GradScaler), `init_scale` the
// scale before step 0; `timed`: the [begin, end) step ranges that were timed.
inline TrainingVerdict judge_training(const std::vector<double>& losses, const std::vector<double>& scales,
                                      double init_scale, const std::vector<std::pair<int64_t, int64_t>>& timed,
                                      int64_t cycle) {
  TrainingVerdict v;
  auto fail = [&v](std::string why) {
    if (v.ok) v.why = std::move(why);
    v.ok = false;
  };
  const auto n = static_cast<int64_t>(losses.size());
  if (n == 0) fail("no step was logged");
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(losses[static_cast<size_t>(i)])) {
      fail("the loss of step " + std::to_string(i) + " is " + json_number(losses[static_cast<size_t>(i)], 4));
      break;
    }
  auto in_timed = [&timed](int64_t i) {
    for (const auto& [b, e] : timed)
      if (i >= b && i < e) return true;
    return false;
  };
  for (size_t i = 0; i < scales.size(); ++i) {
    const double before = i == 0 ? init_scale : scales[i - 1];
    if (scales[i] < before) {  // an overflow halves the scale: this step was skipped
      ++v.skipped_total;
      if (in_timed(static_cast<int64_t>(i))) ++v.skipped_timed;
    }
  }
  if (v.skipped_timed > 0)
    fail(std::to_string(v.skipped_timed) + " timed step(s) skipped by the GradScaler (inf/NaN gradients)");
  if (cycle >= 1 && n >= 2 * cycle) {
    double first = 0, last = 0;
    for (int64_t i = 0; i < cycle; ++i) {
      first += losses[static_cast<size_t>(i)];
      last += losses[static_cast<size_t>(n - cycle + i)];
    }
    v.loss_first = first / static_cast<double>(cycle);
    v.loss_last = last / static_cast<double>(cycle);
    v.fall_checked = true;
    if (!(v.loss_last < v.loss_first))
      fail("the loss did not fall: mean " + json_number(v.loss_last, 4) + " over the last " + std::to_string(cycle) +
           " steps, " + json_number(v.loss_first, 4) + " over the first " + std::to_string(cycle));
  }
  return v;
}

// The verdict and the log as JSON fields (", \"key\": value" pairs) for a bench line.
inline std::string training_fields(const TrainingVerdict& v, const std::vector<double>& losses, int64_t cycle) {
  std::string out = ", \"batches\": " + std::to_string(cycle) + ", \"trained\": " + (v.ok ? "true" : "false");
  if (!v.ok) out += ", \"failed\": \"" + json_escape(v.why) + "\"";
  out += ", \"loss_first\": " + json_number(v.loss_first, 4) + ", \"loss_last\": " + json_number(v.loss_last, 4);
  if (!v.fall_checked) out += ", \"fall_checked\": false";
  out += ", \"skipped_steps\": " + std::to_string(v.skipped_timed) +
         ", \"skipped_total\": " + std::to_string(v.skipped_total) + ", \"losses\": [";
  for (size_t i = 0; i < losses.size(); ++i) out += (i ? ", " : "") + json_number(losses[i], 4);
  return out + "]";
}

// The rules on made-up logs (bench_train --selftest; CTest runs it).
inline int training_selftest() {
  int failures = 0;
  auto expect = [&failures](bool cond, const char* what) {
    if (!cond) {
      std::fprintf(stderr, "train_log selftest: FAILED: %s\n", what);
      ++failures;
    }
  };
  const std::vector<std::pair<int64_t, int64_t>> timed = {{4, 8}};
  // Falling, finite, no scaler: ok; the cycle means are (5+4)/2 and (1+0.5)/2.
  TrainingVerdict v = judge_training({5, 4, 3, 3, 2, 2, 1, 0.5}, {}, 0, timed, 2);
  expect(v.ok && v.fall_checked && v.loss_first == 4.5 && v.loss_last == 0.75, "a falling loss passes");
  // Flat: fails, naming the means.
  v = judge_training({2, 2, 2, 2, 2, 2}, {}, 0, timed, 2);
  expect(!v.ok && v.why.find("did not fall") != std::string::npos, "a flat loss fails");
  // A NaN anywhere fails, naming the step.
  v = judge_training({5, 4, NAN, 3, 2, 1}, {}, 0, timed, 2);
  expect(!v.ok && v.why == "the loss of step 2 is NaN", "a NaN loss fails");
  v = judge_training({5, 4, 3, INFINITY, 2, 1}, {}, 0, timed, 2);
  expect(!v.ok && v.why == "the loss of step 3 is Infinity", "an infinite loss fails");
  // A scale halved inside the timed block: a skipped timed step. Halved before it: counted, not failed.
  v = judge_training({5, 4, 3, 3, 2, 2, 1, 0.5}, {8, 4, 4, 4, 4, 2, 2, 2}, 8, timed, 2);
  expect(!v.ok && v.skipped_timed == 1 && v.skipped_total == 2 && v.why.find("1 timed step") == 0,
         "a skipped timed step fails");
  v = judge_training({5, 4, 3, 3, 2, 2, 1, 0.5}, {4, 4, 8, 8, 8, 8, 16, 16}, 8, timed, 2);
  expect(v.ok && v.skipped_timed == 0 && v.skipped_total == 1, "a skip in the warm-up is counted only");
  // Shorter than two cycles: not judged on the fall.
  v = judge_training({3, 3, 3}, {}, 0, timed, 2);
  expect(v.ok && !v.fall_checked && std::isnan(v.loss_first), "a short run is not judged on the fall");
  v = judge_training({}, {}, 0, timed, 2);
  expect(!v.ok && v.why == "no step was logged", "an empty log fails");
  const std::string fields = training_fields(judge_training({2, 1}, {}, 0, {}, 1), {2, 1}, 1);
  expect(fields ==
             ", \"batches\": 1, \"trained\": true, \"loss_first\": 2.0000, \"loss_last\": 1.0000, "
             "\"skipped_steps\": 0, \"skipped_total\": 0, \"losses\": [2.0000, 1.0000]",
         "the JSON fields");
  std::printf("train_log selftest: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}

}  // namespace kiln::bench
