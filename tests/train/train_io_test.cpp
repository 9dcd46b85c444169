// train_io_test.cpp — tests of the I/O pieces of hp-train: atomic per-rank
// tensor files and the latest marker (checkpoint_io), the JSON-lines metrics
// log and its PNG plot (metrics), and the progress line (progress).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "compat/file_system.h"
#include "train/checkpoint/checkpoint_io.h"
#include "io/crc32c.h"
#include "train/metrics/metrics.h"
#include "train/metrics/progress.h"

namespace hyper_parallel::train::train_io_test {
namespace {

// A fresh directory per test, removed afterwards.
class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir_ = compat::join_path(compat::temp_directory(),
                             "hp_train_io_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    compat::remove_all(dir_);
    ASSERT_TRUE(compat::create_directories(dir_));
  }
  void TearDown() override { compat::remove_all(dir_); }

  std::string file(const std::string& name) const { return compat::join_path(dir_, name); }

  std::vector<std::string> entries() const { return compat::list_directory(dir_); }

  bool has_temp_files() const {
    for (const auto& p : compat::list_directory_recursive(dir_)) {
      if (p.find(".tmp-") != std::string::npos) return true;
    }
    return false;
  }

  std::string dir_;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Same dtype, shape and bytes: NaN payloads and -0.0 included.
void expect_bit_identical(const at::Tensor& expected, const at::Tensor& actual, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_TRUE(actual.defined());
  EXPECT_EQ(actual.scalar_type(), expected.scalar_type());
  EXPECT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(actual.device().is_cpu());
  EXPECT_TRUE(actual.is_contiguous());
  const at::Tensor e = expected.contiguous();
  ASSERT_EQ(actual.nbytes(), e.nbytes());
  if (e.nbytes() > 0) {
    EXPECT_EQ(std::memcmp(actual.data_ptr(), e.data_ptr(), e.nbytes()), 0);
  }
}

// Random bit patterns of the given width, viewed as `dtype`: NaNs, infinities,
// denormals and negative zeros all show up.
at::Tensor random_bits(at::IntArrayRef shape, at::ScalarType bits, at::ScalarType dtype) {
  const auto lo = bits == at::kShort ? -32768
                  : bits == at::kInt ? std::numeric_limits<int32_t>::min()
                                     : std::numeric_limits<int64_t>::min() / 2;
  const auto hi = bits == at::kShort ? 32767
                  : bits == at::kInt ? std::numeric_limits<int32_t>::max()
                                     : std::numeric_limits<int64_t>::max() / 2;
  return at::randint(lo, hi, shape, at::TensorOptions().dtype(bits)).view(dtype);
}

// ---------------------------------------------------------------- checkpoint_io

using TrainCheckpointIo = TempDir;

TEST_F(TrainCheckpointIo, RoundTripsEveryDtypeBitForBit) {
  at::manual_seed(7);
  std::map<std::string, at::Tensor> tensors;
  tensors["f32"] = random_bits({5, 7}, at::kInt, at::kFloat);
  tensors["f64"] = random_bits({3, 2, 4}, at::kLong, at::kDouble);
  tensors["bf16"] = random_bits({33}, at::kShort, at::kBFloat16);
  tensors["i64"] = at::tensor(
      {std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0}, std::numeric_limits<int64_t>::max()}, at::kLong);
  tensors["f32_specials"] =
      at::tensor({0.0f, -0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::denorm_min()});
  tensors["scalar"] = at::scalar_tensor(3.25, at::kDouble);
  tensors["empty_f32"] = at::empty({0}, at::kFloat);
  tensors["empty_2d_bf16"] = at::empty({0, 4}, at::kBFloat16);
  tensors["empty_i64"] = at::empty({3, 0, 2}, at::kLong);

  const std::string path = file("rank0.pt");
  write_tensor_file(path, tensors, R"({"step":12})");
  const TensorFile back = read_tensor_file(path);

  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.tensors.count(name)) << name;
    expect_bit_identical(t, back.tensors.at(name), name);
  }
  EXPECT_EQ(back.metadata_json, R"({"step":12})");
}

