// The training run's metrics: one row per step, written as a CSV table and as an SVG loss curve
// (train and validation), both rewritten atomically as the run goes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tapegrad::examples {

struct MetricsRow {
  std::int64_t step = 0;             // steps completed (0: before training)
  std::optional<double> train_loss;  // the loss of this step's batch
  std::optional<double> val_loss;    // when the validation loss was measured after this step
  double lr = 0;                     // the lr this step used
  double tokens_per_s = 0;           // this step's training throughput
  double wall_s = 0;                 // seconds since the run began (across resumes)
};

class MetricsLog {
 public:
  MetricsLog(std::string csv_path, std::string svg_path, std::string title);

  /// Keeps the rows of an earlier run's CSV up to and including step (a resumed run continues
  /// its curve). Returns false, keeping nothing, when the file is missing or not ours.
  bool load_until(std::int64_t step);

  void add(const MetricsRow& row) { rows_.push_back(row); }
  /// Sets the validation loss of the row of step, adding a row when there is none.
  void set_val_loss(std::int64_t step, double loss, double wall_s);
  const std::vector<MetricsRow>& rows() const { return rows_; }
  /// The wall time of the last row (0 when empty).
  double last_wall_s() const { return rows_.empty() ? 0.0 : rows_.back().wall_s; }

  /// Rewrites both files atomically.
  void write() const;

  const std::string& csv_path() const { return csv_path_; }
  const std::string& svg_path() const { return svg_path_; }

 private:
  std::string csv_path_, svg_path_, title_;
  std::vector<MetricsRow> rows_;
};

/// "step,train_loss,val_loss,lr,tokens_per_s,wall_s" and one line per row (empty when absent).
std::string metrics_csv(const std::vector<MetricsRow>& rows);
/// A self-contained SVG: train loss (thin line) and validation loss (line with points) against
/// the step, with labelled axes, ticks, a legend and a title.
std::string loss_curve_svg(const std::vector<MetricsRow>& rows, const std::string& title);

}  // namespace tapegrad::examples
