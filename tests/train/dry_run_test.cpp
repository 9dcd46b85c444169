// hp-dry-run's pieces (train/dry_run.h, train/memory_formula.h): a job of 64 ranks built
// in one process on meta tensors holds, at every rank position asked, exactly the state the
// closed-form formula gives; its step issues the collectives a real step issues; a world
// the degrees do not multiply to is refused as hp-train refuses it; TP's DTensors on meta
// tensors keep their own kernels.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <fstream>
#include <vector>

#include "compat/file_system.h"
#include "harness/scratch_folder.h"
#include "harness/train_steps.h"
#include "hyper_parallel/nn/activation_checkpoint.h"
#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/distributed.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/loss/loss_parallel.h"
#include "hyper_parallel/nn/parameters_on_meta.h"
#include "hyper_parallel_train/config/job_config.h"
#include "train/dry_run.h"
#include "train/memory_formula.h"
#include "train/metrics/state_bytes.h"
#include "hyper_parallel_train/trainer.h"

namespace dry_run_test {

using namespace hyper_parallel;
using namespace hyper_parallel::train;

namespace {

JobConfig small_job(int64_t dp, int64_t shard, int64_t tp, const std::string& dtype) {
  JobConfig c;
  c.dump_folder = compat::join_path(compat::temp_directory(), "hp_dry_run_test_" + std::to_string(::getpid()));
  c.model.dim = 40;  // rows uneven over 16 shards
  c.model.n_layers = 2;
  c.model.n_heads = 2;
  c.model.vocab_size = 515;  // uneven over 2 ranks
  c.model.multiple_of = 16;
  c.model.max_seq_len = 16;
  c.training.batch_size = 64 * 2;
  c.training.seq_len = 8;
  c.training.dtype = dtype;
  c.parallelism.tensor_parallel_degree = tp;
  c.parallelism.data_parallel_degree = dp;
  c.parallelism.data_parallel_shard_degree = shard;
  c.validation.enable = false;
  c.checkpoint.enable = false;
  c.metrics.enable_plot = false;
  return c;
}

void expect_state_is_the_formula(const JobConfig& job, int64_t world, std::initializer_list<int64_t> ranks) {
  const ParallelDims dims = ParallelDims::of(job.parallelism);
  for (int64_t rank : ranks) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " of " + dims.describe() + ", " + job.training.dtype);
    const DryRunRank r = dry_run_rank(job, world, rank);
    const StateBytes f = state_bytes_formula(r.parameters, job, dims, rank);
    if (rank == 0) EXPECT_GT(f.optimizer, 0);
    EXPECT_EQ(r.state.parameters, f.parameters);
    EXPECT_EQ(r.state.masters, f.masters);
    EXPECT_EQ(r.state.gradients, f.gradients);
    EXPECT_EQ(r.state.optimizer, f.optimizer);
    EXPECT_EQ(r.state.model_parameters, f.model_parameters);
    EXPECT_EQ(r.checkpoint_bytes, checkpoint_bytes(f));
  }
}

}  // namespace

TEST(DryRun, FsdpStateOfEveryRankPositionEqualsTheFormulaAt64Ranks) {
  // fsdp 64: torch.chunk gives the 515 vocabulary rows in 9s to ranks 0-57 (rank 57: 2),
  // the 40-row norms and attention weights to ranks 0-39, the 112-row MLP weights to ranks
  // 0-55: rank 63 holds nothing at all. dp 2 x fsdp 32 (HSDP); bfloat16 with float32 shards.
  expect_state_is_the_formula(small_job(1, 64, 1, "float32"), 64, {0, 1, 57, 63});
  expect_state_is_the_formula(small_job(2, 32, 1, "float32"), 64, {0, 31, 32, 63});
  expect_state_is_the_formula(small_job(1, 64, 1, "bfloat16"), 64, {0, 63});
}

TEST(DryRun, TensorParallelStateEqualsTheFormula) {
  // TP 2 and 3 (uneven: 515 vocabulary rows, 112 MLP rows), with sequence parallelism,
  // bfloat16 masters, replicas and FSDP beside it.
  JobConfig tp3 = small_job(1, 1, 3, "float32");
  tp3.model.n_heads = 3;
  tp3.model.dim = 48;
  tp3.model.ffn_hidden_dim = 96;
  expect_state_is_the_formula(tp3, 3, {0, 2});
  JobConfig sp = small_job(2, 1, 2, "bfloat16");
  sp.parallelism.sequence_parallel = true;
  expect_state_is_the_formula(sp, 4, {0, 3});
  expect_state_is_the_formula(small_job(1, 4, 2, "bfloat16"), 8, {0, 7});
}

TEST(DryRun, OneRankStateEqualsTheFormula) {
  expect_state_is_the_formula(small_job(1, 1, 1, "float32"), 1, {0});
  expect_state_is_the_formula(small_job(1, 1, 1, "bfloat16"), 1, {0});
}