TEST_F(TrainCheckpointIo, StoresNonContiguousViewsCompactlyUnderAnyName) {
  at::manual_seed(3);
  const at::Tensor base = at::randn({512, 512});  // 1 MiB of floats
  std::map<std::string, at::Tensor> tensors;
  tensors["layers.0.attn.q_proj.weight"] = base.t();               // transposed
  tensors["optimizer/state/0/exp_avg"] = base.slice(0, 100, 102);  // offset view of a big base
  tensors["rng:cpu"] = at::arange(4, at::kLong).expand({3, 4});    // stride 0
  tensors["model.norm.weight (requires grad)"] = at::ones({8}).requires_grad_();
  tensors[""] = at::zeros({2}, at::kDouble);

  const std::string path = file("views.pt");
  write_tensor_file(path, tensors, "{}");
  const TensorFile back = read_tensor_file(path);
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.tensors.count(name)) << name;
    expect_bit_identical(t.detach(), back.tensors.at(name), name);
    EXPECT_FALSE(back.tensors.at(name).requires_grad());
  }
  // The slice holds 2 rows: its 1 MiB base must not be stored with it. The
  // transpose is a full 1 MiB tensor of its own, so the file is about 2 MiB.
  EXPECT_LT(compat::file_size(path), 2 * 512 * 512 * 4 + 64 * 1024);
}

TEST_F(TrainCheckpointIo, MetadataAndEmptyMapsRoundTrip) {
  const std::string metadata = "{\"note\":\"line1\\nline2 \\\"quoted\\\" caf\xC3\xA9\",\"mesh\":[2,4]}\n";
  write_tensor_file(file("meta.pt"), {}, metadata);
  TensorFile back = read_tensor_file(file("meta.pt"));
  EXPECT_TRUE(back.tensors.empty());
  EXPECT_EQ(back.metadata_json, metadata);

  write_tensor_file(file("nometa.pt"), {{"x", at::ones({2})}}, "");
  back = read_tensor_file(file("nometa.pt"));
  EXPECT_EQ(back.metadata_json, "");
  EXPECT_EQ(back.tensors.size(), 1u);
}

TEST_F(TrainCheckpointIo, LeavesNoTempFilesAndReplacesTheFileAtomically) {
  const std::string path = file("rank1.pt");
  write_tensor_file(path, {{"w", at::full({4}, 1.0)}}, "\"first\"");
  EXPECT_EQ(entries(), std::vector<std::string>{"rank1.pt"});
  const std::string first_bytes = slurp(path);

  // A reader that opened the old file keeps reading the complete old file:
  // the rewrite renames a new inode over the name instead of truncating.
  std::ifstream old_reader(path, std::ios::binary);
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);

  write_tensor_file(path, {{"w", at::full({4}, 2.0)}, {"v", at::ones({1000})}}, "\"second\"");
  struct stat after {};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_NE(before.st_ino, after.st_ino);
  const std::string old_view((std::istreambuf_iterator<char>(old_reader)), std::istreambuf_iterator<char>());
  EXPECT_EQ(old_view, first_bytes);

  const TensorFile back = read_tensor_file(path);
  EXPECT_EQ(back.metadata_json, "\"second\"");
  EXPECT_TRUE(at::equal(back.tensors.at("w"), at::full({4}, 2.0)));
  EXPECT_EQ(entries(), std::vector<std::string>{"rank1.pt"});
}

TEST_F(TrainCheckpointIo, FailedWritesLeaveNeitherTempNorFinalFile) {
  const std::string in_missing_dir = file("no/such/dir/rank0.pt");
  try {
    write_tensor_file(in_missing_dir, {{"w", at::ones({2})}}, "{}");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(in_missing_dir), std::string::npos) << e.what();
  }

  EXPECT_THROW(write_tensor_file(file("undefined.pt"), {{"w", at::Tensor()}}, "{}"), std::invalid_argument);
  EXPECT_TRUE(entries().empty());

  // An earlier complete file survives a failed rewrite untouched.
  write_tensor_file(file("keep.pt"), {{"w", at::ones({2})}}, "\"kept\"");
  EXPECT_THROW(write_tensor_file(file("keep.pt"), {{"w", at::Tensor()}}, "{}"), std::invalid_argument);
  EXPECT_EQ(read_tensor_file(file("keep.pt")).metadata_json, "\"kept\"");
  EXPECT_FALSE(has_temp_files());
}

