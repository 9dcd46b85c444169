// metrics.cpp — JSON-lines metrics log and its gnuplot loss plot.
#include "train/metrics/metrics.h"

#include "compat/file_system.h"
#include "io/errno_text.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

extern char** environ;

namespace hyper_parallel::train {
namespace {

// Removes the temporary files of one plot whatever happens.
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const auto& p : paths) ::unlink(p.c_str());
  }
};

// A gnuplot single-quoted string: quotes are doubled, nothing else is special.
std::string gnuplot_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

bool finite_number(const nlohmann::json& record, const char* key, double* value) {
  const auto it = record.find(key);
  if (it == record.end() || !it->is_number()) return false;
  *value = it->get<double>();
  return std::isfinite(*value);
}

// A loss the log recorded as not finite: "NaN", "Infinity", "-Infinity" (or null, as
// files of an earlier hp-train hold).
bool non_finite_entry(const nlohmann::json& record, const char* key) {
  const auto it = record.find(key);
  return it != record.end() && (it->is_null() || it->is_string());
}

// JSON has no NaN or infinity (nlohmann writes null, which reads as "missing"): they are
// written as the strings JavaScript and pandas use for them.
nlohmann::json with_non_finite_as_strings(nlohmann::json j) {
  if (j.is_number_float()) {
    const double v = j.get<double>();
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  } else if (j.is_structured()) {
    for (auto& child : j) child = with_non_finite_as_strings(std::move(child));
  }
  return j;
}

std::string read_text(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.size() > limit) text = "..." + text.substr(text.size() - limit);
  return text;
}

bool fail(std::string* error, const std::string& message) {
  if (error) *error = message;
  return false;
}

}  // namespace

MetricsLogger::MetricsLogger(const std::string& folder, int64_t resume_step)
    : path_(compat::join_path(folder, "metrics.jsonl")) {
  std::string error;
  if (!compat::create_directories(folder, &error)) throw std::runtime_error("metrics folder: " + error);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot open metrics file '" + path_ + "': " + io::errno_text(errno));

  // Where the kept part of an existing file ends.
  std::ifstream in(path_, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t keep = 0;
  while (keep < text.size()) {
    const size_t end = text.find('\n', keep);
    if (end == std::string::npos) break;  // torn last line
    if (resume_step == 0) break;
    if (resume_step > 0) {
      const auto record = nlohmann::json::parse(text.substr(keep, end - keep), nullptr, /*allow_exceptions=*/false);
      const auto step = record.is_object() ? record.find("step") : record.end();
      if (record.is_object() && step != record.end() && step->is_number_integer() &&
          step->get<int64_t>() > resume_step) {
        break;
      }
    }
    keep = end + 1;
  }
  // Lines cut: the whole ones after `keep`, and a torn one.
  for (size_t p = keep; p < text.size(); ++dropped_) {
    const size_t end = text.find('\n', p);
    p = end == std::string::npos ? text.size() : end + 1;
  }
  if (keep < text.size() && ::ftruncate(fd_, static_cast<off_t>(keep)) != 0) {
    const int err = errno;
    ::close(fd_);
    throw std::runtime_error("cannot cut the metrics file '" + path_ +
                             "' back to its whole lines: " + io::errno_text(err));
  }
}

MetricsLogger::~MetricsLogger() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLogger::log(const nlohmann::json& record) {
  if (!record.is_object()) {
    throw std::invalid_argument("MetricsLogger::log: a record must be a JSON object, got " +
                                std::string(record.type_name()));
  }
  // "replace": a stray invalid UTF-8 byte in a string field must not stop training.
  const std::string line =
      with_non_finite_as_strings(record).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  struct stat st {};
  if (::fstat(fd_, &st) != 0)
    throw std::runtime_error("cannot stat metrics file '" + path_ + "': " + io::errno_text(errno));
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      // Whole lines or nothing: cut the part that made it back off.
      const bool cut = ::ftruncate(fd_, st.st_size) == 0;
      throw std::runtime_error(
          "cannot write metrics file '" + path_ + "': " + io::errno_text(err) +
          (cut ? "" : " (and cutting the partial line back failed: " + io::errno_text(errno) + ")"));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd_) != 0)
    throw std::runtime_error("cannot fsync metrics file '" + path_ + "': " + io::errno_text(errno));
}

std::vector<nlohmann::json> read_metrics(const std::string& jsonl_path) {
  std::ifstream in(jsonl_path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open metrics file '" + jsonl_path + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  std::vector<nlohmann::json> records;
  size_t begin = 0;
  for (int64_t line_no = 1; begin < text.size(); ++line_no) {
    size_t end = text.find('\n', begin);
    const bool terminated = end != std::string::npos;
    if (!terminated) end = text.size();
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;

    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded() || !record.is_object()) {
      if (!terminated) break;  // torn last line of a writer that was killed
      throw std::runtime_error("metrics file '" + jsonl_path + "' line " + std::to_string(line_no) +
                               " is not a JSON object: " + line.substr(0, 80));
    }
    records.push_back(std::move(record));
  }
  return records;
}

