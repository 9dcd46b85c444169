// loss_parallel beyond the fused loss: the K1/K2 op routes, log_softmax feeding other
// consumers, communication budgets, errors, configuration, threads and the cache.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <thread>

#include "harness/job_errors.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"
#include "loss/front/loss_parallel_dispatch.h"

namespace loss_parallel_behaviour_test {

using namespace hyper_parallel;
using hyper_parallel::testing::error_of;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

bool close(const at::Tensor& a, const at::Tensor& b, double tol = 1e-10) {
  return torch::allclose(a.to(torch::kDouble), b.to(torch::kDouble), tol, tol);
}

at::Tensor sharded_logits(const at::Tensor& full, const DeviceMesh& mesh, int64_t class_dim = 1) {
  return distribute_tensor(full, mesh, {Shard(class_dim)}).set_requires_grad(true);
}

// Restores the process-wide config at scope exit.
struct ConfigScope {
  ParallelismConfig saved = parallelism_config();
  explicit ConfigScope(const ParallelismConfig& c) { set_parallelism_config(c); }
  ~ConfigScope() { set_parallelism_config(saved); }
};

}  // namespace

TEST(LossParallelKernels, LogSoftmaxIsDistributedAndExact) {
  run_ranks(3, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {3});
    at::Tensor full = random_tensor({6, 11}, 1) * 5;
    at::Tensor x = sharded_logits(full, mesh);
    auto guard = loss_parallel();
    reset_collective_counts();
    at::Tensor lp = torch::log_softmax(x, 1);
    EXPECT_EQ(collective_counts().all_reduce, 2) << "K1: a MAX and a SUM all-reduce";
    EXPECT_EQ(collective_counts().all_gather, 1) << "the call's record, before the all-reduces sized by rows";
    EXPECT_EQ(collective_counts().total(), 3);
    EXPECT_EQ(placements_of(lp), Placements{Shard(1)});
    EXPECT_TRUE(close(full_tensor(lp), torch::log_softmax(full, 1)));
  });
}

TEST(LossParallelKernels, NllOverLogSoftmaxMatchesAndItsBackwardIsCorrect) {
  run_ranks(4, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {4});
    at::Tensor full = random_tensor({7, 10}, 2) * 3;
    at::Tensor target = torch::tensor({0, 9, 3, 3, -1, 5, 7}, torch::kLong);
    at::Tensor weight = random_tensor({10}, 20).abs() + 0.5;  // the same on every rank
    for (auto reduction : {at::Reduction::None, at::Reduction::Mean, at::Reduction::Sum}) {
      F::NLLLossFuncOptions::reduction_t r = torch::kMean;
      if (reduction == at::Reduction::None) r = torch::kNone;
      if (reduction == at::Reduction::Sum) r = torch::kSum;
      auto opts = F::NLLLossFuncOptions().weight(weight).ignore_index(-1).reduction(r);
      at::Tensor ref_x = full.clone().set_requires_grad(true);
      at::Tensor ref = F::nll_loss(torch::log_softmax(ref_x, 1), target, opts);
      ref.sum().backward();

      at::Tensor x = sharded_logits(full, mesh);
      auto guard = loss_parallel();
      reset_collective_counts();
      at::Tensor loss = F::nll_loss(torch::log_softmax(x, 1), target, opts);
      EXPECT_EQ(collective_counts().all_reduce, 3) << "K1 (2) + K2 (1)";
      EXPECT_EQ(collective_counts().all_gather, 2) << "each op's call record (nll_loss's settles its checks)";
      EXPECT_TRUE(layout_of(loss).is_replicated());
      EXPECT_TRUE(close(to_local(loss), ref));
      reset_collective_counts();
      loss.sum().backward();
      // Not the fused cross_entropy: the log_softmax backward needs its one all-reduce.
      EXPECT_EQ(collective_counts().total(), 1);
      EXPECT_TRUE(close(full_tensor(x.grad()), ref_x.grad()));
    }
  });
}

