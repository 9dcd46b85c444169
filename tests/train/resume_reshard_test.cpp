// resume_reshard_test.cpp — a checkpoint saved at TP 2 resumes at TP 4, 1 and 3 (uneven
// pieces): the resumed state is the saved state bit for bit, re-cut for the new degree
// (parameters and AdamW moments), and the losses after the resume match an uninterrupted
// run at the new degree. A different model, and a missing or damaged file that a rank
// needs only because of the resharding, stop every rank with an error naming them.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "compat/file_system.h"
#include "harness/rank_harness.h"
#include "harness/train_steps.h"
#include "hyper_parallel/core/communicator.h"
#include "io/whole_file.h"
#include "train/checkpoint/checkpoint_io.h"
#include "train/checkpoint/checkpoint_manifest.h"
#include "hyper_parallel_train/trainer.h"

namespace resume_reshard_test {

using namespace hyper_parallel;
using namespace hyper_parallel::train;
using hyper_parallel::testing::checkpoint_path;
using hyper_parallel::testing::run_command;
using hyper_parallel::testing::run_ranks;
using hyper_parallel::testing::train_steps;

namespace {

constexpr int64_t kSavedTp = 2;
constexpr int64_t kSavedAt = 4;
constexpr int64_t kSteps = 8;

std::string fresh_dir(const std::string& name) {
  static int counter = 0;
  const std::string dir =
      compat::join_path(compat::temp_directory(), "hp_resume_reshard_" + name + "_" + std::to_string(::getpid()) + "_" +
                                                      std::to_string(counter++));
  compat::remove_all(dir);
  return dir;
}

// 12 heads and an MLP of 96 divide by 2, 3 and 4; a vocabulary of 515 by none of them.
JobConfig job_at(const std::string& dump, int64_t tp) {
  JobConfig c;
  c.dump_folder = dump;
  c.model.dim = 48;
  c.model.n_layers = 2;
  c.model.n_heads = 12;
  c.model.ffn_hidden_dim = 96;
  c.model.vocab_size = 515;
  c.model.max_seq_len = 32;
  c.training.batch_size = 4;
  c.training.seq_len = 16;
  c.training.steps = kSteps;
  c.lr_scheduler.warmup_steps = 2;
  c.training.lr = 3e-3;
  c.parallelism.tensor_parallel_degree = tp;
  c.validation.enable = false;
  c.checkpoint.enable = true;
  c.checkpoint.interval = kSavedAt;
  c.metrics.enable_plot = false;
  return c;
}

JobConfig resumed_at(JobConfig job, int64_t tp) {
  job.checkpoint.resume = true;
  job.parallelism.tensor_parallel_degree = tp;
  return job;
}

std::string error_text(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

// TP 2 for kSavedAt steps of a kSteps-step job (its LR schedule), then a save.
JobConfig saved_at_tp2(const std::string& name) {
  JobConfig job = job_at(fresh_dir(name), kSavedTp);
  train_steps(job, 1, kSavedAt, /*save=*/true);
  return job;
}

std::vector<double> losses_of(const std::vector<StepResult>& r) {
  std::vector<double> out;
  for (const auto& s : r) out.push_back(s.loss);
  return out;
}

// Every tensor of a step's rank files as one global tensor (the pieces concatenated
// along the dim the manifest's layout names); the files are the test's own.
std::map<std::string, at::Tensor> global_state(const std::string& step_dir) {
  const StepManifest m = read_manifest(step_dir);
  EXPECT_TRUE(m.tensors.has_value());
  std::map<std::string, std::vector<at::Tensor>> pieces;
  for (const auto& f : m.files) {
    for (const auto& [key, t] : read_tensor_file(compat::join_path(step_dir, f.file)).tensors) pieces[key].push_back(t);
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, list] : pieces) {
    const TensorLayout& l = m.tensors->at(key);
    if (l.shard_dim >= 0) {
      out[key] = at::cat(list, l.shard_dim);
    } else {
      for (const auto& t : list) EXPECT_TRUE(at::equal(t, list.front())) << key << ": replicas differ";
      out[key] = list.front();
    }
    EXPECT_EQ(out[key].sizes().vec(), l.shape) << key;
  }
  return out;
}

// Resumes the TP 2 checkpoint at `tp` in a copy of its folder, saves the resumed state at
// once (the new layout's files), trains to the end; rank 0's step results.
std::vector<StepResult> resume_copy_at(const JobConfig& saved, int64_t tp, JobConfig* copy) {
  *copy = resumed_at(saved, tp);
  copy->dump_folder = fresh_dir("copy_tp" + std::to_string(tp));
  EXPECT_EQ(run_command("cp -r " + saved.dump_folder + " " + copy->dump_folder).exit_code, 0);
  std::vector<StepResult> out;
  run_ranks(tp, [&](int64_t rank) {
    Trainer t(*copy);
    EXPECT_EQ(t.step(), kSavedAt);
    t.save_checkpoint();
    auto r = t.train();
    if (rank == 0) out = r;
  });
  return out;
}

// Constructs a Trainer for `job` on every rank; returns each rank's error ("" if none).
std::vector<std::string> construction_errors(const JobConfig& job) {
  const int64_t ranks = job.parallelism.tensor_parallel_degree;
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  run_ranks(ranks, [&](int64_t rank) {
    try {
      Trainer t(job);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(rank)] = error_text(e);
    }
  });
  return errors;
}

std::string all_of(const std::vector<std::string>& errors) {
  std::string all;
  for (size_t r = 0; r < errors.size(); ++r) all += "[rank " + std::to_string(r) + "] " + errors[r] + "\n";
  return all;
}

}  // namespace

