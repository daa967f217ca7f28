// kiln/monitor/metrics_logger.cpp — MetricsLogger: a step's scalars to the CSV file and to TensorBoard.
#include "kiln/monitor/metrics.h"
#include "kiln/tensor/error.h"  // KILN_CHECK

namespace kiln::monitor {

MetricsLogger::MetricsLogger(MetricsOptions options) : options_(std::move(options)) {
  if (!options_.enabled) return;
  if (options_.tensorboard) {
    tensorboard_ = options_.tensorboard;
  } else if (!options_.tensorboard_dir.empty()) {
    tensorboard_ = std::make_shared<TensorBoardWriter>(
        options_.tensorboard_dir,
        TensorBoardOptions{.resume_step = options_.resume_step, .flush_seconds = options_.flush_seconds});
  }
  if (!options_.csv.empty() && !options_.columns.empty()) open_csv(options_.columns);
}

MetricsLogger::~MetricsLogger() = default;
MetricsLogger::MetricsLogger(MetricsLogger&&) noexcept = default;
MetricsLogger& MetricsLogger::operator=(MetricsLogger&&) noexcept = default;

void MetricsLogger::open_csv(std::vector<std::string> columns) {
  bool has_step = false;
  for (const auto& c : columns) has_step = has_step || c == "step";
  KILN_CHECK(has_step, "MetricsLogger(", options_.csv.string(), "): the columns ", columns,
             " need a \"step\" column, which log(step, ...) fills");
  csv_ = std::make_unique<CsvLogger>(options_.csv, std::move(columns),
                                     CsvOptions{.resume_step = options_.resume_step, .step_column = "step"});
}

void MetricsLogger::log(int64_t step, const Scalars& values) {
  if (!options_.enabled) return;
  for (const auto& [name, v] : values)
    KILN_CHECK(name != "step", "MetricsLogger::log: the step is log's first argument, not a value named \"step\"");
  if (!options_.csv.empty()) {
    if (!csv_) {
      std::vector<std::string> columns{"step"};
      for (const auto& [name, v] : values) columns.push_back(name);
      open_csv(std::move(columns));
    }
    Scalars row;
    row.reserve(values.size() + 1);
    row.emplace_back("step", static_cast<double>(step));
    row.insert(row.end(), values.begin(), values.end());
    csv_->named_row(row);
  }
  if (tensorboard_) {
    Scalars tagged;
    tagged.reserve(values.size());
    for (const auto& [name, v] : values) tagged.emplace_back(options_.tag_prefix + name, v);
    tensorboard_->add_scalars(step, tagged);
  }
}

void MetricsLogger::flush() {
  if (tensorboard_) tensorboard_->flush();
}

}  // namespace kiln::monitor