// The out= forms of the routed ops (nll_loss's nll_loss_forward.output, _log_softmax.out)
// give what the functional forms give: a plain out receives the full value, as one
// process computes it; a DTensor out keeps its layout. (They reached the kernels with
// their outs still on the stack: "Expected Tensor but got None".)
TEST(LossParallelKernels, OutFormsWriteTheFunctionalResult) {
  run_ranks(3, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {3});
    const at::Tensor full = random_tensor({5, 10}, 4) * 3;
    const at::Tensor target = torch::tensor({0, 9, 3, -100, 5}, torch::kLong);
    const at::Tensor ref_lsm = at::log_softmax(full, 1);
    const at::Tensor ref_loss = at::nll_loss(ref_lsm, target);
    at::Tensor x = distribute_tensor(full, mesh, {Shard(1)});
    auto guard = loss_parallel();
    at::Tensor lsm_out = at::empty_like(x);  // a DTensor sharded like x
    at::_log_softmax_out(lsm_out, x, 1, false);
    EXPECT_TRUE(is_dtensor(lsm_out));
    EXPECT_TRUE(close(full_tensor(lsm_out), ref_lsm));
    at::Tensor loss_out = at::empty({7}, at::kDouble);  // plain, the wrong size: resized as ATen's out=
    at::nll_loss_out(loss_out, lsm_out, target);
    EXPECT_FALSE(is_dtensor(loss_out));
    EXPECT_EQ(loss_out.dim(), 0);
    EXPECT_TRUE(close(loss_out, ref_loss));
  });
}

TEST(LossParallelKernels, CrossEntropyBackwardIsFusedWithoutCommunication) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor x = sharded_logits(random_tensor({5, 8}, 3), mesh);
    auto guard = loss_parallel();
    reset_collective_counts();
    at::Tensor loss = F::cross_entropy(x, torch::tensor({1, 2, 3, 7, 0}));
    EXPECT_EQ(collective_counts().all_gather, 2) << "the call's record, then the per-row statistics";
    EXPECT_EQ(collective_counts().total(), 2);
    reset_collective_counts();
    loss.backward();
    EXPECT_EQ(collective_counts().total(), 0);
  });
}

// PyTorch's loss_parallel gives log_softmax an identity backward (its issue #190746):
// wrong whenever the log-probs feed anything but nll_loss. Here every consumer is exact.
TEST(LossParallelConsumers, LogSoftmaxFeedingKlGatherAndSumHasCorrectGradients) {
  run_ranks(3, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {3});
    at::Tensor full = random_tensor({4, 9}, 4) * 2;
    at::Tensor q = torch::softmax(random_tensor({4, 9}, 5), 1);
    at::Tensor ids = torch::tensor({{1}, {8}, {4}, {0}}, torch::kLong);
    auto consumers = std::vector<std::pair<std::string, std::function<at::Tensor(const at::Tensor&)>>>{
        {"kl_div",
         [&](const at::Tensor& lp) { return F::kl_div(lp, q, F::KLDivFuncOptions().reduction(torch::kBatchMean)); }},
        {"kl_div mean",
         [&](const at::Tensor& lp) { return F::kl_div(lp, q, F::KLDivFuncOptions().reduction(torch::kMean)); }},
        {"dpo gather", [&](const at::Tensor& lp) { return lp.gather(1, ids).sum(); }},
        {"sum", [&](const at::Tensor& lp) { return (lp * lp).sum(); }},
    };
    for (const auto& [name, consume] : consumers) {
      at::Tensor ref_x = full.clone().set_requires_grad(true);
      at::Tensor ref = consume(torch::log_softmax(ref_x, 1));
      ref.backward();
      at::Tensor x = sharded_logits(full, mesh);
      at::Tensor out;
      {
        auto guard = loss_parallel();
        out = consume(torch::log_softmax(x, 1));
        EXPECT_TRUE(close(full_tensor(out), ref)) << name;
        full_tensor(out).backward();
      }
      EXPECT_TRUE(close(full_tensor(x.grad()), ref_x.grad())) << name;
    }
  });
}

TEST(LossParallelConsumers, CrossEntropyPlusKlOnTheSameLogProbs) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = random_tensor({6, 7}, 6);
    at::Tensor q = torch::softmax(random_tensor({6, 7}, 7), 1);
    at::Tensor t = torch::tensor({0, 6, 2, 2, 5, 1});
    auto both = [&](const at::Tensor& x) {
      at::Tensor lp = torch::log_softmax(x, 1);
      return F::nll_loss(lp, t) + F::kl_div(lp, q, F::KLDivFuncOptions().reduction(torch::kSum));
    };
    at::Tensor ref_x = full.clone().set_requires_grad(true);
    both(ref_x).backward();
    at::Tensor x = sharded_logits(full, mesh);
    auto guard = loss_parallel();
    full_tensor(both(x)).backward();
    EXPECT_TRUE(close(full_tensor(x.grad()), ref_x.grad()));
  });
}

