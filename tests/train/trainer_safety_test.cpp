// trainer_safety_test.cpp — no training on NaN, one job per dump folder, resumes
// that check their data, folders checked at start, and errors that name their cause.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "compat/file_system.h"
#include "harness/job_errors.h"
#include "harness/rank_harness.h"
#include "harness/train_steps.h"
#include "hyper_parallel/hyper_parallel.h"
#include "train/checkpoint/checkpoint_io.h"
#include "train/checkpoint/dump_folder_lock.h"
#include "train/parallel/local_piece.h"
#include "train/metrics/metrics.h"
#include "train/optim/non_finite_steps.h"
#include "train/checkpoint/storage_checks.h"
#include "hyper_parallel_train/trainer.h"

namespace trainer_safety_test {

using namespace hyper_parallel;
using namespace hyper_parallel::train;
using hyper_parallel::testing::binary_path;
using hyper_parallel::testing::checkpoint_path;
using hyper_parallel::testing::error_text;
using hyper_parallel::testing::expect_refused;
using hyper_parallel::testing::fresh_test_dir;
using hyper_parallel::testing::rank_errors;
using hyper_parallel::testing::run_command;
using hyper_parallel::testing::run_ranks;

namespace {

std::string fresh_dir(const std::string& name) { return fresh_test_dir("hp_safety_", name); }

// A checkpoint every step.
JobConfig small_job(const std::string& dump, int64_t tp, int64_t steps) {
  JobConfig c = hyper_parallel::testing::tiny_checkpointed_job(dump, tp, steps);
  c.checkpoint.interval = 1;
  return c;
}

JobConfig resumed(JobConfig job, int64_t steps) {
  job.checkpoint.resume = true;
  job.training.steps = steps;
  return job;
}

std::vector<nlohmann::json> metrics_of(const JobConfig& job) {
  return read_metrics(compat::join_path(compat::join_path(job.dump_folder, job.metrics.folder), "metrics.jsonl"));
}

// The final norm's weight (replicated under TP) gets a NaN: every logit, the loss and every
// gradient become NaN, on every rank. Returns the value it replaced.
float poison_final_norm(Trainer& t, float value = std::nanf("")) {
  at::NoGradGuard no_grad;
  for (const auto& p : t.model().named_parameters()) {
    if (p.key() != "norm.weight") continue;
    at::Tensor w = local_or_plain(p.value());
    const float old = w[0].item<float>();
    w[0].fill_(value);
    return old;
  }
  ADD_FAILURE() << "no norm.weight";
  return 0;
}

std::vector<at::Tensor> weights_of(Trainer& t) {
  std::vector<at::Tensor> out;
  for (const auto& p : t.model().parameters()) out.push_back(local_or_plain(p).detach().clone());
  return out;
}

void run_steps(Trainer& t, std::initializer_list<int64_t> steps) {
  for (int64_t s : steps) t.train_step(s);
}

}  // namespace

// --- 1. non-finite loss or gradient norm ------------------------------------------------------

// Probe: --training.lr 1e6 gave NaN from step 3 on, and training went on to the end,
// checkpointing NaN weights. Now the step is not applied, nothing of it is saved, and
// every rank stops with an error naming the step and what was not finite.
TEST(NonFiniteSteps, ANonFiniteLossStopsEveryRankWithoutCheckpointingIt) {
  JobConfig job = small_job(fresh_dir("stop"), 2, 2);
  run_ranks(2, [&](int64_t) { Trainer(job).train(); });
  const auto errors = rank_errors(2, [&](int64_t) {
    Trainer t(resumed(job, 4));
    poison_final_norm(t);
    t.train();
  });
  expect_refused(errors, {"step 3: the loss is NaN and the gradient norm is NaN", "--training.max_skipped_steps"});
  EXPECT_EQ(read_latest_marker(checkpoint_path(job, "")), 2);
  EXPECT_FALSE(compat::path_exists(checkpoint_path(job, "step-3")));
  // The metrics show the step (a NaN string, not null or nothing).
  const auto records = metrics_of(job);
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.back()["step"], 3);
  EXPECT_EQ(records.back()["loss"], "NaN");
  EXPECT_EQ(records.back()["grad_norm"], "NaN");
}

