// Data parallelism: the world as a dp x tp mesh, the bucketed gradient
// all-reduce, the loss normalised by the global token count over replicas and
// micro-batches, and loss_parallel on the tp sub-mesh of a 2-D mesh. Every result is
// compared with one process on the whole batch, in float64.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <mutex>

#include "compat/file_system.h"
#include "hyper_parallel/core/pending_collective.h"
#include "harness/rank_harness.h"
#include "harness/train_steps.h"
#include "hyper_parallel/hyper_parallel.h"
#include "train/data/batches.h"
#include "train/parallel/data_parallel_reducer.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/trainer.h"

namespace data_parallel_test {

using namespace hyper_parallel;
using namespace hyper_parallel::train;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;
using hyper_parallel::testing::train_steps;
namespace F = torch::nn::functional;

namespace {

JobConfig small_job(int64_t dp, int64_t tp, int64_t accum) {
  JobConfig c;
  c.dump_folder = compat::join_path(compat::temp_directory(), "hp_dp_test_" + std::to_string(::getpid()));
  c.model.dim = 32;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.vocab_size = 515;  // uneven over 2 ranks
  c.model.multiple_of = 16;
  c.model.max_seq_len = 32;
  c.training.batch_size = 8;
  c.training.seq_len = 12;
  c.training.steps = 6;
  c.lr_scheduler.warmup_steps = 2;
  c.training.lr = 3e-3;
  c.training.dtype = "float64";
  c.training.grad_accum_steps = accum;
  c.parallelism.tensor_parallel_degree = tp;
  c.parallelism.data_parallel_degree = dp;
  c.parallelism.dp_bucket_mb = 1;  // several buckets even for this small model
  c.validation.enable = false;
  c.checkpoint.enable = false;
  c.metrics.enable_plot = false;
  return c;
}

// The synthetic global batch with targets ignored unevenly: in the first half of the rows
// (replica 0 of 2) three tokens in four are ignored, in the second half one in eight.
class UnevenlyIgnoredBatches : public BatchSource {
 public:
  UnevenlyIgnoredBatches(const JobConfig& c)
      : inner_(c.model.vocab_size, c.training.batch_size, c.training.seq_len, 7, 0) {}
  Batch batch_at(int64_t step) const override {
    Batch b = inner_.batch_at(step);
    const int64_t rows = b.target.size(0), cols = b.target.size(1);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = 0; t < cols; ++t) {
        const bool first_half = r < rows / 2;
        const int64_t k = r * cols + t + step;
        if ((first_half && k % 4 != 0) || (!first_half && k % 8 == 0)) b.target[r][t] = -100;
      }
    }
    return b;
  }

 private:
  SyntheticBatchStream inner_;
};

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;  // full tensors after the run
};

RunResult train_with_ignored_tokens(int64_t dp, int64_t tp, int64_t accum, bool fused = false, bool sp = false) {
  JobConfig job = small_job(dp, tp, accum);
  job.training.fused_linear_loss = fused;
  job.parallelism.sequence_parallel = sp;
  RunResult out;
  std::mutex m;
  run_ranks(dp * tp, [&](int64_t rank) {
    Trainer trainer(job);
    const int64_t dp_rank = rank / tp;
    trainer.use_training_batches(
        std::make_shared<ReplicaRows>(std::make_shared<UnevenlyIgnoredBatches>(job), dp_rank, dp));
    std::vector<double> losses;
    for (int64_t s = 1; s <= job.training.steps; ++s) losses.push_back(trainer.train_step(s).loss);
    std::map<std::string, at::Tensor> params;
    for (const auto& p : trainer.model().named_parameters()) {
      params[p.key()] = (is_dtensor(p.value()) ? full_tensor(p.value()) : p.value()).detach().clone();
    }
    std::lock_guard<std::mutex> lock(m);
    if (rank == dp * tp - 1) out = {losses, params};  // the last replica's last TP rank
  });
  return out;
}