TEST(LossParallelErrors, ChangingTheLogitsInPlaceBeforeBackwardIsAnError) {
  // The fused node keeps the logits for backward: an in-place change in between must raise
  // LibTorch's usual error, not give the gradient of other logits (it gave 2.15e5 for -0.129).
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    at::Tensor leaf = sharded_logits(random_tensor({4, 6}, 3), mesh);
    at::Tensor logits = leaf * 1.0;  // not a leaf, so it may be changed in place
    at::Tensor target = at::tensor({0, 5, 2, 3}, at::kLong);
    auto guard = loss_parallel();
    at::Tensor loss = F::cross_entropy(logits, target);
    logits.mul_(10);
    const std::string err = error_of<c10::Error>([&] { loss.backward(); });
    EXPECT_NE(err.find("modified by an inplace operation"), std::string::npos) << err;
  });
}

TEST(LossParallelErrors, LayoutErrorsNameTheExpectedLayout) {
  run_ranks(4, [](int64_t) {
    auto mesh2d = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    auto tp = mesh2d["tp"];
    at::Tensor full = random_tensor({4, 6}, 8);
    at::Tensor t = torch::tensor({0, 1, 2, 3});
    auto guard = loss_parallel();
    // Strict: a 2-D mesh outside PyTorch's contract (Partial on the non-class dim) is refused,
    // naming the layout expected and the one found.
    const at::Tensor piece = to_local(distribute_tensor(full, mesh2d, {Replicate(), Shard(1)}));
    std::string msg = error_of<LossParallelLayoutError>([&] {
      F::cross_entropy(DTensor::from_local(piece, mesh2d, {Partial(), Shard(1)}), t,
                       F::CrossEntropyFuncOptions().reduction(torch::kSum));
    });
    EXPECT_NE(msg.find("exactly one mesh dim"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[Partial(sum), Shard(1)]"), std::string::npos) << msg;
    // The class dim must be the sharded one.
    msg = error_of<LossParallelLayoutError>([&] { F::cross_entropy(distribute_tensor(full, tp, {Shard(0)}), t); });
    EXPECT_NE(msg.find("exactly one mesh dim (Shard(1))"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got [Shard(0)]"), std::string::npos) << msg;
    // Targets and weights must be replicated.
    at::Tensor x = distribute_tensor(full, tp, {Shard(1)});
    msg = error_of<LossParallelLayoutError>([&] { F::cross_entropy(x, distribute_tensor(t, tp, {Shard(0)})); });
    EXPECT_NE(msg.find("target to be replicated"), std::string::npos) << msg;
    msg = error_of<LossParallelLayoutError>([&] {
      F::cross_entropy(
          x, t,
          F::CrossEntropyFuncOptions().weight(distribute_tensor(torch::ones({6}, torch::kDouble), tp, {Shard(0)})));
    });
    EXPECT_NE(msg.find("class weight to be replicated"), std::string::npos) << msg;
    // A DTensor is required where the logits are plain but the target is not.
    msg = error_of<LossParallelLayoutError>([&] { F::cross_entropy(full, distribute_tensor(t, tp, {Replicate()})); });
    EXPECT_NE(msg.find("plain tensor"), std::string::npos) << msg;
    // Partial logits.
    msg = error_of<LossParallelLayoutError>([&] { F::cross_entropy(DTensor::from_local(full, tp, {Partial()}), t); });
    EXPECT_NE(msg.find("Partial"), std::string::npos) << msg;
  });
}

TEST(LossParallelErrors, TheGuardsMeshMustBeTheLogitsMesh) {
  run_ranks(4, [](int64_t) {
    auto mesh2d = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    at::Tensor x = distribute_tensor(random_tensor({4, 6}, 8), mesh2d["tp"], {Shard(1)});
    auto guard = loss_parallel(LossParallelOptions{mesh2d["dp"], std::nullopt});
    const std::string msg = error_of<LossParallelLayoutError>([&] {
      F::cross_entropy(x, torch::tensor({0, 1, 2, 3}));
    });
    EXPECT_NE(msg.find("expected the input on that mesh"), std::string::npos) << msg;
  });
}

TEST(LossParallelErrors, UnsupportedGradientsOfTargetsAreReported) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor x = sharded_logits(random_tensor({3, 4}, 9), mesh);
    at::Tensor q = torch::softmax(random_tensor({3, 4}, 10), 1).set_requires_grad(true);
    auto guard = loss_parallel();
    EXPECT_NE(error_of<LossParallelUnsupportedError>([&] { F::cross_entropy(x, q); }).find("target"),
              std::string::npos);
  });
}

TEST(LossParallelErrors, OutsideTheContextShardedLogitsAreRefusedUnlessFallbackIsSet) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = random_tensor({5, 6}, 11);
    at::Tensor t = torch::tensor({0, 5, 2, 3, 1});
    at::Tensor x = sharded_logits(full, mesh);
    std::string msg = error_of<LossParallelLayoutError>([&] { F::cross_entropy(x, t); });
    EXPECT_NE(msg.find("loss_parallel()"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fallback"), std::string::npos) << msg;
    // nll_loss directly on sharded log-probs, outside: the same error.
    at::Tensor lp = distribute_tensor(torch::log_softmax(full, 1), mesh, {Shard(1)});
    EXPECT_NE(error_of<LossParallelLayoutError>([&] { F::nll_loss(lp, t); }).find("loss_parallel()"),
              std::string::npos);
  });
  ParallelismConfig c;
  c.loss_parallel_fallback_on_layout_error = true;
  ConfigScope scope(c);
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = random_tensor({5, 6}, 11);
    at::Tensor t = torch::tensor({0, 5, 2, 3, 1});
    at::Tensor x = sharded_logits(full, mesh);
    at::Tensor ref_x = full.clone().set_requires_grad(true);
    at::Tensor ref = F::cross_entropy(ref_x, t);
    ref.backward();
    at::Tensor loss = F::cross_entropy(x, t);  // all-gathers, with a warning
    loss.backward();
    EXPECT_TRUE(close(full_tensor(loss), ref));
    EXPECT_TRUE(close(full_tensor(x.grad()), ref_x.grad()));
  });
}