// hp-train's steps on threads over Gloo count their collectives and bytes (the phases of
// its metrics); the dry run of rank 0 counts the same as the last step, and holds the same
// state.
void expect_the_collectives_of_a_real_step(const JobConfig& job, int64_t steps_run = 1) {
  const std::vector<StepResult> steps = hyper_parallel::testing::train_steps(job, 1, steps_run);
  ASSERT_EQ(steps.size(), static_cast<size_t>(steps_run));
  const StepResult& real = steps.back();
  int64_t count = 0, bytes = 0;
  for (const auto& p : real.phases) {
    count += p.collectives;
    bytes += p.collective_bytes;
  }
  const DryRunRank dry = dry_run_rank(job, ParallelDims::of(job.parallelism).world_size(), 0);
  int64_t dry_count = 0, dry_bytes = 0;
  for (const auto& c : dry.collectives) {
    dry_count += c.count;
    dry_bytes += c.bytes;
  }
  EXPECT_GT(count, 0);
  EXPECT_EQ(dry_count, count);
  EXPECT_EQ(dry_bytes, bytes);
  EXPECT_EQ(dry.state.parameters, real.state.parameters);
  EXPECT_EQ(dry.state.gradients, real.state.gradients);
  EXPECT_EQ(dry.state.optimizer, real.state.optimizer);
}

TEST(DryRun, StepIssuesTheCollectivesOfARealStep) {
  // fsdp 4, two micro-batches.
  JobConfig job = small_job(1, 4, 1, "float32");
  job.training.batch_size = 8;
  job.training.grad_accum_steps = 2;
  job.training.max_norm = 0.5;
  expect_the_collectives_of_a_real_step(job);
}

TEST(DryRun, TensorParallelStepIssuesTheCollectivesOfARealStep) {
  // dp 2 x tp 2 with sequence parallelism, bfloat16 (masters; DDP's buckets), loss
  // parallel, every block checkpointed: the TP collectives of forward, backward and the
  // recompute, and the replicas' gradient all-reduces.
  JobConfig job = small_job(2, 1, 2, "bfloat16");
  job.training.batch_size = 4;
  job.parallelism.sequence_parallel = true;
  job.activation_checkpoint.mode = "full";
  expect_the_collectives_of_a_real_step(job);
}

// A job of another family, its sizes from a config.json (as hp-train takes qwen3 and gemma2):
// TP 2 over 515 vocabulary rows and 48 MLP rows, [model]'s sizes left at their defaults.
JobConfig family_job(const std::string& family, const std::string& config_json) {
  JobConfig c = small_job(1, 1, 2, "float32");
  c.model = ModelConfig{};
  c.model.name = family;
  c.model.hf_assets_path = hyper_parallel::testing::scratch_path("dry_run_" + family);
  compat::create_directories(c.model.hf_assets_path);
  std::ofstream(compat::join_path(c.model.hf_assets_path, "config.json")) << config_json;
  c.training.batch_size = 4;
  return c;
}

// The dry run knows no family: qwen3 (q/k norms) and gemma2 (four norms a block, GeGLU, tied
// embeddings) from their config.json hold, on meta tensors, the state the formula gives for
// the parameters as parallelized, and issue and hold what two real steps do at TP 2.
TEST(DryRun, QwenAndGemmaJobsFromTheirConfigJsonPredictRealStepsAtTp2) {
  const std::string sizes = R"("hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 515, "intermediate_size": 48,
      "max_position_embeddings": 16)";
  for (const auto& [family, json] :
       std::vector<std::pair<std::string, std::string>>{{"qwen3", R"({"model_type": "qwen3", )" + sizes + "}"},
                                                        {"gemma2", R"({"model_type": "gemma2", )" + sizes + "}"}}) {
    SCOPED_TRACE(family);
    const JobConfig job = family_job(family, json);
    expect_state_is_the_formula(job, 2, {0, 1});
    expect_the_collectives_of_a_real_step(job, 2);
    const DryRunRank r = dry_run_rank(job, 2, 0);  // the family counts its blocks' activations
    EXPECT_GT(r.block_activation_bytes, 0);
    EXPECT_EQ(r.no_block_activations, "");
  }
}

// The formula takes the parameters off the parallelized module: for a Llama they are its TP
// plan (llama_parallelize.cpp), embeddings and head along the vocabulary, q/k/v/w1/w3
// column-wise (dim 0), wo/w2 row-wise (dim 1), norms whole.
TEST(DryRun, ALlamasParametersAsParallelizedAreItsTpPlan) {
  const JobConfig job = small_job(1, 1, 2, "float32");
  const DryRunRank r = dry_run_rank(job, 2, 0);
  const int64_t dim = 40, heads = 40, kv = 40, ffn = 112, vocab = 515;
  std::vector<std::pair<std::vector<int64_t>, int64_t>> want{{{vocab, dim}, 0}, {{dim}, -1}, {{vocab, dim}, 0}};
  for (int layer = 0; layer < 2; ++layer) {
    for (auto p : std::vector<std::pair<std::vector<int64_t>, int64_t>>{{{heads, dim}, 0},
                                                                        {{kv, dim}, 0},
                                                                        {{kv, dim}, 0},
                                                                        {{dim, heads}, 1},
                                                                        {{ffn, dim}, 0},
                                                                        {{dim, ffn}, 1},
                                                                        {{ffn, dim}, 0},
                                                                        {{dim}, -1},
                                                                        {{dim}, -1}})
      want.push_back(p);
  }
  std::vector<std::pair<std::vector<int64_t>, int64_t>> got;
  for (const ParameterShape& p : r.parameters) got.emplace_back(p.shape, p.tp_dim);
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
}