TEST(ResumeReshard, SavedAtTp2ResumesAtTp4Tp1AndTp3AsAnUninterruptedRunThere) {
  const JobConfig saved = saved_at_tp2("tp2");
  const auto saved_state = global_state(checkpoint_path(saved, "step-" + std::to_string(kSavedAt)));
  ASSERT_TRUE(saved_state.count("optim.0.exp_avg_sq")) << "the checkpoint holds AdamW's moments";
  for (int64_t tp : {4, 1, 3}) {
    SCOPED_TRACE("resumed at TP " + std::to_string(tp));
    JobConfig copy;
    const auto resumed = resume_copy_at(saved, tp, &copy);
    // The state right after the resume, saved in the new layout: the same global tensors,
    // bit for bit (parameters, both moments, step counters), in torch.chunk pieces of tp.
    const std::string dir = checkpoint_path(copy, "step-" + std::to_string(kSavedAt));
    const StepManifest m = read_manifest(dir);
    EXPECT_EQ(m.identity.tensor_parallel_degree, tp);
    const auto state = global_state(dir);
    ASSERT_EQ(state.size(), saved_state.size());
    for (const auto& [key, t] : saved_state) {
      ASSERT_TRUE(state.count(key)) << key;
      EXPECT_TRUE(at::equal(state.at(key), t)) << key << " changed in the resharding";
      const TensorLayout& l = m.tensors->at(key);
      if (l.shard_dim < 0) continue;
      for (const auto& f : m.files) {  // each file holds its torch.chunk piece
        const ChunkRange c = chunk_range(l.shape[static_cast<size_t>(l.shard_dim)], tp, f.rank);
        EXPECT_TRUE(at::equal(read_tensor_file(compat::join_path(dir, f.file)).tensors.at(key),
                              t.narrow(l.shard_dim, c.offset, c.length)))
            << key << " on rank " << f.rank;
      }
    }
    // After the resume: as if the whole run had been at this degree.
    JobConfig straight = job_at(fresh_dir("straight_tp" + std::to_string(tp)), tp);
    straight.checkpoint.enable = false;
    std::vector<StepResult> full;
    run_ranks(tp, [&](int64_t rank) {
      auto r = Trainer(straight).train();
      if (rank == 0) full = r;
    });
    ASSERT_EQ(full.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(resumed.size(), static_cast<size_t>(kSteps - kSavedAt));
    double worst = 0;
    for (size_t i = 0; i < resumed.size(); ++i) {
      const StepResult& a = resumed[i];
      const StepResult& b = full[static_cast<size_t>(kSavedAt) + i];
      EXPECT_EQ(a.step, b.step);
      const double rel = std::abs(a.loss - b.loss) / std::abs(b.loss);
      worst = std::max(worst, rel);
      EXPECT_LT(rel, 1e-5) << "step " << a.step << ": resumed " << a.loss << ", uninterrupted " << b.loss;
    }
    std::printf(
        "TP 2 -> TP %lld: steps %lld-%lld, largest relative loss difference to an uninterrupted TP %lld "
        "run: %.3g\n",
        static_cast<long long>(tp), static_cast<long long>(kSavedAt + 1), static_cast<long long>(kSteps),
        static_cast<long long>(tp), worst);
    compat::remove_all(copy.dump_folder);
    compat::remove_all(straight.dump_folder);
  }
  compat::remove_all(saved.dump_folder);
}

TEST(ResumeReshard, AnotherModelIsRefusedNamingTheFieldAndTheTensor) {
  const JobConfig saved = saved_at_tp2("othermodel");
  JobConfig other = resumed_at(saved, 4);
  other.model.dim = 24;  // 12 heads of 2
  const std::string all = all_of(construction_errors(other));
  for (const char* needle :
       {"model.dim: checkpoint 48, this job 24",
        "tensor model.tok_embeddings.weight: checkpoint [515, 48] Float, this job [515, 24] Float",
        "tensor model.layers.0.attention.wq.weight: checkpoint [48, 48] Float, this job [24, 24] Float"}) {
    EXPECT_NE(all.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << all;
  }
  JobConfig vocab = resumed_at(saved, 1);
  vocab.model.vocab_size = 512;
  const std::string v = all_of(construction_errors(vocab));
  EXPECT_NE(v.find("model.vocab_size: checkpoint 515, this job 512"), std::string::npos) << v;
  EXPECT_NE(v.find("tensor model.output.weight: checkpoint [515, 48] Float, this job [512, 48] Float"),
            std::string::npos)
      << v;
  JobConfig fewer = resumed_at(saved, 3);
  fewer.model.n_layers = 1;
  const std::string f = all_of(construction_errors(fewer));
  EXPECT_NE(f.find("model.n_layers: checkpoint 2, this job 1"), std::string::npos) << f;
  EXPECT_NE(f.find("tensor model.layers.1.attention.wq.weight: checkpoint [48, 48] Float, not in this job"),
            std::string::npos)
      << f;
  compat::remove_all(saved.dump_folder);
}

// A checkpoint of an hp-train that recorded no n_kv_heads, head_dim or tie_word_embeddings
// resumes where the job builds what it built (no GQA, heads of dim / n_heads, untied) and is
// refused, naming the key, where it does not; with a recorded config.json that file decides.
TEST(ResumeReshard, SizesAnOlderHpTrainDidNotRecordAreTheOnesItBuilt) {
  CheckpointIdentity older;
  older.dtype = "float32";
  older.model = {
      {"name", "llama"},       {"dim", 48},        {"n_layers", 2},         {"n_heads", 12},     {"vocab_size", 515},
      {"ffn_hidden_dim", 128}, {"norm_eps", 1e-5}, {"rope_theta", 10000.0}, {"max_seq_len", 512}};
  CheckpointIdentity job = older;
  job.model["n_kv_heads"] = 12;
  job.model["head_dim"] = 4;
  job.model["tie_word_embeddings"] = false;
  EXPECT_TRUE(model_mismatches(older, job).empty());
  CheckpointIdentity gqa = job;
  gqa.model["n_kv_heads"] = 4;
  gqa.model["tie_word_embeddings"] = true;
  const std::string all = all_of(model_mismatches(older, gqa));
  EXPECT_NE(all.find("model.n_kv_heads: checkpoint 12, this job 4"), std::string::npos) << all;
  EXPECT_NE(all.find("model.tie_word_embeddings: checkpoint false, this job true"), std::string::npos) << all;
  CheckpointIdentity older_from_config = older;
  older_from_config.model["hf_config"] = {{"model_type", "llama"}};
  gqa.model["hf_config"] = older_from_config.model["hf_config"];
  EXPECT_TRUE(model_mismatches(older_from_config, gqa).empty());
}

TEST(ResumeReshard, AMissingOrDamagedFileThatARankNowNeedsStopsEveryRank) {
  const JobConfig saved = saved_at_tp2("damaged");
  const std::string step_dir = checkpoint_path(saved, "step-" + std::to_string(kSavedAt));
  const std::string rank1 = compat::join_path(step_dir, "rank-1.pt");
  // At TP 4, ranks 2 and 3 hold the second half of every sharded tensor: saved rank 1's
  // file. Ranks 0 and 1 never open it, and still stop.
  {
    const int64_t size = compat::file_size(rank1);
    std::fstream f(rank1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(size / 2);
    f.put('\x7f');
  }
  auto errors = construction_errors(resumed_at(saved, 4));
  std::string all = all_of(errors);
  for (int64_t r : {2, 3}) {
    const std::string& e = errors[static_cast<size_t>(r)];
    EXPECT_NE(e.find("step-4/rank-1.pt' does not verify"), std::string::npos) << all;
    EXPECT_NE(e.find("rank " + std::to_string(r) + " needs it to reshard the checkpoint from TP 2 to TP 4"),
              std::string::npos)
        << all;
  }
  for (int64_t r : {0, 1}) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("loading the checkpoint failed on rank(s) 2, 3"), std::string::npos)
        << all;
  }
  // Missing altogether, resumed at TP 1: the one rank names it.
  ASSERT_EQ(std::remove(rank1.c_str()), 0);
  errors = construction_errors(resumed_at(saved, 1));
  EXPECT_NE(errors[0].find("step-4/rank-1.pt"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("needs it to reshard the checkpoint from TP 2 to TP 1"), std::string::npos) << errors[0];
  compat::remove_all(saved.dump_folder);
}

TEST(ResumeReshard, ACheckpointWithoutLayoutsResumesOnlyAtItsOwnDegree) {
  // As an hp-train before resharding wrote it: a manifest without "tensors".
  const JobConfig saved = saved_at_tp2("nolayouts");
  const std::string manifest = checkpoint_path(saved, "step-" + std::to_string(kSavedAt) + "/" + kManifestName);
  nlohmann::json j = nlohmann::json::parse(io::read_whole_file(manifest));
  ASSERT_TRUE(j.contains("tensors"));
  j.erase("tensors");
  std::ofstream(manifest, std::ios::trunc) << j.dump(1);
  const auto refused = all_of(construction_errors(resumed_at(saved, 4)));
  EXPECT_NE(refused.find("recorded no tensor layouts"), std::string::npos) << refused;
  EXPECT_NE(refused.find("--parallelism.tensor_parallel_degree 2"), std::string::npos) << refused;
  const auto same = construction_errors(resumed_at(saved, 2));
  EXPECT_EQ(same, std::vector<std::string>(2)) << all_of(same);
  compat::remove_all(saved.dump_folder);
}

TEST(ResumeReshard, ADataParallelCheckpointIsReadFromOneReplica) {
  // The TP 2 checkpoint rewritten as a dp 2 x tp 2 job saves it: replica 1's files are
  // replica 0's tensors under ranks 2 and 3 (dp replicas hold the same state).
  const JobConfig saved = saved_at_tp2("dp2");
  const std::string dir = checkpoint_path(saved, "step-" + std::to_string(kSavedAt));
  const auto saved_state = global_state(dir);
  const StepManifest tp2 = read_manifest(dir);
  CheckpointIdentity id = tp2.identity;
  id.world_size = 4;
  id.data_parallel_degree = 2;
  const std::vector<TensorFile> replica0 = {read_tensor_file(compat::join_path(dir, "rank-0.pt")),
                                            read_tensor_file(compat::join_path(dir, "rank-1.pt"))};
  for (int64_t r = 0; r < 4; ++r) {
    write_tensor_file(compat::join_path(dir, rank_file_name(r)), replica0[static_cast<size_t>(r % 2)].tensors,
                      rank_file_metadata(id, r));
  }
  StepManifest dp2 = verify_step_files(dir, id);
  dp2.tensors = tp2.tensors;
  write_manifest(dir, dp2, 0);
  // A dp rank 0 job never opens replica 1: without its files the resume still works.
  ASSERT_EQ(std::remove(compat::join_path(dir, "rank-2.pt").c_str()), 0);
  ASSERT_EQ(std::remove(compat::join_path(dir, "rank-3.pt").c_str()), 0);
  for (int64_t tp : {4, 1}) {
    SCOPED_TRACE("resumed at TP " + std::to_string(tp));
    JobConfig copy = resumed_at(saved, tp);
    copy.dump_folder = fresh_dir("dp2_copy_tp" + std::to_string(tp));
    ASSERT_EQ(run_command("cp -r " + saved.dump_folder + " " + copy.dump_folder).exit_code, 0);
    std::ostringstream log;
    run_ranks(tp, [&](int64_t rank) {
      Trainer t(copy, rank == 0 ? &log : nullptr);
      EXPECT_EQ(t.step(), kSavedAt);
      t.save_checkpoint();
    });
    const std::string files = tp == 4 ? "1" : "2";
    EXPECT_NE(log.str().find("resharded the checkpoint of step 4 from dp 2 x tp 2 to dp 1 x tp " + std::to_string(tp) +
                             " (rank 0 read " + files + " of its 4 files)"),
              std::string::npos)
        << log.str();
    const auto state = global_state(checkpoint_path(copy, "step-" + std::to_string(kSavedAt)));
    ASSERT_EQ(state.size(), saved_state.size());
    for (const auto& [key, t] : saved_state) EXPECT_TRUE(at::equal(state.at(key), t)) << key;
    compat::remove_all(copy.dump_folder);
  }
  compat::remove_all(saved.dump_folder);
}

}  // namespace resume_reshard_test
