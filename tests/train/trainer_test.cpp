// The Trainer: loss curves agree across TP 1, TP 2 with loss parallel and TP 2 without,
// and resuming from a checkpoint continues exactly.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <iostream>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "compat/file_system.h"
#include "harness/rank_harness.h"
#include "harness/train_steps.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel_train/config/job_config.h"
#include "train/metrics/metrics.h"
#include "train/optim/optim_utils.h"
#include "hyper_parallel_train/trainer.h"

namespace trainer_test {

using namespace hyper_parallel;
using namespace hyper_parallel::train;
using hyper_parallel::testing::run_ranks;
using ::testing::HasSubstr;

namespace {

JobConfig tiny_job(const std::string& dump, int64_t tp, bool disable_lp, int64_t steps) {
  JobConfig c;
  c.dump_folder = dump;
  c.model.dim = 32;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.vocab_size = 515;  // uneven over 2 ranks
  c.model.multiple_of = 16;
  c.model.max_seq_len = 32;
  c.training.batch_size = 4;
  c.training.seq_len = 16;
  c.training.steps = steps;
  c.lr_scheduler.warmup_steps = 3;
  c.training.lr = 3e-3;
  c.parallelism.tensor_parallel_degree = tp;
  c.parallelism.disable_loss_parallel = disable_lp;
  c.validation.enable = true;
  c.validation.freq = 5;
  c.validation.steps = 2;
  c.checkpoint.enable = false;
  c.metrics.enable_plot = false;
  return c;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir =
      compat::join_path(compat::temp_directory(), "hp_trainer_test_" + name + "_" + std::to_string(::getpid()));
  compat::remove_all(dir);
  return dir;
}

std::vector<StepResult> train_on(int64_t tp, JobConfig job) {
  std::vector<StepResult> out;
  run_ranks(tp, [&](int64_t rank) {
    Trainer trainer(job);
    EXPECT_EQ(trainer.loss_parallel_enabled(), tp > 1 && !job.parallelism.disable_loss_parallel);
    auto r = trainer.train();
    if (rank == 0) out = r;
  });
  return out;
}

void expect_same_curves(const std::vector<StepResult>& a, const std::vector<StepResult>& b, double rel,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i].loss, b[i].loss, rel * std::abs(b[i].loss)) << what << " step " << a[i].step;
    ASSERT_EQ(a[i].val_loss.has_value(), b[i].val_loss.has_value());
    if (a[i].val_loss) EXPECT_NEAR(*a[i].val_loss, *b[i].val_loss, rel * std::abs(*b[i].val_loss)) << what;
  }
}

}  // namespace

TEST(Trainer, LossCurvesAgreeForTp1Tp2WithAndWithoutLossParallel) {
  const int64_t steps = 20;
  auto tp1 = train_on(1, tiny_job(fresh_dir("tp1"), 1, false, steps));
  auto tp2_lp = train_on(2, tiny_job(fresh_dir("tp2lp"), 2, false, steps));
  auto tp2_no = train_on(2, tiny_job(fresh_dir("tp2no"), 2, true, steps));
  ASSERT_EQ(tp1.size(), static_cast<size_t>(steps));
  EXPECT_LT(tp1.back().loss, tp1.front().loss - 0.5) << "the loss falls";
  expect_same_curves(tp2_lp, tp1, 1e-4, "TP 2 with loss parallel vs TP 1");
  expect_same_curves(tp2_no, tp1, 1e-4, "TP 2 without loss parallel vs TP 1");
}

// --training.fused_linear_loss: the head matmul and the loss fused (no logits tensor) train
// as the head + cross_entropy do. Float32; the two differ only in summation order, so
// per-step losses (and validation losses) agree to 1e-4 relative over 20 AdamW steps.
TEST(Trainer, FusedLinearLossTrainsAsTheUnfusedHeadAtTp1Tp2Tp4) {
  const int64_t steps = 20;
  for (int64_t tp : {1, 2, 4}) {
    auto unfused = train_on(tp, tiny_job(fresh_dir("unfused" + std::to_string(tp)), tp, false, steps));
    JobConfig job = tiny_job(fresh_dir("fused" + std::to_string(tp)), tp, false, steps);
    job.training.fused_linear_loss = true;
    auto fused = train_on(tp, job);
    ASSERT_EQ(fused.size(), static_cast<size_t>(steps));
    EXPECT_LT(fused.back().loss, fused.front().loss - 0.5) << "the loss falls";
    expect_same_curves(fused, unfused, 1e-4, "fused linear loss vs head + cross_entropy at TP " + std::to_string(tp));
    double worst = 0;
    for (size_t i = 0; i < fused.size(); ++i) worst = std::max(worst, std::abs(fused[i].loss / unfused[i].loss - 1));
    std::cout << "TP " << tp << ": largest relative loss difference over " << steps << " steps: " << worst << std::endl;
  }
}