TEST(LossParallelContext, NestingIsReentrantAndContradictionsAreErrors) {
  run_ranks(1, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {1});
    EXPECT_FALSE(is_loss_parallel_active());
    {
      auto outer = loss_parallel(LossParallelOptions{mesh, true});
      {
        auto inner = loss_parallel();  // no options: nests
        auto same = loss_parallel(LossParallelOptions{mesh, true});
        EXPECT_EQ(loss_parallel_depth(), 3);
        EXPECT_THROW(loss_parallel(LossParallelOptions{std::nullopt, false}), LossParallelLayoutError);
      }
      EXPECT_TRUE(is_loss_parallel_active());
      EXPECT_EQ(loss_parallel_depth(), 1);
    }
    EXPECT_FALSE(is_loss_parallel_active());
    EXPECT_EQ(layout_cache_context_token(), 0u) << "leaving the outermost guard restores the token";
    EXPECT_EQ(with_loss_parallel([] { return loss_parallel_depth(); }), 1);
  });
}

TEST(LossParallelContext, ConfigIsTheRootAndGuardOptionsOverrideStrictness) {
  ParallelismConfig c;
  c.disable_loss_parallel = true;
  {
    ConfigScope scope(c);
    auto g = loss_parallel();
    EXPECT_FALSE(is_loss_parallel_active()) << "disable_loss_parallel turns guards off";
  }
  c = ParallelismConfig{};
  c.loss_parallel_strict_mesh = false;
  ConfigScope scope(c);
  run_ranks(4, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2, 2});
    at::Tensor full = random_tensor({4, 6}, 12);
    at::Tensor t = torch::tensor({0, 1, 5, 3});
    at::Tensor ref = F::cross_entropy(full, t);
    // The class dim sharded by both mesh dims: outside the contract.
    at::Tensor x = distribute_tensor(full, mesh, {Shard(1), Shard(1)}).set_requires_grad(true);
    {
      auto g = loss_parallel();  // strict from the config: false -> re-laid out to [Replicate(), Shard(1)]
      at::Tensor loss = F::cross_entropy(x, t);
      EXPECT_TRUE(close(full_tensor(loss), ref));
      loss.backward();
    }
    at::Tensor ref_x = full.clone().set_requires_grad(true);
    F::cross_entropy(ref_x, t).backward();
    EXPECT_TRUE(close(full_tensor(x.grad()), ref_x.grad()));
    auto strict = loss_parallel(LossParallelOptions{std::nullopt, true});  // the guard overrides
    EXPECT_THROW(F::cross_entropy(x, t), LossParallelLayoutError);
  });
}