// A skipped step leaves the weights and AdamW's state as they were: training on after it
// gives bit for bit what a run that never saw that step gives.
TEST(NonFiniteSteps, ASkippedStepLeavesTheWeightsAndTheOptimizerStateUntouched) {
  JobConfig job = small_job(fresh_dir("skip"), 1, 4);
  job.checkpoint.enable = false;
  std::vector<at::Tensor> skipped, reference;
  run_ranks(1, [&](int64_t) {
    Trainer t(job);
    run_steps(t, {1, 2});
    const float old = poison_final_norm(t);
    const auto before = weights_of(t);
    const StepResult r = t.train_step(3);
    EXPECT_TRUE(r.non_finite);
    const auto after = weights_of(t);
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(at::allclose(before[i], after[i], 0, 0, /*equal_nan=*/true)) << "parameter " << i;
    }
    poison_final_norm(t, old);
    t.train_step(4);
    skipped = weights_of(t);
  });
  JobConfig other = job;
  other.dump_folder = fresh_dir("skip_reference");
  run_ranks(1, [&](int64_t) {
    Trainer t(other);
    run_steps(t, {1, 2, 4});
    reference = weights_of(t);
  });
  ASSERT_EQ(skipped.size(), reference.size());
  for (size_t i = 0; i < skipped.size(); ++i) EXPECT_TRUE(skipped[i].equal(reference[i])) << "parameter " << i;
}

TEST(NonFiniteSteps, SkipsUpToTheLimitInARowThenStops) {
  JobConfig job = small_job(fresh_dir("limit"), 1, 6);
  job.training.max_skipped_steps = 2;
  job.checkpoint.enable = false;  // the poisoned weights are not the steps' doing
  const auto errors = rank_errors(1, [&](int64_t) {
    Trainer t(job);
    poison_final_norm(t);
    t.train();
  });
  expect_refused(errors,
                 {"step 3: the loss is NaN", "3 such steps in a row, more than training.max_skipped_steps = 2"});
  const auto records = metrics_of(job);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0]["skipped"], 1);
  EXPECT_EQ(records[1]["skipped"], 2);
  EXPECT_EQ(records[2]["loss"], "NaN");
}

TEST(NonFiniteSteps, TheCountInARowStartsOverAfterAFiniteStep) {
  NonFiniteSteps policy(2);
  const double nan = std::nan("");
  EXPECT_TRUE(policy.check(1, nan, 1.0));
  EXPECT_TRUE(policy.check(2, 1.0, INFINITY));
  EXPECT_FALSE(policy.check(3, 1.0, 1.0));
  EXPECT_TRUE(policy.check(4, nan, nan));
  EXPECT_TRUE(policy.check(5, nan, nan));
  EXPECT_EQ(policy.skipped(), 4);
  try {
    policy.check(6, -INFINITY, nan);
    ADD_FAILURE() << "a third in a row went on";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("step 6: the loss is -inf and the gradient norm is NaN"), std::string::npos)
        << e.what();
  }
  NonFiniteSteps strict(0);
  EXPECT_FALSE(strict.check(1, 2.0, 3.0));
  EXPECT_THROW(strict.check(2, nan, 3.0), std::runtime_error);
}

// Probe: a NaN in a used weight stopped at step 1 advising only "Lower --training.lr".
// Before any finite step the learning rate has changed nothing: the message says so.
TEST(NonFiniteSteps, ANonFiniteFirstStepPointsAtTheWeightsItStartedFrom) {
  const double nan = std::nan("");
  const std::string weights =
      "No step of this run has been finite yet, so the weights it started from may be the cause";
  NonFiniteSteps first(0);
  try {
    first.check(1, nan, nan);
    ADD_FAILURE() << "went on";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(weights), std::string::npos) << e.what();
  }
  NonFiniteSteps later(0);
  EXPECT_FALSE(later.check(1, 2.0, 1.0));
  try {
    later.check(2, nan, 1.0);
    ADD_FAILURE() << "went on";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).find(weights), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Lower --training.lr"), std::string::npos) << e.what();
  }
}