// A vocabulary of 4 words at TP 3: torch.chunk gives the embedding and the head 2, 2 and 0
// rows, so rank 2 holds no word and still joins every collective. Float64: the same losses as
// TP 1, through the unfused head + loss_parallel and the fused linear loss.
TEST(Trainer, ARankWithNoWordOfTheVocabularyTrainsAsTp1) {
  const std::string dir = fresh_dir("tiny_vocab");
  compat::create_directories(dir);
  const std::string text = compat::join_path(dir, "words.txt");
  {
    std::ofstream f(text);
    for (int i = 0; i < 100; ++i) f << "a b c a b c a a b b c c a b c\n";
  }
  auto job = [&](int64_t tp, bool fused) {
    JobConfig c = tiny_job(compat::join_path(dir, std::to_string(tp) + (fused ? "f" : "")), tp, false, 3);
    c.model.vocab_size = 4;  // <pad>, <unk> and two of the text's three words
    c.model.n_heads = 3;
    c.model.dim = 48;
    c.model.ffn_hidden_dim = 96;
    c.training.dtype = "float64";
    c.training.data = text;
    c.training.fused_linear_loss = fused;
    return c;
  };
  const auto tp1 = train_on(1, job(1, false));
  for (bool fused : {false, true}) {
    expect_same_curves(train_on(3, job(3, fused)), tp1, 1e-12, fused ? "fused linear loss, TP 3" : "TP 3");
  }
}

// [training] z_loss_weight and logit_softcap reach every loss path: the loss_parallel
// kernel (TP 2), the fused head + loss (TP 1 and 2) and the plain cross-entropy on whole
// logits (TP 1, and TP 2 without loss parallel), which must train alike. Float32, 1e-4
// relative as the other curve tests; the terms must change the loss (not be ignored).
TEST(Trainer, ZLossAndLogitSoftcapTrainAlikeOnEveryLossPath) {
  const int64_t steps = 10;
  auto job = [&](const std::string& name, int64_t tp, bool disable_lp, bool fused, bool terms) {
    JobConfig c = tiny_job(fresh_dir(name), tp, disable_lp, steps);
    c.training.fused_linear_loss = fused;
    if (terms) {
      c.training.loss_terms.z_loss_weight = 1e-3;
      c.training.loss_terms.logit_softcap = 2.0;
    }
    return c;
  };
  auto tp1 = train_on(1, job("zc_tp1", 1, false, false, true));
  auto plain = train_on(1, job("zc_plain", 1, false, false, false));
  ASSERT_EQ(tp1.size(), static_cast<size_t>(steps));
  EXPECT_GT(std::abs(tp1[0].loss - plain[0].loss), 1e-3 * plain[0].loss) << "the terms change the loss";
  expect_same_curves(train_on(1, job("zc_tp1f", 1, false, true, true)), tp1, 1e-4, "fused at TP 1");
  expect_same_curves(train_on(2, job("zc_tp2lp", 2, false, false, true)), tp1, 1e-4, "loss parallel at TP 2");
  expect_same_curves(train_on(2, job("zc_tp2no", 2, true, false, true)), tp1, 1e-4, "gathered logits at TP 2");
  expect_same_curves(train_on(2, job("zc_tp2f", 2, false, true, true)), tp1, 1e-4, "fused at TP 2");
}

// The z-loss is part of the training loss (what is minimised) and not of the validation
// loss (cross-entropy alone, comparable across runs). With a learning rate of 1e-30 the
// weights do not move, so validation with and without the z-loss sees the same model.
TEST(Trainer, ZLossIsInTheTrainingLossAndNotInTheValidationLoss) {
  for (bool fused : {false, true}) {
    auto run = [&](double z) {
      JobConfig c = tiny_job(fresh_dir("zval" + std::to_string(z > 0) + std::to_string(fused)), 2, false, 5);
      c.training.lr = 1e-30;
      c.training.fused_linear_loss = fused;
      c.training.loss_terms.z_loss_weight = z;
      return train_on(2, c);
    };
    const double z = 1e-2;
    auto with = run(z), without = run(0);
    ASSERT_TRUE(with.back().val_loss && without.back().val_loss);
    EXPECT_NEAR(*with.back().val_loss, *without.back().val_loss, 1e-6 * *without.back().val_loss)
        << "validation is cross-entropy alone (fused " << fused << ")";
    // lse >= log V + the mean logit (Jensen); the mean logit of the initial model is ~0.
    const double ln_v = std::log(515.0);
    EXPECT_GT(with[0].loss - without[0].loss, 0.5 * z * ln_v * ln_v) << "the training loss holds the z-loss";
  }
}