TEST_F(TrainCheckpointIo, MissingOrCorruptFilesGiveErrorsNamingTheFile) {
  const auto expect_error_naming = [](const std::string& path) {
    try {
      read_tensor_file(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one-line message: " << e.what();
    }
  };
  expect_error_naming(file("missing.pt"));

  spit(file("garbage.pt"), "this is not a zip archive at all");
  expect_error_naming(file("garbage.pt"));

  spit(file("empty.pt"), "");
  expect_error_naming(file("empty.pt"));

  write_tensor_file(file("whole.pt"), {{"w", at::randn({256})}}, "{}");
  const std::string bytes = slurp(file("whole.pt"));
  spit(file("truncated.pt"), bytes.substr(0, bytes.size() / 2));
  expect_error_naming(file("truncated.pt"));

  expect_error_naming(dir_);  // a directory
}

TEST(Crc32c, MatchesTheStandardCheckValueAndContinues) {
  const std::string text = "123456789";
  EXPECT_EQ(io::crc32c(text.data(), text.size()), 0xE3069283u);  // RFC 3720's check value
  EXPECT_EQ(io::crc32c(nullptr, 0), 0u);
  const std::string long_text(1000, 'x');
  const uint32_t whole = io::crc32c(long_text.data(), long_text.size());
  EXPECT_EQ(io::crc32c(long_text.data() + 333, 667, io::crc32c(long_text.data(), 333)), whole);
  EXPECT_EQ(io::crc32c_hex(0xE3069283u), "e3069283");
}

TEST_F(TrainCheckpointIo, FlippedTensorBytesAreNamedOnRead) {
  // A large tensor of distinct values, so that flipping bytes mid-file hits its data.
  write_tensor_file(file("w.pt"), {{"layer.weight", at::arange(100000, at::kFloat)}}, "{}");
  std::string bytes = slurp(file("w.pt"));
  const size_t mid = bytes.size() / 2;
  for (size_t i = mid; i < mid + 16; ++i) bytes[i] = static_cast<char>(~bytes[i]);
  spit(file("w.pt"), bytes);
  try {
    read_tensor_file(file("w.pt"));
    FAIL() << "flipped bytes were loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(file("w.pt")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tensor 'layer.weight' is corrupt"), std::string::npos) << e.what();
  }
}

