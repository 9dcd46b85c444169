// progress.cpp — peak memory, durations and the live progress line.
#include "train/metrics/progress.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

namespace hyper_parallel::train {

double peak_memory_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      double kib = 0;
      if (fields >> kib) return kib / 1024.0;
    }
  }
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) == 0) return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
  return 0.0;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto total = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = total / 3600, m = (total / 60) % 60, s = total % 60;
  char buf[48];
  if (h > 0) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(h), static_cast<long long>(m),
                  static_cast<long long>(s));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(m), static_cast<long long>(s));
  }
  return buf;
}

bool is_terminal(const std::ostream& out) {
  if (&out == &std::cout) return ::isatty(STDOUT_FILENO) == 1;
  if (&out == &std::cerr || &out == &std::clog) return ::isatty(STDERR_FILENO) == 1;
  return false;
}

namespace {

// 812 tok/s, 41.2k tok/s, 1.35M tok/s: three significant digits is plenty.
std::string format_rate(double per_s) {
  char buf[32];
  if (!std::isfinite(per_s) || per_s < 0) return "-";
  if (per_s < 1e3) {
    std::snprintf(buf, sizeof buf, "%.0f", per_s);
  } else if (per_s < 1e6) {
    std::snprintf(buf, sizeof buf, "%.1fk", per_s / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.2fM", per_s / 1e6);
  }
  return buf;
}

// 0.0523, 1.23, 45.6, 312: three significant digits, without an exponent.
std::string format_tflops(double tflops) {
  char buf[32];
  if (!std::isfinite(tflops) || tflops < 0) return "-";
  std::snprintf(buf, sizeof buf, tflops >= 100 ? "%.0f" : tflops >= 10 ? "%.1f" : "%.3g", tflops);
  return buf;
}

int digits(int64_t n) {
  int d = 1;
  for (n = n < 0 ? -n : n; n >= 10; n /= 10) ++d;
  return d;
}

}  // namespace

ProgressLine::ProgressLine(int64_t total_steps, std::ostream& out, bool interactive)
    : total_steps_(total_steps), out_(out), interactive_(interactive), start_(std::chrono::steady_clock::now()) {}

ProgressLine::~ProgressLine() {
  try {
    finish();
  } catch (...) {
    // A stream that throws on close must not terminate the program.
  }
}

std::string ProgressLine::render(int64_t step, double loss, const StepRates& rates, double peak_mib,
                                 double eta_seconds) const {
  char head[64];
  // Steps are right-aligned to the width of the total so the columns stay put.
  std::snprintf(head, sizeof head, "step %*lld/%lld", digits(total_steps_), static_cast<long long>(step),
                static_cast<long long>(total_steps_));
  char body[192];
  std::snprintf(body, sizeof body, " | loss %.4f | %s tok/s | %s TFLOPs | MFU %.1f%% | peak %.0f MiB | ETA %s", loss,
                format_rate(rates.tokens_per_s).c_str(), format_tflops(rates.tflops).c_str(), rates.mfu_pct, peak_mib,
                format_duration(eta_seconds).c_str());
  return std::string(head) + body;
}

void ProgressLine::update(int64_t step, double loss, const StepRates& rates, double peak_mib) {
  if (first_step_ < 0) first_step_ = step;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = step - first_step_ + 1;
  const int64_t remaining = total_steps_ > step ? total_steps_ - step : 0;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(remaining) : -1.0;

  const std::string text = render(step, loss, rates, peak_mib, eta);
  if (interactive_) {
    // Blank whatever a longer previous line left behind (no terminal escapes needed).
    const size_t pad = last_width_ > text.size() ? last_width_ - text.size() : 0;
    out_ << '\r' << text << std::string(pad, ' ');
    last_width_ = text.size();
    line_open_ = true;
  } else {
    out_ << text << '\n';
  }
  out_.flush();
}

void ProgressLine::finish() {
  if (!line_open_) return;
  line_open_ = false;
  last_width_ = 0;
  out_ << '\n';
  out_.flush();
}

}  // namespace hyper_parallel::train