// `f` throws a c10::Error whose message holds `expected`.
void expect_error(const std::function<void()>& f, const std::string& expected) {
  try {
    f();
    ADD_FAILURE() << "expected an error: " << expected;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

}  // namespace

// dp 2 x tp 2 with 2 micro-batches, replicas holding 3x as many
// ignored targets as each other, equals one process on the whole batch, step by step
// (loss) and in every parameter after 6 AdamW steps. float64: agreement to 1e-10.
TEST(DataParallel, Dp2Tp2WithUnevenlyIgnoredTokensEqualsOneProcess) {
  const RunResult one = train_with_ignored_tokens(1, 1, 1);
  const RunResult dp_tp = train_with_ignored_tokens(2, 2, 2);
  ASSERT_EQ(one.losses.size(), dp_tp.losses.size());
  double worst_loss = 0, worst_param = 0;
  for (size_t i = 0; i < one.losses.size(); ++i) {
    EXPECT_NEAR(dp_tp.losses[i], one.losses[i], 1e-10 * std::abs(one.losses[i])) << "step " << i + 1;
    worst_loss = std::max(worst_loss, std::abs(dp_tp.losses[i] / one.losses[i] - 1));
  }
  ASSERT_EQ(one.params.size(), dp_tp.params.size());
  for (const auto& [name, full] : one.params) {
    const at::Tensor& got = dp_tp.params.at(name);
    ASSERT_EQ(got.sizes(), full.sizes()) << name;
    const double diff = (got - full).abs().max().item<double>();
    worst_param = std::max(worst_param, diff);
    EXPECT_LT(diff, 1e-10) << name;
  }
  std::cout << "dp 2 x tp 2, 2 micro-batches vs one process: largest relative loss difference " << worst_loss
            << ", largest parameter difference " << worst_param << std::endl;
}

// The same with the head and the loss fused (fused_linear_loss.h): no logits at all.
TEST(DataParallel, Dp2Tp2FusedLinearLossEqualsOneProcess) {
  const RunResult one = train_with_ignored_tokens(1, 1, 1, true);
  const RunResult dp_tp = train_with_ignored_tokens(2, 2, 2, true);
  for (size_t i = 0; i < one.losses.size(); ++i) {
    EXPECT_NEAR(dp_tp.losses[i], one.losses[i], 1e-10 * std::abs(one.losses[i])) << "step " << i + 1;
  }
  for (const auto& [name, full] : one.params) {
    EXPECT_LT((dp_tp.params.at(name) - full).abs().max().item<double>(), 1e-10) << name;
  }
}

// dp x tp x sp: sequence parallel inside each replica (seq_len 12 over 2 ranks), with the
// unfused and the fused head.
TEST(DataParallel, Dp2Tp2SequenceParallelEqualsOneProcess) {
  for (bool fused : {false, true}) {
    const RunResult one = train_with_ignored_tokens(1, 1, 1, fused);
    const RunResult sp = train_with_ignored_tokens(2, 2, 2, fused, /*sp=*/true);
    for (size_t i = 0; i < one.losses.size(); ++i) {
      EXPECT_NEAR(sp.losses[i], one.losses[i], 1e-10 * std::abs(one.losses[i]))
          << "fused " << fused << ", step " << i + 1;
    }
    for (const auto& [name, full] : one.params) {
      EXPECT_LT((sp.params.at(name) - full).abs().max().item<double>(), 1e-10) << name << ", fused " << fused;
    }
  }
}

// Gradient accumulation alone (one rank): 4 micro-batches equal the whole batch at once.
TEST(DataParallel, FourMicroBatchesEqualTheWholeBatch) {
  const RunResult whole = train_with_ignored_tokens(1, 1, 1);
  const RunResult micro = train_with_ignored_tokens(1, 1, 4);
  for (size_t i = 0; i < whole.losses.size(); ++i) {
    EXPECT_NEAR(micro.losses[i], whole.losses[i], 1e-10 * std::abs(whole.losses[i])) << "step " << i + 1;
  }
  for (const auto& [name, full] : whole.params) {
    EXPECT_LT((micro.params.at(name) - full).abs().max().item<double>(), 1e-10) << name;
  }
}

// Data parallelism without TP (dp 4 x tp 1), synthetic data, through Trainer::train():
// the loss curve and the validation losses (each replica validates its rows) of one process.
TEST(DataParallel, Dp4TrainsAndValidatesAsOneProcess) {
  auto job = [](int64_t dp) {
    JobConfig c = small_job(dp, 1, 1);
    c.dump_folder += "_dp" + std::to_string(dp);
    compat::remove_all(c.dump_folder);
    c.training.steps = 4;
    c.validation.enable = true;
    c.validation.freq = 2;
    c.validation.steps = 2;
    return c;
  };
  std::vector<StepResult> one, dp4;
  run_ranks(1, [&](int64_t) { one = Trainer(job(1)).train(); });
  run_ranks(4, [&](int64_t rank) {
    auto r = Trainer(job(4)).train();
    if (rank == 3) dp4 = r;
  });
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(dp4.size(), 4u);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(dp4[i].loss, one[i].loss, 1e-10 * std::abs(one[i].loss)) << "step " << i + 1;
    ASSERT_EQ(dp4[i].val_loss.has_value(), one[i].val_loss.has_value()) << "step " << i + 1;
    if (one[i].val_loss) EXPECT_NEAR(*dp4[i].val_loss, *one[i].val_loss, 1e-10 * *one[i].val_loss);
  }
  EXPECT_TRUE(one[1].val_loss.has_value());
}