TEST_F(TrainCheckpointIo, ChecksumFileAgreesWithWhatWasWritten) {
  const FileChecksum written = write_tensor_file(file("a.pt"), {{"w", at::randn({64})}}, "{}");
  const FileChecksum read = checksum_file(file("a.pt"));
  EXPECT_EQ(written.bytes, compat::file_size(file("a.pt")));
  EXPECT_EQ(written.bytes, read.bytes);
  EXPECT_EQ(written.crc32c, read.crc32c);
  try {
    checksum_file(file("missing.pt"));
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
}

TEST_F(TrainCheckpointIo, RemoveTempFilesDeletesOnlyTheLeftoversOfSaves) {
  ASSERT_TRUE(compat::create_directories(file("step-2")));
  spit(file("latest.tmp-123"), "2");
  spit(file("step-2/rank-0.pt.tmp-4567"), "partial");
  spit(file("step-2/rank-0.pt"), "kept");
  spit(file("notes.tmp-x"), "not a temp file of ours");
  const auto removed = remove_temp_files(dir_);
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_FALSE(has_temp_files() && compat::path_exists(file("latest.tmp-123")));
  EXPECT_FALSE(compat::path_exists(file("step-2/rank-0.pt.tmp-4567")));
  EXPECT_TRUE(compat::path_exists(file("step-2/rank-0.pt")));
  EXPECT_TRUE(compat::path_exists(file("notes.tmp-x")));
}

TEST_F(TrainCheckpointIo, StepDirectoriesAndLatestMarker) {
  const std::string folder = file("ckpt");
  EXPECT_EQ(step_directory(folder, 12), folder + "/step-12");
  EXPECT_EQ(step_directory("out", 0), "out/step-0");

  EXPECT_EQ(read_latest_marker(folder), std::nullopt);  // folder does not exist yet
  make_directories(step_directory(folder, 5));
  EXPECT_TRUE(compat::is_directory(step_directory(folder, 5)));
  make_directories(step_directory(folder, 5));  // already there: fine
  EXPECT_EQ(read_latest_marker(folder), std::nullopt);

  write_latest_marker(folder, 5);
  EXPECT_EQ(read_latest_marker(folder), std::optional<int64_t>(5));
  write_latest_marker(folder, 123456789012);
  EXPECT_EQ(read_latest_marker(folder), std::optional<int64_t>(123456789012));
  EXPECT_EQ(slurp(folder + "/latest"), "123456789012\n");
  EXPECT_FALSE(has_temp_files());

  spit(folder + "/latest", "twelve\n");
  try {
    read_latest_marker(folder);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(folder + "/latest"), std::string::npos) << e.what();
  }

  spit(file("a_file"), "x");
  try {
    make_directories(file("a_file") + "/sub");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(file("a_file")), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- metrics

using TrainMetrics = TempDir;

bool gnuplot_available() { return std::system("gnuplot --version >/dev/null 2>&1") == 0; }

TEST_F(TrainMetrics, LoggerWritesJsonLinesThatReadMetricsReads) {
  const std::string folder = file("run");
  {
    MetricsLogger logger(folder);  // creates the folder
    EXPECT_EQ(logger.path(), folder + "/metrics.jsonl");
    logger.log({{"step", 1},
                {"loss", 7.5},
                {"lr", 3e-4},
                {"tokens_per_s", 41200.5},
                {"peak_memory_mb", 812.0},
                {"grad_norm", 1.25}});
    // Flushed per line: visible before the logger goes away.
    EXPECT_EQ(slurp(logger.path()).back(), '\n');
    logger.log({{"step", 2}, {"loss", std::nan("")}, {"lr", 3e-4}});
    logger.log({{"step", 3}, {"loss", 6.5}, {"val_loss", 6.75}});
  }
  {
    MetricsLogger resumed(folder);  // appends, as a resumed run does
    resumed.log({{"step", 4}, {"loss", 6.0}});
    EXPECT_THROW(resumed.log(nlohmann::json::array({1, 2})), std::invalid_argument);
  }

  std::istringstream lines(slurp(folder + "/metrics.jsonl"));
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    ++count;
    const auto parsed = nlohmann::json::parse(line);  // each line is valid JSON on its own
    EXPECT_TRUE(parsed.is_object());
  }
  EXPECT_EQ(count, 4);

  const auto records = read_metrics(folder + "/metrics.jsonl");
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0]["step"], 1);
  EXPECT_DOUBLE_EQ(records[0]["loss"].get<double>(), 7.5);
  EXPECT_DOUBLE_EQ(records[0]["tokens_per_s"].get<double>(), 41200.5);
  EXPECT_DOUBLE_EQ(records[0]["grad_norm"].get<double>(), 1.25);
  EXPECT_EQ(records[1]["loss"], "NaN");  // JSON has no NaN: the string JavaScript and pandas use
  EXPECT_DOUBLE_EQ(records[2]["val_loss"].get<double>(), 6.75);
  EXPECT_EQ(records[3]["step"], 4);
}

TEST_F(TrainMetrics, AContinuedLogDropsATornLastLineBeforeAppending) {
  ASSERT_TRUE(compat::create_directories(file("m")));
  spit(file("m/metrics.jsonl"), "{\"step\":1,\"loss\":2}\n{\"step\":2,\"lo");
  MetricsLogger logger(file("m"));
  EXPECT_EQ(logger.dropped_records(), 1);
  logger.log({{"step", 3}, {"loss", 1.0}});
  const auto records = read_metrics(file("m/metrics.jsonl"));
  ASSERT_EQ(records.size(), 2u) << slurp(file("m/metrics.jsonl"));
  EXPECT_EQ(records[1]["step"], 3);
}

