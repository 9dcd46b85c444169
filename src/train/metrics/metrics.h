// metrics.h — the training metrics log of `hp-train` and its loss plot.
//
// Rank 0 appends one JSON object per optimizer step to <folder>/metrics.jsonl,
// e.g. {"step":12,"loss":7.81,"lr":3e-4,"tokens_per_s":41200,"peak_memory_mb":812,
// "grad_norm":1.9} plus "val_loss" on evaluation steps. JSON lines because the
// file stays valid after a crash or a resume (append only) and every tool
// (jq, pandas.read_json(lines=True)) reads it. plot_loss_curve renders it to a
// PNG with gnuplot.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

namespace hyper_parallel::train {

// Appends records to <folder>/metrics.jsonl (the folder is created). An existing
// file is first cut to what the run continues from: a torn last line (the writer
// was killed mid-line) is always dropped; with resume_step >= 0, so is every record
// from a step after it (logged after the checkpoint, they are logged again), so
// resume_step 0 (a fresh run) starts an empty file. resume_step -1 keeps every
// whole line. Each line is written whole or not at all (one write, cut back on a
// short write) and fsync'ed, so a crash or a full disk never leaves half a line.
// Only rank 0 should construct one (the caller decides).
class MetricsLogger {
 public:
  explicit MetricsLogger(const std::string& folder, int64_t resume_step = -1);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Writes `record` (a JSON object; std::invalid_argument otherwise) as one
  // line. Non-finite numbers (anywhere in it) are written as the strings "NaN",
  // "Infinity" and "-Infinity", as JSON has no such numbers (null would read as missing).
  // Throws std::runtime_error naming the file and the OS reason when the write
  // fails; the file then ends with the previous whole line.
  void log(const nlohmann::json& record);

  const std::string& path() const { return path_; }
  // Records the constructor cut from an existing file (a torn line counts as one).
  int64_t dropped_records() const { return dropped_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t dropped_ = 0;
};

// Every record of a metrics file, in order; blank lines are skipped. A last
// line cut short (the writer was killed mid-line) is ignored; any other line
// that is not a JSON object throws std::runtime_error naming the file and line,
// as does a missing file.
std::vector<nlohmann::json> read_metrics(const std::string& jsonl_path);

// Renders "loss" (line) and, when present, "val_loss" (points) against "step"
// to `png_path` with gnuplot (pngcairo terminal when available, png otherwise),
// with a title, axis labels and a legend. Steps whose loss is not finite ("NaN",
// "Infinity", or null) are drawn as dashed vertical lines ("non-finite loss"). The PNG appears atomically. Returns
// false and sets *error (when given) instead of throwing when gnuplot is not
// installed, the metrics cannot be read, hold no loss, or gnuplot fails:
// a missing plot must never fail a training run.
bool plot_loss_curve(const std::string& jsonl_path, const std::string& png_path, std::string* error = nullptr);

}  // namespace hyper_parallel::train