TEST(LossParallelThreads, BackwardOnAnotherThreadAndGuardsDoNotLeakAcrossThreads) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = random_tensor({4, 5}, 13);
    at::Tensor t = torch::tensor({4, 0, 2, 1});
    at::Tensor ref_x = full.clone().set_requires_grad(true);
    F::nll_loss(torch::log_softmax(ref_x, 1), t).backward();
    at::Tensor x = sharded_logits(full, mesh);
    at::Tensor loss;
    {
      auto guard = loss_parallel();
      loss = F::nll_loss(torch::log_softmax(x, 1), t);  // op routes, not the fused path
    }
    // Backward after the guard, from a thread that never entered it.
    std::thread([&] { loss.backward(); }).join();
    EXPECT_TRUE(close(full_tensor(x.grad()), ref_x.grad()));
  });
  // Two threads: one inside a guard, one outside; neither sees the other's state.
  std::mutex m;
  std::condition_variable cv;
  int stage = 0;
  bool inside_seen = false, outside_seen = true;
  std::thread inside([&] {
    auto g = loss_parallel();
    std::unique_lock<std::mutex> lock(m);
    stage = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return stage == 2; });
    inside_seen = is_loss_parallel_active();
  });
  std::thread outside([&] {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return stage == 1; });
    outside_seen = is_loss_parallel_active();
    stage = 2;
    cv.notify_all();
  });
  inside.join();
  outside.join();
  EXPECT_TRUE(inside_seen);
  EXPECT_FALSE(outside_seen);
}

// As under PyTorch's loss_parallel: plain tensors inside the context (an auxiliary classifier's
// loss, a whole step under the guard) are LibTorch's own ops, under either strictness.
TEST(LossParallelContext, PlainTensorsInsideTheGuardAreLibTorchsOwn) {
  at::Tensor logits = random_tensor({6, 11}, 31);
  at::Tensor target = torch::randint(11, {6}, at::make_generator<at::CPUGeneratorImpl>(32));
  target[1] = -100;
  at::Tensor weight = random_tensor({11}, 33).abs() + 0.5;
  auto losses = [&](const at::Tensor& x) {
    return std::vector<at::Tensor>{
        F::cross_entropy(x, target, F::CrossEntropyFuncOptions().weight(weight).label_smoothing(0.1)),
        F::cross_entropy(x, torch::softmax(logits, 1)),
        F::nll_loss(F::log_softmax(x, F::LogSoftmaxFuncOptions(1)), target, F::NLLLossFuncOptions().weight(weight)),
        torch::log_softmax(x, 1).sum()};
  };
  for (std::optional<bool> strict : {std::optional<bool>(), std::optional<bool>(true), std::optional<bool>(false)}) {
    at::Tensor want_x = logits.clone().set_requires_grad(true);
    std::vector<at::Tensor> want = losses(want_x);
    at::Tensor x = logits.clone().set_requires_grad(true);
    std::vector<at::Tensor> got;
    {
      LossParallelOptions o;
      o.strict = strict;
      auto guard = loss_parallel(o);
      got = losses(x);
      for (const auto& g : got) g.backward();
    }
    for (const auto& w : want) w.backward();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_FALSE(is_dtensor(got[i])) << i;
      EXPECT_TRUE(torch::equal(got[i], want[i])) << "loss " << i;
    }
    EXPECT_TRUE(torch::equal(x.grad(), want_x.grad()));
  }
}