TEST_F(TrainMetrics, AResumedLogDropsTheStepsItRunsAgainAndAFreshRunStartsEmpty) {
  ASSERT_TRUE(compat::create_directories(file("m")));
  spit(file("m/metrics.jsonl"), "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n{\"step\":4}\n");
  {
    MetricsLogger resumed(file("m"), /*resume_step=*/2);
    EXPECT_EQ(resumed.dropped_records(), 2);
    resumed.log({{"step", 3}});
  }
  EXPECT_EQ(slurp(file("m/metrics.jsonl")), "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n");
  MetricsLogger fresh(file("m"), /*resume_step=*/0);
  EXPECT_EQ(fresh.dropped_records(), 3);
  EXPECT_EQ(slurp(file("m/metrics.jsonl")), "");
}

TEST_F(TrainMetrics, ReadMetricsToleratesOnlyATornLastLine) {
  spit(file("torn.jsonl"), "{\"step\":1,\"loss\":2}\n\n{\"step\":2,\"loss\":1.5}\n{\"step\":3,\"lo");
  EXPECT_EQ(read_metrics(file("torn.jsonl")).size(), 2u);

  spit(file("bad.jsonl"), "{\"step\":1}\nnot json\n{\"step\":3}\n");
  try {
    read_metrics(file("bad.jsonl"));
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(file("bad.jsonl")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }

  try {
    read_metrics(file("missing.jsonl"));
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(file("missing.jsonl")), std::string::npos) << e.what();
  }
}

TEST_F(TrainMetrics, PlotWritesAPngWithTrainAndValLoss) {
  if (!gnuplot_available()) GTEST_SKIP() << "gnuplot is not installed";
  {
    MetricsLogger logger(dir_);
    for (int step = 1; step <= 60; ++step) {
      nlohmann::json r = {{"step", step}, {"loss", 8.0 * std::exp(-step / 30.0) + 2.0}, {"lr", 1e-3}};
      if (step % 20 == 0) r["val_loss"] = 8.0 * std::exp(-step / 30.0) + 2.3;
      logger.log(r);
    }
  }
  const std::string png = file("loss's plot.png");  // a quote in the name must survive gnuplot quoting
  std::string error;
  ASSERT_TRUE(plot_loss_curve(file("metrics.jsonl"), png, &error)) << error;
  const std::string bytes = slurp(png);
  ASSERT_GT(bytes.size(), 1000u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_FALSE(has_temp_files());

  // Train loss only, a single point: still a plot.
  spit(file("one.jsonl"), "{\"step\":1,\"loss\":3.0}\n");
  ASSERT_TRUE(plot_loss_curve(file("one.jsonl"), file("one.png"), &error)) << error;
  EXPECT_EQ(slurp(file("one.png")).substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST_F(TrainMetrics, PlotReportsProblemsWithoutThrowing) {
  std::string error;
  EXPECT_FALSE(plot_loss_curve(file("missing.jsonl"), file("a.png"), &error));
  EXPECT_NE(error.find("missing.jsonl"), std::string::npos) << error;

  // (A null or "NaN" loss is a non-finite step, which the plot marks: not "no loss".)
  spit(file("noloss.jsonl"), "{\"step\":1,\"lr\":0.1}\n{\"step\":2,\"lr\":0.05}\n");
  EXPECT_FALSE(plot_loss_curve(file("noloss.jsonl"), file("b.png"), &error));
  EXPECT_NE(error.find("holds no loss values to plot"), std::string::npos) << error;
  EXPECT_FALSE(plot_loss_curve(file("noloss.jsonl"), file("b.png")));  // no error sink: fine too

  // No gnuplot on PATH: false with a message, not an exception.
  spit(file("ok.jsonl"), "{\"step\":1,\"loss\":3.0}\n{\"step\":2,\"loss\":2.0}\n");
  const char* old_path = std::getenv("PATH");
  const std::string saved = old_path ? old_path : "";
  ::setenv("PATH", dir_.c_str(), 1);
  const bool plotted = plot_loss_curve(file("ok.jsonl"), file("c.png"), &error);
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_FALSE(plotted);
  EXPECT_NE(error.find("gnuplot"), std::string::npos) << error;
  EXPECT_FALSE(compat::path_exists(file("c.png")));
  EXPECT_FALSE(has_temp_files());
}

// ---------------------------------------------------------------- progress

TEST(TrainProgress, FormatDuration) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(48), "0:48");
  EXPECT_EQ(format_duration(48.4), "0:48");
  EXPECT_EQ(format_duration(59.6), "1:00");
  EXPECT_EQ(format_duration(723), "12:03");
  EXPECT_EQ(format_duration(3599), "59:59");
  EXPECT_EQ(format_duration(3600), "1:00:00");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(100 * 3600 + 5), "100:00:05");
  EXPECT_EQ(format_duration(-1), "--:--");
  EXPECT_EQ(format_duration(std::nan("")), "--:--");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "--:--");
}