// --parallelism.sequence_parallel: 20 AdamW steps at TP 2 (and 4) with sequence parallel
// train as TP 1 does, with loss parallel, with the gathered head and with the fused
// linear loss. seq_len 15 splits unevenly (8 + 7, 4+4+4+3). The gradient norm (clipping)
// must agree too: the norms' weights are replicated, counted once and not tp times.
// Float32: per-step loss, validation loss and gradient norm within 1e-4 relative.
TEST(Trainer, SequenceParallelTrainsAsTp1) {
  const int64_t steps = 20;
  auto job = [&](const std::string& name, int64_t tp, bool sp) {
    JobConfig c = tiny_job(fresh_dir(name), tp, false, steps);
    c.training.seq_len = 15;
    c.parallelism.sequence_parallel = sp;
    return c;
  };
  auto tp1 = train_on(1, job("sp_tp1", 1, false));
  ASSERT_EQ(tp1.size(), static_cast<size_t>(steps));
  EXPECT_LT(tp1.back().loss, tp1.front().loss - 0.5) << "the loss falls";
  struct Case {
    int64_t tp;
    bool disable_lp, fused;
  };
  for (const Case& c : {Case{2, false, false}, Case{2, true, false}, Case{2, false, true}, Case{4, false, false}}) {
    JobConfig j = job("sp_tp" + std::to_string(c.tp), c.tp, true);
    j.parallelism.disable_loss_parallel = c.disable_lp;
    j.training.fused_linear_loss = c.fused;
    const std::string what = "TP " + std::to_string(c.tp) + " sequence parallel" +
                             (c.disable_lp ? " without loss parallel" : "") + (c.fused ? " fused" : "") + " vs TP 1";
    auto sp = train_on(c.tp, j);
    expect_same_curves(sp, tp1, 1e-4, what);
    double worst = 0;
    for (size_t i = 0; i < sp.size(); ++i) {
      EXPECT_NEAR(sp[i].grad_norm, tp1[i].grad_norm, 1e-4 * tp1[i].grad_norm) << what << " step " << sp[i].step;
      worst = std::max(worst, std::abs(sp[i].loss / tp1[i].loss - 1));
    }
    std::cout << what << ": largest relative loss difference over " << steps << " steps: " << worst << std::endl;
  }
}

TEST(Trainer, ResumingFromACheckpointContinuesExactly) {
  const std::string straight_dir = fresh_dir("straight"), split_dir = fresh_dir("split");
  JobConfig straight = tiny_job(straight_dir, 2, false, 20);
  auto full = train_on(2, straight);

  JobConfig first = tiny_job(split_dir, 2, false, 20);
  first.checkpoint.enable = true;
  first.checkpoint.interval = 10;
  // Stop after 10 steps: the same job (same LR schedule) cut short.
  hyper_parallel::testing::train_steps(first, 1, 10, /*save=*/true);
  JobConfig second = first;
  second.checkpoint.resume = true;
  std::vector<StepResult> rest;
  run_ranks(2, [&](int64_t rank) {
    Trainer t(second);
    EXPECT_EQ(t.step(), 10);
    auto r = t.train();
    if (rank == 0) rest = r;
  });
  ASSERT_EQ(rest.size(), 10u);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].step, full[10 + i].step);
    EXPECT_EQ(rest[i].loss, full[10 + i].loss) << "step " << rest[i].step << " must match bit for bit";
  }
  // Rank 0 logged JSON lines for every step it ran.
  auto records = read_metrics(split_dir + "/" + second.metrics.folder + "/metrics.jsonl");
  EXPECT_EQ(records.size(), 10u);
}

// Ranks sharing a node must not each take every core (hp-run and torchrun set
// OMP_NUM_THREADS=1 for them): the start-up line and every metrics record say how many
// intra-op threads each rank runs, so an oversubscribed job shows it.
TEST(Trainer, StartUpLineAndMetricsNameTheIntraOpThreadsPerRank) {
  const std::string dir = fresh_dir("threads");
  JobConfig job = tiny_job(dir, 2, false, 2);
  std::ostringstream log;
  run_ranks(2, [&](int64_t rank) {
    Trainer trainer(job, rank == 0 ? &log : nullptr);
    trainer.train();
  });
  const int threads = at::get_num_threads();
  EXPECT_THAT(log.str(), HasSubstr("; " + std::to_string(threads) + " intra-op thread")) << log.str();
  const auto records = read_metrics(dir + "/" + job.metrics.folder + "/metrics.jsonl");
  ASSERT_EQ(records.size(), 2u);
  for (const auto& r : records) EXPECT_EQ(r.at("intra_op_threads"), threads) << r.dump();
}

