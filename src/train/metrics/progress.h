// progress.h — the live progress line of `hp-train` and the numbers it shows.
//
//   step  12/60 | loss 7.8123 | 41.2k tok/s | 0.0523 TFLOPs | MFU 21.3% | peak 812 MiB | ETA 0:48
//
// On a terminal the line is redrawn in place with '\r'; elsewhere (a log file,
// or under hp-run, which prefixes every line with its rank) each update is a
// line of its own, since '\r' would garble both.
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

#include "train/metrics/step_metrics.h"

namespace hyper_parallel::train {

// Peak resident memory of this process in MiB: VmHWM from /proc/self/status,
// falling back to getrusage's ru_maxrss; 0 when neither is available.
double peak_memory_mib();

// "0:48", "12:03", "1:02:03": M:SS below an hour, H:MM:SS from there, rounded
// to the second; "--:--" for a negative or non-finite duration (unknown ETA).
std::string format_duration(double seconds);

// True when `out` is std::cout (std::cerr/std::clog) and stdout (stderr) is a
// terminal: the usual way to pick ProgressLine's `interactive`.
bool is_terminal(const std::ostream& out);

class ProgressLine {
 public:
  // Construct right before the first step: the ETA is extrapolated from the
  // time since construction over the steps completed since then (so it also
  // holds for a resumed run that starts at step k).
  ProgressLine(int64_t total_steps, std::ostream& out, bool interactive);
  ~ProgressLine();  // calls finish()
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Shows step `step` (1-based: step == total_steps is the last) as completed.
  void update(int64_t step, double loss, const StepRates& rates, double peak_mib);

  // Ends the in-place line with a newline (interactive only); idempotent.
  void finish();

  // The text of one update, without '\r' or newline (exposed for tests).
  std::string render(int64_t step, double loss, const StepRates& rates, double peak_mib, double eta_seconds) const;

 private:
  int64_t total_steps_;
  std::ostream& out_;
  bool interactive_;
  std::chrono::steady_clock::time_point start_;
  int64_t first_step_ = -1;  // step of the first update; -1 before it
  size_t last_width_ = 0;    // of the last in-place line, to blank its tail
  bool line_open_ = false;   // an in-place line awaits its newline
};

}  // namespace hyper_parallel::train