TEST(TrainProgress, RenderShowsEveryField) {
  std::ostringstream sink;
  ProgressLine line(60, sink, false);
  EXPECT_EQ(line.render(12, 7.81234, {41234, 0.052345, 21.34}, 812.3, 48),
            "step 12/60 | loss 7.8123 | 41.2k tok/s | 0.0523 TFLOPs | MFU 21.3% | peak 812 MiB | ETA 0:48");
  EXPECT_EQ(line.render(3, 2.0, {812, 312.4, 31.6}, 90, 3723),
            "step  3/60 | loss 2.0000 | 812 tok/s | 312 TFLOPs | MFU 31.6% | peak 90 MiB | ETA 1:02:03");
  EXPECT_NE(line.render(60, 1.0, {1.35e6, 45.67, 4.6}, 1, 0).find("1.35M tok/s | 45.7 TFLOPs | MFU 4.6%"),
            std::string::npos);
}

TEST(TrainProgress, NonInteractiveWritesPlainLines) {
  std::ostringstream sink;
  {
    ProgressLine line(60, sink, false);
    line.update(12, 7.81234, {41234, 0.05, 20.0}, 812);
    line.update(13, 7.5, {40000, 0.049, 19.5}, 815);
    line.finish();
  }
  const std::string text = sink.str();
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  for (const char* part :
       {"step 12/60", "loss 7.8123", "41.2k tok/s", "0.05 TFLOPs", "MFU 20.0%", "peak 812 MiB", "ETA ", "step 13/60"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " in: " << text;
  }
}

TEST(TrainProgress, InteractiveRedrawsOneLine) {
  std::ostringstream sink;
  ProgressLine line(100, sink, true);
  line.update(1, 10.0, {2.5e6, 1.5, 50.0}, 1500);
  line.update(2, 9.0, {5, 0.001, 0.1}, 1500);  // shorter text: the tail of the last one is blanked
  const std::string text = sink.str();
  EXPECT_EQ(text.find('\n'), std::string::npos);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\r'), 2);
  const size_t second_start = text.find('\r', 1) + 1;
  const std::string first = text.substr(1, second_start - 2);
  const std::string second = text.substr(second_start);
  EXPECT_EQ(second.size(), first.size());
  EXPECT_NE(second.find("step   2/100"), std::string::npos) << second;
  line.finish();
  line.finish();  // idempotent
  const std::string finished = sink.str();
  EXPECT_EQ(finished, text + "\n");
  EXPECT_FALSE(is_terminal(sink));
}

TEST(TrainProgress, LastStepHasZeroEta) {
  std::ostringstream sink;
  ProgressLine line(2, sink, false);
  line.update(1, 1.0, {1.0, 1.0, 1.0}, 1.0);
  line.update(2, 1.0, {1.0, 1.0, 1.0}, 1.0);
  EXPECT_NE(sink.str().find("step 2/2 | loss 1.0000 | 1 tok/s | 1 TFLOPs | MFU 1.0% | peak 1 MiB | ETA 0:00\n"),
            std::string::npos)
      << sink.str();
}

TEST(TrainProgress, PeakMemoryTracksResidentHighWaterMark) {
  std::vector<char> block(96 << 20);
  std::memset(block.data(), 1, block.size());  // touch it: resident, not just reserved
  const double peak = peak_memory_mib();
  EXPECT_GE(peak, 96.0);
  EXPECT_LT(peak, 1 << 20);
  EXPECT_EQ(block[block.size() / 2], 1);
}

}  // namespace
}  // namespace hyper_parallel::train::train_io_test