namespace {
int64_t resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}
}  // namespace

// The synthetic corpus grew with training.steps (100 000 steps: 2 GB and 18 s before
// step 1; 10 million: 166 GB): start-up must not depend on it.
TEST(Trainer, StartUpTimeAndMemoryDoNotGrowWithTrainingSteps) {
  for (int64_t steps : {int64_t{100'000}, int64_t{10'000'000}}) {
    SCOPED_TRACE(steps);
    JobConfig job = tiny_job(fresh_dir("startup"), 1, false, steps);
    const int64_t before = resident_kib();
    const auto start = std::chrono::steady_clock::now();
    run_ranks(1, [&](int64_t) {
      Trainer t(job);
      EXPECT_EQ(t.train_step(1).step, 1);
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double grown_mib = static_cast<double>(resident_kib() - before) / 1024.0;
    std::printf("training.steps %lld: Trainer + step 1 in %.3f s, resident +%.1f MiB\n", static_cast<long long>(steps),
                secs, grown_mib);
    ASSERT_LT(secs, 3.0) << "(< 1 s on an idle machine; the bound allows a loaded CI)";
    ASSERT_LT(grown_mib, 100.0);
  }
}

TEST(Trainer, ResumeWithoutCheckpointingIsRefused) {
  JobConfig job = tiny_job(fresh_dir("noresume"), 1, false, 2);
  job.checkpoint.resume = true;
  job.checkpoint.enable = false;
  run_ranks(1, [&](int64_t) {
    try {
      Trainer t(job);
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("checkpoint.enable"), std::string::npos) << e.what();
    }
  });
}

TEST(Trainer, ItsParallelismSettingsEndWithIt) {
  // A Trainer used to leave its ParallelismConfig behind: a later loss_parallel() guard in
  // the same process then silently activated nothing (disable_loss_parallel).
  const ParallelismConfig before = parallelism_config();
  run_ranks(1, [&](int64_t) {
    Trainer t(tiny_job(fresh_dir("settings"), 1, /*disable_lp=*/true, 2));
    EXPECT_TRUE(parallelism_config().disable_loss_parallel) << "the Trainer's settings apply while it lives";
  });
  EXPECT_EQ(parallelism_config().disable_loss_parallel, before.disable_loss_parallel);
}

TEST(Trainer, WorldSizeMustBeTheDataTimesTheTensorParallelDegree) {
  run_ranks(2, [&](int64_t) {
    try {
      Trainer t(tiny_job(fresh_dir("mismatch"), 4, false, 2));
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "data_parallel_degree x tensor_parallel_degree = 1 x 4 = 4 ranks, but the job has 2"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(ClipGradNorm, GradientsOnSeveralMeshesGiveTheFullNormWithoutDeadlock) {
  // Buckets on three groups (tp, dp, both): every rank must reduce them in the same order.
  // (An order by process-group addresses differed per rank about one run in two, pairing
  // all-reduces of different buckets: a wrong norm or a deadlock. Fresh meshes each round.)
  for (int round = 0; round < 4; ++round)
    run_ranks(
        4,
        [](int64_t) {
          auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
          std::vector<std::pair<at::Tensor, Placements>> grads;
          std::vector<at::Tensor> params;
          double expected = 0;
          uint64_t seed = 50;
          auto add = [&](const DeviceMesh& m, const Placements& p) {
            at::Tensor full = hyper_parallel::testing::random_tensor({4, 6}, seed++);
            expected += full.pow(2).sum().item<double>();
            at::Tensor param = distribute_tensor(at::zeros({4, 6}, at::kDouble), m, p).set_requires_grad(true);
            param.mutable_grad() = distribute_tensor(full, m, p);
            params.push_back(param);
          };
          for (int i = 0; i < 3; ++i) {
            add(mesh["tp"], {Shard(0)});
            add(mesh["dp"], {Shard(1)});
            add(mesh, {Shard(0), Shard(1)});
          }
          const double norm = clip_grad_norm_(params, 1e9);
          EXPECT_NEAR(norm, std::sqrt(expected), 1e-9 * std::sqrt(expected));
        },
        std::chrono::seconds(10));
}

}  // namespace trainer_test