namespace {

// The loss and validation loss of the metrics records, as gnuplot data blocks, and the
// steps whose loss was not finite.
struct LossSeries {
  std::ostringstream train, val;
  size_t train_points = 0, val_points = 0;
  std::vector<double> non_finite_steps;  // drawn as vertical marks: a loss that is not a point
};

void collect_loss_series(const std::vector<nlohmann::json>& records, LossSeries& s) {
  s.train.precision(17);
  s.val.precision(17);
  for (const auto& r : records) {
    double step = 0, value = 0;
    if (!finite_number(r, "step", &step)) continue;
    if (finite_number(r, "loss", &value)) {
      s.train << step << ' ' << value << '\n';
      ++s.train_points;
    } else if (non_finite_entry(r, "loss")) {
      s.non_finite_steps.push_back(step);
    }
    if (finite_number(r, "val_loss", &value)) {
      s.val << step << ' ' << value << '\n';
      ++s.val_points;
    }
  }
}

std::string gnuplot_script(const LossSeries& s, const std::string& png) {
  std::ostringstream script;
  // pngcairo draws anti-aliased lines; the libgd "png" terminal is the fallback.
  script << "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
            "  set terminal pngcairo size 1000,600 noenhanced\n"
            "} else {\n"
            "  set terminal png size 1000,600 noenhanced\n"
            "}\n"
         << "set output " << gnuplot_quote(png) << "\n"
         << "set title 'Loss vs step'\n"
            "set xlabel 'step'\n"
            "set ylabel 'loss'\n"
            "set key top right box opaque\n"
            "set grid\n";
  for (double step : s.non_finite_steps) {
    script << "set arrow from " << step << ", graph 0 to " << step << ", graph 1 nohead dt 2 lw 1.5 lc rgb '#ff7f0e'\n";
  }
  if (s.train_points == 0 && s.val_points == 0) {  // nothing else fixes the ranges
    script << "set xrange [" << s.non_finite_steps.front() - 1 << ":" << s.non_finite_steps.back() + 1
           << "]\nset yrange [0:1]\n";
  }
  if (s.train_points) script << "$train << EOD\n" << s.train.str() << "EOD\n";
  if (s.val_points) script << "$val << EOD\n" << s.val.str() << "EOD\n";
  std::vector<std::string> plots;
  // A single point draws no line, so it gets a marker instead.
  if (s.train_points) {
    plots.push_back(std::string("$train using 1:2 with ") + (s.train_points > 1 ? "lines lw 2" : "points pt 7") +
                    " lc rgb '#1f77b4' title 'train loss'");
  }
  if (s.val_points) plots.push_back("$val using 1:2 with linespoints pt 7 ps 1.2 lc rgb '#d62728' title 'val loss'");
  if (!s.non_finite_steps.empty()) {
    const size_t n = s.non_finite_steps.size();
    plots.push_back("NaN with lines dt 2 lw 1.5 lc rgb '#ff7f0e' title 'non-finite loss (" + std::to_string(n) +
                    " step" + (n > 1 ? "s" : "") + ")'");
  }
  script << "plot ";
  for (size_t i = 0; i < plots.size(); ++i) script << (i ? ", " : "") << plots[i];
  script << "\nset output\n";
  return script.str();
}

// Runs gnuplot on `script_path`, its output to `log_path`; why it failed, or nullopt.
std::optional<std::string> run_gnuplot(const std::string& script_path, const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::string program = "gnuplot";
  char* argv[] = {program.data(), const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid = 0;
  const int spawn_rc = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_rc != 0) {
    if (spawn_rc == ENOENT) return "gnuplot not found on PATH (install gnuplot-nox for loss plots)";
    return "cannot start gnuplot: " + io::errno_text(spawn_rc);
  }
  int status = 0;
  pid_t waited;
  do {
    waited = ::waitpid(pid, &status, 0);
  } while (waited < 0 && errno == EINTR);
  // waited < 0 (ECHILD: the host ignores SIGCHLD) leaves the output to judge.
  if (waited == pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    const std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                              : "was killed by signal " + std::to_string(WTERMSIG(status));
    return "gnuplot " + how + ": " + read_text(log_path, 1000);
  }
  return std::nullopt;
}

}  // namespace

bool plot_loss_curve(const std::string& jsonl_path, const std::string& png_path, std::string* error) {
  std::vector<nlohmann::json> records;
  try {
    records = read_metrics(jsonl_path);
  } catch (const std::exception& e) {
    return fail(error, e.what());
  }
  LossSeries series;
  collect_loss_series(records, series);
  if (series.train_points == 0 && series.val_points == 0 && series.non_finite_steps.empty()) {
    return fail(error, "metrics file '" + jsonl_path + "' holds no loss values to plot");
  }
  // Everything next to the PNG: the image can then be renamed into place.
  const std::string suffix = ".tmp-" + std::to_string(::getpid());
  const std::string script_path = png_path + ".gp" + suffix;
  const std::string log_path = png_path + ".log" + suffix;
  const std::string tmp_png = png_path + suffix;
  TempFiles temps{{script_path, log_path, tmp_png}};
  {
    std::ofstream script(script_path, std::ios::binary);
    script << gnuplot_script(series, tmp_png);
    if (!script) return fail(error, "cannot write gnuplot script '" + script_path + "'");
  }
  if (const auto why = run_gnuplot(script_path, log_path)) return fail(error, *why);
  if (compat::file_size(tmp_png) <= 0) {
    return fail(error, "gnuplot wrote no image: " + read_text(log_path, 1000));
  }
  if (::rename(tmp_png.c_str(), png_path.c_str()) != 0) {
    return fail(error, "cannot rename plot to '" + png_path + "': " + io::errno_text(errno));
  }
  return true;
}

}  // namespace hyper_parallel::train
