// Activation checkpointing (activation_checkpoint.h): a checkpointed block, and a Llama with
// every block or every 2nd block checkpointed, give the outputs and every gradient of the
// same module without checkpointing (float64) at TP 1, TP 2 and under sequence parallel,
// under FSDP (no extra all-gather) and over two micro-batches; the recompute costs one more
// forward's TP collectives per checkpointed block; random draws are replayed or refused; and
// what cannot be right (an input changed in place, a captured tensor that needs a gradient,
// TorchTitan's per-op mode) is a clear error. hp-train's [activation_checkpoint] trains as
// without it, step by step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "compat/file_system.h"
#include "harness/rank_harness.h"
#include "harness/train_steps.h"
#include "hyper_parallel/nn/activation_checkpoint.h"
#include "hyper_parallel/nn/fully_shard.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/llama.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/trainer.h"

namespace activation_checkpoint_test {

using namespace hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;
using hyper_parallel::testing::train_steps;
namespace F = torch::nn::functional;

namespace {

// Heads and hidden dims split over 2 ranks; a sequence (13) that does not.
LlamaArgs small_args() {
  LlamaArgs a;
  a.dim = 48;
  a.n_layers = 4;
  a.n_heads = 4;
  a.ffn_hidden_dim = 96;
  a.vocab_size = 101;
  a.max_seq_len = 16;
  return a;
}
constexpr int64_t kSeq = 13;

BlockCheckpointing policy(const std::string& mode) { return block_checkpointing(mode, "2"); }

// The largest difference relative to the reference's largest magnitude.
double relative_difference(const at::Tensor& got, const at::Tensor& want) {
  const double scale = std::max(want.abs().max().item<double>(), 1e-300);
  return (got - want).abs().max().item<double>() / scale;
}

struct Result {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;  // full values
  CollectiveCounts forward, backward;       // this rank's TP collectives
};

Llama make_model() {
  Llama model(small_args());
  model->init_weights(7);
  model->to(at::kDouble);
  return model;
}

at::Tensor tokens_of(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(101, {2, kSeq}, gen, at::kLong);
}

// Loss (loss parallel under TP) and gradients of `model` with `mode`'s blocks checkpointed.
Result train_once(Llama& model, const std::string& mode) {
  model->set_block_checkpointing(policy(mode));
  model->zero_grad();
  const at::Tensor tokens = tokens_of(3), targets = tokens_of(4);
  reset_collective_counts();
  at::Tensor loss;
  {
    std::optional<LossParallelGuard> guard;
    const at::Tensor logits = model->forward(tokens);
    if (is_dtensor(logits)) guard.emplace();
    loss = F::cross_entropy(logits.flatten(0, 1), targets.flatten());
  }
  Result r;
  r.forward = collective_counts();
  reset_collective_counts();
  loss.backward();
  r.backward = collective_counts();
  r.loss = (is_dtensor(loss) ? full_tensor(loss) : loss).item<double>();
  for (const auto& p : model->named_parameters()) {
    const at::Tensor& g = p.value().grad();
    EXPECT_TRUE(g.defined()) << p.key() << " got no gradient with mode " << mode;
    if (g.defined()) r.grads[p.key()] = (is_dtensor(g) ? full_tensor(g) : g).clone();
  }
  return r;
}

void expect_same(const Result& got, const Result& want, const std::string& what) {
  EXPECT_LE(std::abs(got.loss - want.loss), 1e-12 * std::abs(want.loss)) << what;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (const auto& [name, g] : want.grads)
    EXPECT_LE(relative_difference(got.grads.at(name), g), 1e-12) << what << ": " << name;
}

// The TP collectives of one block's forward under llama_tp_plan: an all-reduce after wo and
// after w2; under sequence parallel an all-gather before attention and feed_forward and a
// reduce-scatter after wo and w2 (llama_sp_test.cpp).
CollectiveCounts block_forward_collectives(bool sequence_parallel) {
  CollectiveCounts c;
  if (sequence_parallel) {
    c.all_gather = 2;
    c.reduce_scatter = 2;
  } else {
    c.all_reduce = 2;
  }
  return c;
}

}  // namespace

// One block through checkpoint() against the same block called plainly, float64: the output,
// the input's gradient and every parameter's gradient.
TEST(ActivationCheckpoint, BlockOutputAndEveryGradientMatchTheBlockWithoutIt) {
  const LlamaArgs args = small_args();
  DecoderBlock block(llama_block_options(args));
  block->to(at::kDouble);
  {
    at::NoGradGuard no_grad;
    int64_t seed = 11;
    for (auto& p : block->parameters()) p.copy_(random_tensor(p.sizes(), seed++) * 0.2);
  }
  auto [cos, sin] = llama_rope_tables(args);
  DecoderBlockImpl* impl = block.get();
  const auto forward = [impl, cos = cos, sin = sin](const at::Tensor& x) { return impl->forward(x, cos, sin); };
  const at::Tensor x0 = random_tensor({2, kSeq, args.dim}, 1);
  const at::Tensor weight = random_tensor({2, kSeq, args.dim}, 2);
  std::map<std::string, std::map<std::string, at::Tensor>> runs;
  for (const std::string mode : {"none", "full"}) {
    block->zero_grad();
    const at::Tensor x = x0.clone().requires_grad_();
    const at::Tensor out = run_block(policy(mode), 0, *block, forward, x);
    EXPECT_EQ(out.requires_grad(), true) << mode;
    (out * weight).sum().backward();
    runs[mode]["output"] = out.detach();
    runs[mode]["input grad"] = x.grad();
    for (const auto& p : block->named_parameters()) runs[mode][p.key()] = p.value().grad().clone();
  }
  EXPECT_EQ(runs["full"].size(), runs["none"].size());
  for (const auto& [name, want] : runs["none"]) {
    ASSERT_TRUE(runs["full"].count(name)) << name;
    EXPECT_LE(relative_difference(runs["full"][name], want), 1e-12) << name;
  }
}

// The whole model, every block (full) or blocks 1 and 3 of 0..3 (selective 2) checkpointed,
// at TP 1, TP 2 and TP 2 with sequence parallel: loss and every gradient as without. The
// forward issues the same collectives; backward adds one block forward's per checkpointed
// block (the recompute).
TEST(ActivationCheckpoint, LlamaFullAndEverySecondBlockMatchNoneAtTp1Tp2AndSequenceParallel) {
  {
    Llama model = make_model();
    const Result none = train_once(model, "none");
    EXPECT_GT(none.loss, 4.0);
    for (const std::string mode : {"full", "selective"}) expect_same(train_once(model, mode), none, "TP 1, " + mode);
  }
  for (bool sp : {false, true}) {
    run_ranks(2, [&](int64_t) {
      auto mesh = init_device_mesh("cpu", {2}, {"tp"});
      Llama model = make_model();
      parallelize_llama(model, mesh, /*loss_parallel=*/true, sp);
      const Result none = train_once(model, "none");
      const CollectiveCounts per_block = block_forward_collectives(sp);
      for (const std::string mode : {"full", "selective"}) {
        const std::string what = std::string(sp ? "TP 2 + SP, " : "TP 2, ") + mode;
        const Result got = train_once(model, mode);
        expect_same(got, none, what);
        const int64_t checkpointed = mode == "full" ? 4 : 2;
        EXPECT_EQ(got.forward.total(), none.forward.total()) << what;
        EXPECT_EQ(got.backward.all_reduce, none.backward.all_reduce + checkpointed * per_block.all_reduce) << what;
        EXPECT_EQ(got.backward.all_gather, none.backward.all_gather + checkpointed * per_block.all_gather) << what;
        EXPECT_EQ(got.backward.reduce_scatter, none.backward.reduce_scatter + checkpointed * per_block.reduce_scatter)
            << what;
      }
    });
  }
}

// FSDP (dp_shard 2 x tp 2) over two micro-batches: the recompute reads the parameters FSDP
// gathered for the block's backward (its hook on the block's output runs before the
// checkpoint's node), so the all-gathers and reduce-scatters are those of no checkpointing,
// with or without reshard_after_forward, and the accumulated shard gradients are the same.
TEST(ActivationCheckpoint, UnderFullyShardGradientsMatchOverTwoMicroBatchesWithNoExtraAllGather) {
  for (bool reshard_after_forward : {true, false}) {
    run_ranks(4, [&](int64_t rank) {
      auto world = init_device_mesh("cpu", {2, 2}, {"dp_shard", "tp"});
      std::map<std::string, std::map<std::string, at::Tensor>> grads;
      std::map<std::string, FullyShardStats> stats;
      std::map<std::string, double> losses;
      for (const std::string mode : {"none", "full", "selective"}) {
        Llama model = make_model();
        parallelize_llama(model, world["tp"], /*loss_parallel=*/true);
        model->set_block_checkpointing(policy(mode));
        std::vector<FullyShardedParameters::NamedParameters> groups(1 + small_args().n_layers);
        for (const auto& p : model->named_parameters()) {
          const std::string& name = p.key();
          const size_t group =
              name.rfind("layers.", 0) == 0 ? 1 + std::stoul(name.substr(7, name.find('.', 7) - 7)) : 0;
          groups.at(group).emplace_back(name, p.value());
        }
        FullyShardOptions options;
        options.reshard_after_forward = reshard_after_forward;
        auto fsdp = std::make_shared<FullyShardedParameters>(groups, world, options);
        model->set_block_hooks(fsdp);
        const int64_t shard_rank = rank / 2;
        for (uint64_t micro = 0; micro < 2; ++micro) {
          const at::Tensor tokens = tokens_of(10 + 2 * micro + shard_rank), targets = tokens_of(20 + micro);
          LossParallelGuard guard;
          at::Tensor loss = F::cross_entropy(model->forward(tokens).flatten(0, 1), targets.flatten());
          losses[mode] += full_tensor(loss).item<double>();
          loss.backward();
          fsdp->finish_backward();
        }
        stats[mode] = fsdp->stats();
        for (size_t i = 0; i < fsdp->names().size(); ++i) {
          grads[mode][fsdp->names()[i]] = full_tensor(fsdp->shards()[i].grad());
        }
      }
      const std::string where = reshard_after_forward ? "reshard after forward" : "kept from forward to backward";
      for (const std::string mode : {"full", "selective"}) {
        const std::string what = mode + ", " + where;
        EXPECT_LE(std::abs(losses[mode] - losses["none"]), 1e-12 * std::abs(losses["none"])) << what;
        for (const auto& [name, g] : grads["none"])
          EXPECT_LE(relative_difference(grads[mode].at(name), g), 1e-12) << what << ": " << name;
        EXPECT_EQ(stats[mode].all_gathers, stats["none"].all_gathers) << what;
        EXPECT_EQ(stats[mode].reduce_scatters, stats["none"].reduce_scatters) << what;
      }
      // The count itself: per micro-batch the root once, each block once in forward and, when
      // freed after it, once more for backward.
      const int64_t blocks = small_args().n_layers;
      EXPECT_EQ(stats["none"].all_gathers, 2 * (1 + blocks * (reshard_after_forward ? 2 : 1))) << where;
    });
  }
}

// A function that draws random numbers: with preserve_rng_state (the default) the recompute
// draws what the forward drew, from LibTorch's default CPU generator and from a DTensor
// mesh's random sequence, and leaves the generators as the plain function does; without it,
// the forward is refused, naming the generator.
TEST(ActivationCheckpoint, RandomDrawsAreReplayedInTheRecomputeOrRefused) {
  const at::Tensor w0 = random_tensor({6, 5}, 3);
  const at::Tensor x0 = random_tensor({4, 6}, 4);
  auto run = [&](bool checkpointed, bool preserve, const std::function<at::Tensor(const at::Tensor&)>& f) {
    const at::Tensor x = x0.clone().requires_grad_();
    const CheckpointedFunction function = [f](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{f(in[0])};
    };
    CheckpointOptions options;
    options.preserve_rng_state = preserve;
    const at::Tensor out = checkpointed ? checkpoint(function, {x}, {}, options)[0] : f(x);
    out.sum().backward();
    return std::pair<at::Tensor, at::Tensor>{out.detach(), x.grad()};
  };
  const at::Tensor w = w0;
  const auto dropout = [w](const at::Tensor& x) { return at::dropout(at::matmul(x, w), 0.4, /*train=*/true); };
  at::manual_seed(5);
  const auto plain = run(false, true, dropout);
  const at::Tensor next_plain = at::rand({3}, at::kDouble);
  at::manual_seed(5);
  const auto replayed = run(true, true, dropout);
  const at::Tensor next_replayed = at::rand({3}, at::kDouble);
  EXPECT_TRUE(at::equal(replayed.first, plain.first));
  EXPECT_TRUE(at::equal(replayed.second, plain.second)) << "the recompute drew other numbers";
  EXPECT_TRUE(at::equal(next_replayed, next_plain)) << "the generator was left elsewhere than the plain run leaves it";
  try {
    run(true, false, dropout);
    ADD_FAILURE() << "a drawing function without preserve_rng_state was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("drew random numbers (from the default CPU generator)"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("preserve_rng_state"), std::string::npos) << e.what();
  }

  // A replicated DTensor input: its mesh's random sequence is one of the sources watched.
  run_ranks(2, [&](int64_t) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    const auto noisy = [](const at::Tensor& d) { return d * at::rand_like(d); };
    auto run_d = [&](bool checkpointed, bool preserve) {
      const at::Tensor x = DTensor::from_local(x0.clone(), mesh, {Placement::replicate()}).detach().requires_grad_();
      const CheckpointedFunction function = [noisy](const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{noisy(in[0])};
      };
      CheckpointOptions options;
      options.preserve_rng_state = preserve;
      const at::Tensor out = checkpointed ? checkpoint(function, {x}, {}, options)[0] : noisy(x);
      out.sum().backward();
      return to_local(x.grad()).clone();
    };
    mesh.manual_seed(9);
    const at::Tensor plain_grad = run_d(false, true);
    mesh.manual_seed(9);
    const at::Tensor replayed_grad = run_d(true, true);
    EXPECT_TRUE(at::equal(replayed_grad, plain_grad)) << "the recompute drew another DTensor random tensor";
    EXPECT_EQ(mesh.random_ops_drawn(), 1u) << "the mesh's sequence must be where the plain run leaves it";
    try {
      run_d(true, false);
      ADD_FAILURE() << "a drawing function without preserve_rng_state was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("the DTensor random sequence of"), std::string::npos) << e.what();
    }
  });
}