// The reducer sends each bucket once, in buckets of the size asked for, and leaves in
// every .grad the sum over the replicas of what each computed.
TEST(DataParallel, ReducerSumsGradientsBucketByBucket) {
  run_ranks(2, [&](int64_t rank) {
    DeviceMesh dp = init_device_mesh("cpu", {2}, {"dp"});
    torch::nn::Linear a(64, 64), b(64, 64);
    torch::OrderedDict<std::string, at::Tensor> params;
    params.insert("a.weight", a->weight);
    params.insert("a.bias", a->bias);
    params.insert("b.weight", b->weight);
    params.insert("b.bias", b->bias);
    {
      at::NoGradGuard g;
      for (auto& p : params) p.value().copy_(random_tensor(p.value().sizes(), 3, at::kFloat));
    }
    // A bucket holds a weight (16 KiB) and a bias, not two weights.
    DataParallelReducer reducer(params, dp, 20 * 1024);
    EXPECT_EQ(reducer.bucket_count(), 2);
    const at::Tensor x0 = random_tensor({5, 64}, 10, at::kFloat), x1 = random_tensor({5, 64}, 11, at::kFloat);
    auto grads_for = [&](const at::Tensor& x) {
      for (auto& p : params) p.value().mutable_grad() = at::Tensor();
      b(a(x).tanh()).pow(2).sum().backward();
      std::vector<at::Tensor> g;
      for (auto& p : params) g.push_back(p.value().grad().clone());
      return g;
    };
    const auto g0 = grads_for(x0), g1 = grads_for(x1);
    for (auto& p : params) p.value().mutable_grad() = at::Tensor();
    reset_collective_counts();
    reducer.arm();
    b(a(rank == 0 ? x0 : x1).tanh()).pow(2).sum().backward();
    reducer.finish();
    EXPECT_EQ(collective_counts().all_reduce, 2) << "one all-reduce per bucket";
    size_t i = 0;
    for (auto& p : params) {
      EXPECT_TRUE(at::allclose(p.value().grad(), g0[i] + g1[i], 1e-5, 1e-6)) << p.key();
      ++i;
    }
  });
}