// Probe: resuming from a checkpoint of NaN weights was accepted.
TEST(NonFiniteSteps, ResumingFromACheckpointWithNonFiniteWeightsIsRefused) {
  JobConfig job = small_job(fresh_dir("nanckpt"), 1, 4);
  run_ranks(1, [&](int64_t) {
    Trainer t(job);
    run_steps(t, {1});
    t.save_checkpoint();
    t.train_step(2);
    poison_final_norm(t, INFINITY);
    t.save_checkpoint();  // as an hp-train before this check could leave it
  });
  expect_refused(rank_errors(1, [&](int64_t) { Trainer t(resumed(job, 4)); }),
                 {"model.norm.weight' holds NaN or infinite values", "--checkpoint.load_step 1"});
  JobConfig from_one = resumed(job, 4);
  from_one.checkpoint.load_step = 1;
  run_ranks(1, [&](int64_t) { EXPECT_EQ(Trainer(from_one).step(), 1); });
}

// Probe: metrics wrote null for NaN and the plot left those steps out.
TEST(NonFiniteSteps, MetricsAndThePlotShowNonFiniteSteps) {
  const std::string dir = fresh_dir("metrics");
  {
    MetricsLogger log(dir, 0);
    log.log({{"step", 1}, {"loss", std::nan("")}, {"grad_norm", INFINITY}, {"nested", {{"x", -INFINITY}}}});
  }
  const auto records = read_metrics(compat::join_path(dir, "metrics.jsonl"));
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["loss"], "NaN");
  EXPECT_EQ(records[0]["grad_norm"], "Infinity");
  EXPECT_EQ(records[0]["nested"]["x"], "-Infinity");
  // A log whose losses are all NaN still plots (dashed marks at those steps).
  std::string error;
  const std::string png = compat::join_path(dir, "loss.png");
  const bool plotted = plot_loss_curve(compat::join_path(dir, "metrics.jsonl"), png, &error);
  if (error.find("gnuplot not found") != std::string::npos) GTEST_SKIP() << error;
  EXPECT_TRUE(plotted) << error;
  EXPECT_GT(compat::file_size(png), 0);
}

// --- 2. one job per dump folder -----------------------------------------------------------------

// Probe: a second hp-train in a running job's folder deleted its in-flight temporary files
// (and two fresh jobs ran on together, mixing checkpoints and metrics).
TEST(DumpFolderLock, ASecondJobIsRefusedNamingTheHolderAndTouchesNothing) {
  JobConfig job = small_job(fresh_dir("lock"), 1, 2);
  run_ranks(1, [&](int64_t) {
    Trainer first(job);
    // What the first job's save has in flight (write_tensor_file's temporary name).
    ASSERT_TRUE(compat::create_directories(checkpoint_path(job, "step-2")));
    const std::string in_flight = checkpoint_path(job, "step-2/rank-0.pt.tmp-" + std::to_string(::getpid()));
    std::ofstream(in_flight) << "half a checkpoint";
    std::string error;
    try {
      Trainer second(job);
    } catch (const std::exception& e) {
      error = error_text(e);
    }
    EXPECT_NE(error.find("is in use by another job (pid " + std::to_string(::getpid()) + " on host "),
              std::string::npos)
        << error;
    EXPECT_TRUE(compat::path_exists(in_flight)) << "the refused job deleted the running job's temporary file";
  });
  // Once the holder is gone its temporary files are provably orphans and are removed.
  run_ranks(1, [&](int64_t) { Trainer third(resumed(job, 2)); });
  EXPECT_FALSE(compat::path_exists(checkpoint_path(job, "step-2/rank-0.pt.tmp-" + std::to_string(::getpid()))));
}