// What would give a wrong gradient is an error: the saved input changed in place before
// backward, and a tensor that requires grad read by the function without being passed.
TEST(ActivationCheckpoint, AnInputChangedInPlaceOrAnUnlistedTensorNeedingAGradientIsAnError) {
  const at::Tensor w = random_tensor({5, 5}, 1).requires_grad_();
  const CheckpointedFunction uses_w = [w](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::tanh(at::matmul(in[0], w))};
  };
  {
    const at::Tensor x = random_tensor({3, 5}, 2).requires_grad_();
    const at::Tensor y = x * 2;
    const at::Tensor out = checkpoint(uses_w, {y}, {w})[0];
    {
      at::NoGradGuard no_grad;
      y.add_(1);
    }
    EXPECT_THROW(out.sum().backward(), c10::Error);
  }
  {
    const at::Tensor x = random_tensor({3, 5}, 2).requires_grad_();
    const at::Tensor out = checkpoint(uses_w, {x}, /*parameters=*/{})[0];
    try {
      out.sum().backward();
      ADD_FAILURE() << "a captured tensor that requires grad was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("neither one of its inputs nor one of its parameters"), std::string::npos)
          << e.what();
    }
  }
  {  // listed: gradients as without checkpointing, torch::autograd::grad included
    const at::Tensor x = random_tensor({3, 5}, 2).requires_grad_();
    const auto got = torch::autograd::grad({checkpoint(uses_w, {x}, {w})[0].sum()}, {x, w});
    const auto want = torch::autograd::grad({uses_w({x})[0].sum()}, {x, w});
    EXPECT_TRUE(at::equal(got[0], want[0]));
    EXPECT_TRUE(at::equal(got[1], want[1]));
  }
}