TEST(LossParallelRegression, ShardedHeadWithLossParallelEqualsReplicatedHeadWithout) {
  run_ranks(3, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {3});
    at::Tensor h = random_tensor({2, 5, 8}, 14);
    at::Tensor w = random_tensor({13, 8}, 15);  // V = 13: uneven over 3 ranks
    at::Tensor t = torch::randint(13, {2, 5}, at::make_generator<at::CPUGeneratorImpl>(16));
    // Disabled: replicated head, plain logits, plain cross_entropy.
    at::Tensor w_rep = distribute_tensor(w, mesh, {Replicate()}).set_requires_grad(true);
    at::Tensor logits_rep = to_local(torch::matmul(h, w_rep.t()));
    at::Tensor loss_rep = F::cross_entropy(logits_rep.reshape({-1, 13}), t.reshape({-1}));
    loss_rep.backward();
    // Enabled: colwise head (Shard(0) weight -> Shard(-1) logits), loss_parallel.
    at::Tensor w_col = distribute_tensor(w, mesh, {Shard(0)}).set_requires_grad(true);
    at::Tensor logits = torch::matmul(h, w_col.t());
    EXPECT_EQ(placements_of(logits), Placements{Shard(2)});
    at::Tensor loss;
    {
      auto guard = loss_parallel();
      loss = F::cross_entropy(logits.reshape({-1, 13}), t.reshape({-1}));
      loss.backward();
    }
    EXPECT_TRUE(close(to_local(loss), loss_rep));
    EXPECT_TRUE(close(full_tensor(w_col.grad()), full_tensor(w_rep.grad())));
  });
}

TEST(LossParallelCache, TheSameOpAndLayoutTakeDifferentRoutesInsideAndOutside) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = random_tensor({3, 6}, 17);
    at::Tensor x = distribute_tensor(full, mesh, {Shard(1)});
    at::Tensor outside = torch::log_softmax(x, 1);  // ordinary rule: the class dim is gathered
    EXPECT_EQ(placements_of(outside), Placements{Replicate()});
    {
      auto guard = loss_parallel();
      at::Tensor inside = torch::log_softmax(x, 1);  // K1: stays sharded
      EXPECT_EQ(placements_of(inside), Placements{Shard(1)});
      EXPECT_TRUE(close(full_tensor(inside), full_tensor(outside)));
      at::Tensor e = torch::exp(x);  // an ordinary op inside: cached under the context token
      EXPECT_EQ(placements_of(e), Placements{Shard(1)});
    }
    EXPECT_EQ(placements_of(torch::log_softmax(x, 1)), Placements{Replicate()}) << "no stale hit";
  });
}

TEST(LossParallelCache, ARuleThatReadsTheConfigSeesItsChanges) {
  // nll_loss outside the context reads loss_parallel_fallback_on_layout_error: a decision
  // cached while it was on must not outlive it.
  ParallelismConfig on;
  on.loss_parallel_fallback_on_layout_error = true;
  ConfigScope scope(on);
  run_ranks(2, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = random_tensor({5, 6}, 11);
    at::Tensor t = torch::tensor({0, 5, 2, 3, 1});
    at::Tensor lp = distribute_tensor(torch::log_softmax(full, 1), mesh, {Shard(1)});
    F::nll_loss(lp, t);  // gathers: the fallback is on
    mesh.comm(0).barrier();
    if (rank == 0) {
      ParallelismConfig off = parallelism_config();
      off.loss_parallel_fallback_on_layout_error = false;
      set_parallelism_config(off);
    }
    mesh.comm(0).barrier();
    EXPECT_NE(error_of<LossParallelLayoutError>([&] { F::nll_loss(lp, t); }).find("loss_parallel()"),
              std::string::npos);
  });
}

TEST(LossParallelNames, TableCoversTheDecompositionAndIsExtendable) {
  auto names = loss_parallel_op_names();
  for (const char* n : {"_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss2d_forward",
                        "nll_loss_backward", "nll_loss2d_backward", "cross_entropy_loss"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  // The added name lives only as long as this test: later tests see the built-in table.
  struct Registered {
    Registered() { register_loss_parallel_op_names({"softmax_test_only"}); }
    ~Registered() { unregister_loss_parallel_op_names({"softmax_test_only"}); }
  };
  {
    Registered scope;
    names = loss_parallel_op_names();
    EXPECT_NE(std::find(names.begin(), names.end(), "softmax_test_only"), names.end());
  }
  names = loss_parallel_op_names();
  EXPECT_EQ(std::find(names.begin(), names.end(), "softmax_test_only"), names.end());
  EXPECT_THROW(unregister_loss_parallel_op_names({"nll_loss_forward"}), c10::ValueError) << "built-ins stay";
  names = loss_parallel_op_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "nll_loss_forward"), names.end());
}

}  // namespace loss_parallel_behaviour_test