// Probe: job B (--job.dump_folder B --checkpoint.folder A/checkpoints) deleted job A's
// in-flight temporary file and wrote its own run into A's checkpoints; with --metrics.folder
// at A's metrics, A's metrics.jsonl held B's steps. Every folder a job writes is locked,
// wherever it lives and under whatever name (a symlink leads to the same lock), and a job
// refused for any of them touches none.
TEST(DumpFolderLock, EveryFolderAJobWritesIsLockedUnderAnyName) {
  const std::string a = fresh_dir("lock_a"), b = fresh_dir("lock_b"), link = fresh_dir("lock_link");
  JobConfig job_a = small_job(a, 1, 2);
  job_a.checkpoint.folder = fresh_dir("lock_a_checkpoints");  // absolute: outside A's dump folder
  job_a.metrics.folder = "metrics";
  run_ranks(1, [&](int64_t) {
    Trainer first(job_a);
    const std::string checkpoints = job_a.checkpoint.folder, metrics = a + "/metrics";
    ASSERT_TRUE(compat::create_directories(checkpoints + "/step-2"));
    const std::string in_flight = checkpoints + "/step-2/rank-0.pt.tmp-" + std::to_string(::getpid());
    std::ofstream(in_flight) << "half a checkpoint";
    ASSERT_EQ(::symlink(checkpoints.c_str(), link.c_str()), 0);
    const std::string holder = "is in use by another job (pid " + std::to_string(::getpid()) + " on host ";

    JobConfig by_checkpoints = small_job(b, 1, 2);
    by_checkpoints.checkpoint.folder = checkpoints;
    expect_refused(rank_errors(1, [&](int64_t) { Trainer t(by_checkpoints); }),
                   {"checkpoint.folder '" + checkpoints + "' " + holder, "--checkpoint.folder"});
    JobConfig by_link = small_job(b, 1, 2);
    by_link.checkpoint.folder = link;
    expect_refused(rank_errors(1, [&](int64_t) { Trainer t(by_link); }), {"checkpoint.folder '" + link + "' ", holder});
    JobConfig by_metrics = small_job(b, 1, 2);
    by_metrics.metrics.folder = metrics;
    expect_refused(rank_errors(1, [&](int64_t) { Trainer t(by_metrics); }),
                   {"metrics.folder '" + metrics + "' " + holder, "--metrics.folder"});
    JobConfig inside = small_job(checkpoints, 1, 2);  // A's checkpoint folder as B's dump folder
    expect_refused(rank_errors(1, [&](int64_t) { Trainer t(inside); }),
                   {"job.dump_folder '" + checkpoints + "' ", holder});

    EXPECT_TRUE(compat::path_exists(in_flight)) << "a refused job deleted the running job's temporary file";
    EXPECT_FALSE(compat::path_exists(metrics + "/metrics.jsonl")) << "a refused job wrote into A's metrics";
    EXPECT_FALSE(compat::path_exists(checkpoints + "/latest")) << "a refused job wrote into A's checkpoints";
  });
  // One folder named twice by the same job (checkpoint.folder = metrics.folder = the dump
  // folder, once through the symlink) is locked once, not refused as another job's.
  JobConfig same = small_job(fresh_dir("lock_same"), 1, 2);
  same.checkpoint.folder = same.dump_folder;
  same.metrics.folder = same.dump_folder;
  run_ranks(1, [&](int64_t) { Trainer(same).train(); });
  ::unlink(link.c_str());
}