// bfloat16 parameters with float32 masters as gradient holders: the first micro-batch's
// gradient waits on the master, and the sum over micro-batches and replicas lands there
// in float32. Gradients 1 + 2^-9 + 2^-9 + 2^-9 in bfloat16 would round to 1.
TEST(DataParallel, ReducerSumsBf16GradientsIntoFloat32Holders) {
  const float small = std::ldexp(1.0f, -9);
  run_ranks(2, [&](int64_t rank) {
    DeviceMesh dp = init_device_mesh("cpu", {2}, {"dp"});
    at::Tensor w = at::ones({3}, at::kBFloat16).requires_grad_(true);
    at::Tensor master = at::ones({3}, at::kFloat).requires_grad_(true);
    torch::OrderedDict<std::string, at::Tensor> params;
    params.insert("w", w);
    DataParallelReducer reducer(params, dp, 1 << 20, {master});
    const double first = rank == 0 ? 1.0 : small;
    (w * first).sum().backward();
    {
      at::NoGradGuard g;
      master.mutable_grad() = w.grad().to(at::kFloat);
      w.mutable_grad() = at::Tensor();
    }
    reducer.arm();
    (w * small).sum().backward();
    reducer.finish();
    EXPECT_FALSE(w.grad().defined()) << "the sum is on the holder";
    ASSERT_TRUE(master.grad().defined());
    EXPECT_EQ(master.grad().scalar_type(), at::kFloat);
    EXPECT_TRUE(master.grad().equal(at::full({3}, 1.0f + 3 * small))) << master.grad();
  });
}

// The reducer's refusals: a parameter without a gradient in the armed backward is named
// (its bucket could never be sent), finish() without arm() says what is missing, and a
// second gradient of one parameter in an armed step is refused, as are buffers Gloo cannot
// sum in place. A batch that does not split into equal micro-batches names the sizes.
TEST(DataParallel, ReducerAndMicroBatchErrorsNameWhatIsWrong) {
  run_ranks(2, [&](int64_t) {
    DeviceMesh dp = init_device_mesh("cpu", {2}, {"dp"});
    torch::nn::Linear a(8, 8), b(8, 8);
    torch::OrderedDict<std::string, at::Tensor> params;
    params.insert("a.weight", a->weight);
    params.insert("b.weight", b->weight);
    DataParallelReducer reducer(params, dp, 1 << 20);
    expect_error([&] { reducer.finish(); }, "without arm()");
    reducer.arm();
    a(at::ones({2, 8})).sum().backward();  // b takes no part
    expect_error([&] { reducer.finish(); }, "parameter 'b.weight' got no gradient");
    // Two backward calls in one armed step: the second would send a.weight twice.
    reducer.arm();
    const at::Tensor loss = a(at::ones({2, 8})).sum() + b(at::ones({2, 8})).sum();
    loss.backward({}, /*retain_graph=*/true);
    expect_error([&] { loss.backward(); }, "got two gradients in one backward");
    // The asynchronous all-reduce under the buckets takes only what Gloo can sum in place.
    const Communicator& comm = dp.comm(0);
    for (const at::Tensor& bad : {at::zeros({4, 4}).t(), at::zeros({4}, at::kBFloat16)}) {
      expect_error([&] { PendingCollective::start_all_reduce(comm, bad).wait(); },
                   "PendingCollective::start_all_reduce: expected a contiguous buffer that Gloo can sum");
    }
  });
  const Batch five{at::zeros({5, 3}, at::kLong), at::zeros({5, 3}, at::kLong)};
  expect_error([&] { micro_batch(five, 0, 2); }, "a batch of 5 rows cannot be split into 2 equal parts");
  const auto global = std::make_shared<SyntheticBatchStream>(512, 4, 8, 1, 0);
  struct BadRows {
    std::shared_ptr<const BatchSource> source;
    int64_t rank, size;
    std::string expected;
  };
  for (const BadRows& c :
       std::vector<BadRows>{{nullptr, 0, 1, "ReplicaRows: expected a batch source"},
                            {global, 2, 2, "ReplicaRows: expected 0 <= dp_rank < dp_size, got 2 and 2"},
                            {global, 0, 0, "ReplicaRows: expected 0 <= dp_rank < dp_size, got 0 and 0"}}) {
    expect_error([&] { ReplicaRows rows(c.source, c.rank, c.size); }, c.expected);
  }
}