TEST(DryRun, MetaDTensorsKeepTheirKernelsBesideAMetaTargetAndAMetaDevice) {
  // Meta ranks above PrivateUse1 (the DTensor's backend) when a call's dispatch key is
  // chosen: without the routes compat/meta_kernels.cpp adds, cross_entropy under
  // loss_parallel decomposed into meta kernels (a plain loss), and _to_copy's backward to
  // bfloat16 gave a plain gradient; the backward then stopped at from_local.
  { ParametersOnMeta everything(MetaScope::Everything); }  // registers the routes
  InitOptions init;
  init.backend = "fake";
  init.per_thread = true;
  init_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 2, init);
  {
    const DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
    const at::TensorOptions meta = at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16);
    const at::Tensor weight =
        distribute_tensor(at::empty({16, 8}, meta), mesh, {Placement::shard(0)}).detach().requires_grad_();
    const at::Tensor input = at::empty({4, 8}, meta).requires_grad_();
    const at::Tensor logits =
        at::matmul(DTensor::from_local(input, mesh, {Placement::replicate()}), weight.t()).to(at::kFloat);
    EXPECT_TRUE(is_dtensor(logits.to(weight.options())));  // to(options): a meta device argument
    auto guard = loss_parallel();
    const at::Tensor loss =
        at::cross_entropy_loss(logits, at::zeros({4}, meta.dtype(at::kLong)), {}, at::Reduction::Sum);
    EXPECT_TRUE(is_dtensor(loss));
    loss.backward();
    EXPECT_TRUE(is_dtensor(weight.grad()));
    EXPECT_EQ(weight.grad().scalar_type(), at::kBFloat16);
    EXPECT_EQ(input.grad().sizes(), input.sizes());
  }
  destroy_process_group();
}

TEST(DryRun, AWorldTheDegreesDoNotMultiplyToIsRefused) {
  try {
    dry_run_rank(small_job(2, 32, 1, "float32"), 32, 0);
    FAIL() << "expected a refusal";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("= 64 ranks, but the job has 32"), std::string::npos) << what;
    // The dry run plays its ranks: the remedy is its own flag, not a launcher, and no other
    // program's name prefixes the message.
    EXPECT_NE(what.find("--world-size 64"), std::string::npos) << what;
    EXPECT_EQ(what.find("hp-run"), std::string::npos) << what;
    EXPECT_EQ(what.find("hp-train:"), std::string::npos) << what;
  }
}

TEST(DryRun, ARankOutsideTheWorldAndACudaJobAreRefused) {
  try {
    dry_run_rank(small_job(1, 4, 1, "float32"), 4, 4);
    FAIL() << "expected a refusal";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 4 is not in [0, 4)"), std::string::npos) << e.what();
  }
  JobConfig cuda = small_job(1, 4, 1, "float32");
  cuda.training.device = "cuda";
  try {
    dry_run_rank(cuda, 4, 0);
    FAIL() << "expected a refusal";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("run it with training.device = cpu"), std::string::npos) << e.what();
  }
}

TEST(DryRun, ActivationFormulaCountsTheBlocksEachModeCheckpoints) {
  JobConfig job = small_job(1, 1, 1, "float32");
  job.model.n_layers = 4;
  DecoderSizes s;
  s.dim = 40, s.n_layers = 4, s.n_heads = 2, s.n_kv_heads = 2, s.head_dim = 20, s.vocab_size = 515;
  s.ffn_hidden_dim = 112;
  const ParallelDims dims(1, 1, 1);
  const int64_t block = 123456;  // the family's count: this test is about the modes
  const LossTerms terms;
  const auto none = activation_bytes_formula(block, s, terms, job, dims, block_checkpointing("none", "2"));
  const auto full = activation_bytes_formula(block, s, terms, job, dims, block_checkpointing("full", "2"));
  const auto half = activation_bytes_formula(block, s, terms, job, dims, block_checkpointing("selective", "2"));
  EXPECT_EQ(none.held_after_forward, 4 * none.per_block + none.outside_blocks);
  EXPECT_EQ(full.held_after_forward, 4 * full.checkpointed_block + none.outside_blocks);
  EXPECT_EQ(half.held_after_forward, 2 * none.per_block + 2 * half.checkpointed_block + none.outside_blocks);
  // Every third of four blocks: TorchTitan's count checkpoints block 2 (of 0..3) only.
  const auto third = activation_bytes_formula(block, s, terms, job, dims, block_checkpointing("selective", "3"));
  EXPECT_EQ(third.checkpointed_blocks, 1);
}

}  // namespace dry_run_test