// Real processes: the first job (hp-run, 2 ranks) is paused in the middle of its save
// (HP_PAUSE_AT, fault_injection.h) with its temporary file on disk; a second hp-train in
// the same folder is refused and leaves it alone; the first then finishes normally.
TEST(DumpFolderLock, AJobPausedInItsSaveKeepsItsFolder) {
  const std::string dir = fresh_dir("paused");
  const std::string job =
      " --model.dim 32 --model.n_layers 1 --model.n_heads 4 --model.vocab_size 512"
      " --model.multiple_of 16 --model.max_seq_len 32 --training.seq_len 16"
      " --training.batch_size 4 --lr_scheduler.warmup_steps 1 --validation.enable false"
      " --metrics.enable_plot false --checkpoint.enable --checkpoint.interval 2"
      " --training.steps 2 --job.dump_folder " +
      dir;
  const std::string log = dir + ".first.log";
  hyper_parallel::testing::CommandResult first;
  std::thread runner([&] {
    first = run_command("HP_PAUSE_AT=rank_file.before_rename@0 " + binary_path("hp-run") + " --nproc-per-node 2 " +
                        binary_path("hp-train") + job + " --parallelism.tensor_parallel_degree 2 > " + log + " 2>&1");
  });
  // Wait for the pause; its line names the paused process.
  const std::string paused = "paused at rank_file.before_rename (rank 0, pid ";
  int64_t pid = 0;
  for (int i = 0; i < 1200 && pid == 0; ++i) {
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto at = text.find(paused);
    if (at != std::string::npos) pid = std::atoll(text.c_str() + at + paused.size());
    if (pid == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(pid, 0) << "the first job never paused";
  const std::string in_flight = compat::join_path(dir, "checkpoints/step-2/rank-0.pt.tmp-" + std::to_string(pid));
  EXPECT_TRUE(compat::path_exists(in_flight));
  const auto second = run_command(binary_path("hp-train") + job + " 2>&1");
  EXPECT_NE(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("is in use by another job (pid " + std::to_string(pid) + " on host "), std::string::npos)
      << second.output;
  EXPECT_TRUE(compat::path_exists(in_flight)) << "the refused job deleted the paused job's temporary file";
  ::kill(static_cast<pid_t>(pid), SIGCONT);
  runner.join();
  std::ifstream in(log);
  const std::string first_log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(first.exit_code, 0) << first_log;
  EXPECT_EQ(read_latest_marker(compat::join_path(dir, "checkpoints")), 2);
  EXPECT_EQ(read_metrics(compat::join_path(dir, "metrics/metrics.jsonl")).size(), 2u) << "metrics written twice";
  compat::remove_all(dir);
  ::unlink(log.c_str());
}

// Probe: a dump folder that is a file said only "File exists".
TEST(DumpFolderLock, AFileInPlaceOfTheDumpFolderIsNamedAsSuch) {
  const std::string file = fresh_dir("file");
  std::ofstream(file) << "not a folder";
  expect_refused(rank_errors(1, [&](int64_t) { Trainer t(small_job(file, 1, 2)); }),
                 {"job.dump_folder '" + file + "' is a file, not a folder"});
  std::string error;
  EXPECT_FALSE(compat::create_directories(file + "/sub", &error));
  EXPECT_NE(error.find("a file of that name is in the way"), std::string::npos) << error;
  ::unlink(file.c_str());
}

// --- 3. what defines the data -----------------------------------------------------------------

// Probe: a resume with another seed, batch size or corpus was accepted without a word.
TEST(DataIdentity, AResumeOnOtherDataIsRefusedNamingTheFieldUnlessAllowed) {
  JobConfig job = small_job(fresh_dir("data"), 1, 2);
  run_ranks(1, [&](int64_t) { Trainer(job).train(); });
  JobConfig seed = resumed(job, 4);
  seed.training.seed = 7;
  expect_refused(rank_errors(1, [&](int64_t) { Trainer t(seed); }),
                 {"training.seed: checkpoint 42, this job 7", "--checkpoint.allow_data_change"});
  JobConfig batch = resumed(job, 4);
  batch.training.batch_size = 8;
  expect_refused(rank_errors(1, [&](int64_t) { Trainer t(batch); }), {"training.batch_size: checkpoint 4, this job 8"});
  JobConfig seq = resumed(job, 4);
  seq.training.seq_len = 8;
  expect_refused(rank_errors(1, [&](int64_t) { Trainer t(seq); }), {"training.seq_len: checkpoint 16, this job 8"});
  seed.checkpoint.allow_data_change = true;
  run_ranks(1, [&](int64_t) { EXPECT_EQ(Trainer(seed).step(), 2); });
}

TEST(DataIdentity, AChangedTextCorpusIsNamedBySizeAndContent) {
  const std::string dir = fresh_dir("corpus");
  ASSERT_TRUE(compat::create_directories(dir));
  const std::string corpus = compat::join_path(dir, "corpus.txt");
  auto write_corpus = [&](const std::string& word) {
    std::ofstream out(corpus, std::ios::trunc);
    for (int i = 0; i < 400; ++i) out << "the " << word << " sat on the mat number " << i % 17 << ".\n";
  };
  write_corpus("cat");
  JobConfig job = small_job(compat::join_path(dir, "run"), 1, 2);
  job.training.data = corpus;
  run_ranks(1, [&](int64_t) { Trainer(job).train(); });
  write_corpus("dog");  // same size, other words: another word -> id table
  expect_refused(rank_errors(1, [&](int64_t) { Trainer t(resumed(job, 4)); }), {"training.data (content CRC-32C)"});
  // Probe: a moved but byte-identical corpus was refused with two JSON records and no word
  // that only the path differed. The same bytes elsewhere are the same data, said once.
  write_corpus("cat");
  const std::string moved = compat::join_path(dir, "moved.txt");
  ASSERT_EQ(std::rename(corpus.c_str(), moved.c_str()), 0);
  JobConfig elsewhere = resumed(job, 3);
  elsewhere.training.data = moved;
  std::ostringstream log;
  run_ranks(1, [&](int64_t) { EXPECT_EQ(Trainer(elsewhere, &log).step(), 2); });
  EXPECT_NE(log.str().find("training.data moved from \"" + corpus + "\" to \"" + moved + "\": the same bytes"),
            std::string::npos)
      << log.str();
  ASSERT_EQ(std::rename(moved.c_str(), corpus.c_str()), 0);
  JobConfig synthetic = resumed(job, 4);
  synthetic.training.data = "";
  expect_refused(rank_errors(1, [&](int64_t) { Trainer t(synthetic); }),
                 {"training.data: checkpoint \"", "this job \"synthetic\"", "tokenizer: checkpoint"});
}

// --- 4. folders checked at start ----------------------------------------------------------------

// Probe: an unwritable checkpoint folder was found at the first save, after a whole
// interval of training. (/sys/kernel refuses new files even to root.)
TEST(StorageChecks, AnUnwritableFolderIsFoundAtStart) {
  if (::access("/sys/kernel", F_OK) != 0) GTEST_SKIP() << "no /sys/kernel here";
  {
    std::string error;
    try {
      check_writable_folder("/sys/kernel", "probe", "0");
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (error.empty()) GTEST_SKIP() << "/sys/kernel is writable here";
  }
  JobConfig ckpt_job = small_job(fresh_dir("ro_ckpt"), 1, 2);
  ckpt_job.checkpoint.folder = "/sys/kernel";
  expect_refused(rank_errors(1, [&](int64_t) { Trainer t(ckpt_job); }),
                 {"checkpoint.folder: cannot write a file in '/sys/kernel'", "checked at start"});
  JobConfig metrics_job = small_job(fresh_dir("ro_metrics"), 1, 2);
  metrics_job.metrics.folder = "/sys/kernel";
  expect_refused(rank_errors(1, [&](int64_t) { Trainer t(metrics_job); }),
                 {"metrics.folder: cannot write a file in '/sys/kernel'"});
}

TEST(StorageChecks, TooLittleRoomForACheckpointIsAWarning) {
  const auto free = free_bytes(compat::temp_directory());
  ASSERT_TRUE(free.has_value());
  EXPECT_GT(*free, 0);
  EXPECT_FALSE(room_warning("/x", 2 << 20, 1 << 20).has_value());
  const auto warning = room_warning("/x", 1 << 20, 3 << 20);
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("'/x' has 1.0 MiB free, less than one checkpoint (about 3.0 MiB"), std::string::npos)
      << *warning;
}

// --- 5. errors that name their cause -------------------------------------------------------------

// Probe: `latest` naming a missing step said "the save did not complete" without naming
// the step to go back to.
TEST(ResumeMessages, AMissingStepBehindLatestNamesTheLastVerifiedStepAndTheFlag) {
  JobConfig job = small_job(fresh_dir("missing"), 1, 4);
  job.checkpoint.interval = 2;
  run_ranks(1, [&](int64_t) { Trainer(job).train(); });
  compat::remove_all(checkpoint_path(job, "step-4"));
  expect_refused(rank_errors(1, [&](int64_t) { Trainer t(resumed(job, 6)); }),
                 {"names step 4, but", "step-4' does not exist",
                  "the last verified step before it is 2: resume from it with --checkpoint.resume "
                  "--checkpoint.load_step 2"});
  JobConfig from_two = resumed(job, 6);
  from_two.checkpoint.load_step = 2;
  run_ranks(1, [&](int64_t) { EXPECT_EQ(Trainer(from_two).step(), 2); });
}

// Probe: a collective timeout printed Gloo's text alone.
TEST(ResumeMessages, ACollectiveTimeoutNamesTheOperationTheMeshAndTheSetting) {
  std::string error;
  run_ranks(
      2,
      [&](int64_t rank) {
        DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
        if (rank == 1) {  // never arrives (and keeps its end of the connection open meanwhile)
          std::this_thread::sleep_for(std::chrono::seconds(4));
          return;
        }
        at::Tensor t = at::ones({4});
        try {
          mesh.comm(0).all_reduce_(t, ReduceOp::Sum);
        } catch (const std::exception& e) {
          error = error_text(e);
        }
      },
      std::chrono::milliseconds(1500));
  for (const char* needle : {"all_reduce over mesh dim 'tp' of mesh [tp=2] (global ranks 0, 1; this is rank 0)",
                             "did not arrive within the collective timeout of 1.5 s", "HP_COLLECTIVE_TIMEOUT_S"}) {
    EXPECT_NE(error.find(needle), std::string::npos) << "expected '" << needle << "' in: " << error;
  }
}

}  // namespace trainer_safety_test