// loss_parallel on the tp sub-mesh of a dp x tp mesh, reduction mean (and sum): each
// replica's loss and logits gradient equal one process on that replica's rows.
TEST(DataParallel, LossParallelMeanOnTheTpSubMeshOfA2DMesh) {
  const int64_t dp = 2, tp = 2, rows = 6, vocab = 37;
  run_ranks(dp * tp, [&](int64_t rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {dp, tp}, {"dp", "tp"});
    const int64_t replica = mesh.local_rank(0);
    const at::Tensor full = random_tensor({rows, vocab}, 20 + replica);
    at::Tensor target = random_tensor({rows}, 30 + replica).abs().mul(1000).to(at::kLong).remainder(vocab);
    target[replica].fill_(-100);  // an ignored target too
    for (auto reduction : {at::Reduction::Mean, at::Reduction::Sum}) {
      const at::Tensor ref_in = full.clone().requires_grad_(true);
      const at::Tensor ref = at::cross_entropy_loss(ref_in, target, {}, reduction, -100);
      ref.backward();
      const at::Tensor logits =
          distribute_tensor(full, mesh["tp"], {Placement::shard(1)}).detach().requires_grad_(true);
      at::Tensor loss;
      {
        auto guard = loss_parallel();
        loss = at::cross_entropy_loss(logits, target, {}, reduction, -100);
        loss.backward();
      }
      EXPECT_NEAR(full_tensor(loss).item<double>(), ref.item<double>(), 1e-12) << "rank " << rank;
      EXPECT_TRUE(at::allclose(full_tensor(logits.grad()), ref_in.grad(), 1e-12, 1e-12)) << "rank " << rank;
    }
  });
}

// Checkpoints of a dp 2 x tp 2 job (every rank writes its file, rank 0 verifies all four):
// 3 steps, save, resume, 3 more equal 6 straight steps exactly.
TEST(DataParallel, Dp2Tp2ResumesExactly) {
  JobConfig straight = small_job(2, 2, 1);
  straight.dump_folder += "_straight";
  compat::remove_all(straight.dump_folder);
  const auto full = train_steps(straight, 1, 6);
  JobConfig first = small_job(2, 2, 1);
  first.dump_folder += "_split";
  compat::remove_all(first.dump_folder);
  first.checkpoint.enable = true;
  train_steps(first, 1, 3, /*save=*/true);
  JobConfig second = first;
  second.checkpoint.resume = true;
  const auto rest = train_steps(second, 4, 6, /*save=*/false, /*report_rank=*/3);
  ASSERT_EQ(rest.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rest[i].loss, full[3 + i].loss) << "step " << 4 + i;
  compat::remove_all(first.dump_folder);
  compat::remove_all(straight.dump_folder);
}

// Item 5 with data parallelism live: saved at dp 2 x tp 2 after 3 steps, resumed at
// dp 1 x tp 4 and at dp 4 x tp 1; steps 4-6 equal an uninterrupted run at the new layout
// (float64: the runs differ only in float summation order before the save).
TEST(DataParallel, ACheckpointOfDp2Tp2ResumesAtDp1Tp4AndDp4Tp1) {
  JobConfig saved = small_job(2, 2, 1);
  saved.dump_folder += "_reshard";
  compat::remove_all(saved.dump_folder);
  saved.checkpoint.enable = true;
  train_steps(saved, 1, 3, /*save=*/true);
  for (auto [dp, tp] : {std::pair<int64_t, int64_t>{1, 4}, {4, 1}}) {
    JobConfig straight = small_job(dp, tp, 1);
    straight.dump_folder += "_straight" + std::to_string(dp);
    compat::remove_all(straight.dump_folder);
    const auto full = train_steps(straight, 1, 6);
    JobConfig again = small_job(dp, tp, 1);
    again.dump_folder = saved.dump_folder;
    again.checkpoint.enable = true;
    again.checkpoint.resume = true;
    const auto resumed = train_steps(again, 4, 6, /*save=*/false, /*report_rank=*/3);
    ASSERT_EQ(resumed.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(resumed[i].loss, full[3 + i].loss, 1e-9 * full[3 + i].loss)
          << "dp " << dp << " x tp " << tp << ", step " << 4 + i;
    }
    compat::remove_all(straight.dump_folder);
  }
  compat::remove_all(saved.dump_folder);
}

}  // namespace data_parallel_test