// TorchTitan's keys: none / full / selective with an integer every N-th block (counted from
// 1: blocks 1 and 3 of 0..3 for N = 2); its "op" and anything else are refused naming what is
// supported, in the library and in hp-train's job validation.
TEST(ActivationCheckpoint, TorchTitansKeysChooseTheBlocksAndOpIsRefused) {
  auto picked = [](const BlockCheckpointing& b) {
    std::vector<int64_t> blocks;
    for (int64_t i = 0; i < 6; ++i)
      if (b.checkpoints(i)) blocks.push_back(i);
    return blocks;
  };
  EXPECT_EQ(picked(block_checkpointing("none", "2")), (std::vector<int64_t>{}));
  EXPECT_EQ(picked(block_checkpointing("full", "op")), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(picked(block_checkpointing("selective", "2")), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(picked(block_checkpointing("selective", "3")), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(picked(block_checkpointing("selective", "1")), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  auto error_of = [](const std::string& mode, const std::string& option) -> std::string {
    try {
      block_checkpointing(mode, option);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_NE(error_of("selective", "op")
                .find("\"op\" (per-operator selective checkpointing) is not supported; "
                      "supported: a positive integer N"),
            std::string::npos);
  EXPECT_NE(error_of("selective", "0").find("expected a positive integer"), std::string::npos);
  EXPECT_NE(error_of("selective", "two").find("expected a positive integer"), std::string::npos);
  EXPECT_NE(error_of("memory_budget", "2").find("is not one of none, full, selective"), std::string::npos);
  try {
    train::parse_job_config(
        {"--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"});
    ADD_FAILURE() << "selective_ac_option = op was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("activation_checkpoint.selective_ac_option = \"op\""), std::string::npos)
        << e.what();
  }
}

namespace {

// The Trainer-level jobs run this many steps.
constexpr int64_t kAcSteps = 5;

train::JobConfig ac_job(int64_t shard, int64_t tp, const std::string& dtype, const std::string& mode,
                        int64_t replicas = 1) {
  train::JobConfig c;
  c.dump_folder = compat::join_path(compat::temp_directory(), "hp_ac_test_" + std::to_string(::getpid()) + "_" +
                                                                  std::to_string(replicas) + std::to_string(shard) +
                                                                  std::to_string(tp) + dtype);
  c.model.dim = 32;
  c.model.n_layers = 4;
  c.model.n_heads = 4;
  c.model.vocab_size = 256;
  c.model.multiple_of = 16;
  c.model.max_seq_len = 16;
  c.training.batch_size = 4;
  c.training.seq_len = 12;
  c.training.steps = kAcSteps;
  c.lr_scheduler.warmup_steps = 2;
  c.training.dtype = dtype;
  c.training.grad_accum_steps = 2;
  c.parallelism.tensor_parallel_degree = tp;
  c.parallelism.data_parallel_shard_degree = shard;
  c.parallelism.data_parallel_degree = replicas;
  c.activation_checkpoint.mode = mode;
  c.validation.enable = false;
  c.checkpoint.enable = false;
  c.metrics.enable_plot = false;
  return c;
}

}  // namespace

// hp-train with [activation_checkpoint] mode full and selective (every 2nd of 4 blocks)
// against none, two micro-batches per step: float64 losses and gradient norms within 1e-12 at
// every step at TP 2 and at FSDP 2 x TP 2; bfloat16 with float32 masters (TP 2) the same
// bits, the recompute running the same kernels on the same values.
TEST(ActivationCheckpointTrainer, FullAndSelectiveTrainAsNoneAtTp2AndWithFsdpAndInBfloat16) {
  for (const auto& [shard, tp, dtype] :
       {std::tuple<int64_t, int64_t, std::string>{1, 2, "float64"}, {2, 2, "float64"}, {1, 2, "bfloat16"}}) {
    const auto none = train_steps(ac_job(shard, tp, dtype, "none"), 1, kAcSteps);
    ASSERT_EQ(none.size(), 5u);
    for (const std::string mode : {"full", "selective"}) {
      const std::string what = dtype + ", FSDP " + std::to_string(shard) + " x TP " + std::to_string(tp) + ", " + mode;
      const auto got = train_steps(ac_job(shard, tp, dtype, mode), 1, kAcSteps);
      ASSERT_EQ(got.size(), none.size()) << what;
      for (size_t i = 0; i < none.size(); ++i) {
        if (dtype == "bfloat16") {
          EXPECT_EQ(got[i].loss, none[i].loss) << what << ", step " << i + 1;
          EXPECT_EQ(got[i].grad_norm, none[i].grad_norm) << what << ", step " << i + 1;
        } else {
          EXPECT_LE(std::abs(got[i].loss - none[i].loss), 1e-12 * std::abs(none[i].loss)) << what << ", step " << i + 1;
          EXPECT_LE(std::abs(got[i].grad_norm - none[i].grad_norm), 1e-12 * none[i].grad_norm)
              << what << ", step " << i + 1;
        }
      }
    }
  }
}

// What a policy does to a model of n blocks, as hp-train and hp-dry-run log it: a selective
// option larger than the block count checkpoints nothing, and says so (it read "1 block in 5").
TEST(ActivationCheckpoint, ItsDescriptionCountsTheBlocksOfTheModel) {
  EXPECT_EQ(block_checkpointing("none", "2").str(4), "none");
  EXPECT_EQ(block_checkpointing("full", "2").str(4), "full (4 of 4 blocks)");
  EXPECT_EQ(block_checkpointing("selective", "2").str(5), "selective (every 2nd block: 2 of 5 blocks)");
  EXPECT_EQ(block_checkpointing("selective", "3").str(6), "selective (every 3rd block: 2 of 6 blocks)");
  EXPECT_EQ(block_checkpointing("selective", "5").str(2),
            "selective (every 5th block: none of 2 blocks; selective_ac_option exceeds the block count)");
}

// Replicas without FSDP (DDP's bucketed reducer, dp 2 x TP 2), in float64 and in bfloat16
// with masters. The reducer took each parameter's gradient from a tensor hook, which the
// recompute's autograd::grad also fires (it captures the parameters' gradients): "got two
// gradients in one backward". It now reads .grad after accumulation (post-accumulate hook).
TEST(ActivationCheckpointTrainer, ReplicasTrainAsNone) {
  for (const std::string dtype : {"float64", "bfloat16"}) {
    const auto none = train_steps(ac_job(1, 2, dtype, "none", 2), 1, kAcSteps);
    ASSERT_EQ(none.size(), 5u);
    const auto full = train_steps(ac_job(1, 2, dtype, "full", 2), 1, kAcSteps);
    ASSERT_EQ(full.size(), none.size()) << dtype;
    for (size_t i = 0; i < none.size(); ++i) {
      EXPECT_LE(std::abs(full[i].loss - none[i].loss), 1e-12 * std::abs(none[i].loss)) << dtype << ", step " << i + 1;
      EXPECT_LE(std::abs(full[i].grad_norm - none[i].grad_norm), 1e-12 * none[i].grad_norm)
          << dtype << ", step " << i + 1;
    }
  }
}

}  // namespace activation_checkpoint_test
