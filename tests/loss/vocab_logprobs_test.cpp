// hyper_parallel/vocab_logprobs.h: per-token log-probabilities and entropy at a temperature,
// on local pieces, on class-sharded DTensors and fused with the head, against one process's
// ATen in float64 (values and gradients for random upstream gradients on both outputs),
// TP 1-4 (13 classes: uneven pieces), and against the cross-entropy bit for bit at T = 1.
#include "hyper_parallel/vocab_logprobs.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "harness/rank_harness.h"
#include "harness/rounding_bound.h"
#include "hyper_parallel/collective_stats.h"
#include "hyper_parallel/device_mesh.h"
#include "hyper_parallel/dtensor.h"
#include "hyper_parallel/vocab_parallel.h"
#include "loss/fused_cross_entropy.h"

namespace vocab_logprobs_test {

namespace hp = hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;

namespace {

constexpr int64_t kVocab = 13;

at::Tensor piece(const at::Tensor& full, int64_t rank, int64_t world, int64_t dim = -1) {
  const auto r = hp::chunk_range(full.size(dim), world, rank);
  return full.narrow(dim, r.offset, r.length);
}

double relative_error(const at::Tensor& got, const at::Tensor& want) {
  if (want.numel() == 0) return 0;
  return (got.to(at::kDouble) - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>());
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what, double tol = 1e-12) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_LE(relative_error(got, want), tol) << what;
}

// One process's answer by ATen's autograd in float64: log_softmax(x / T) at the target, the
// entropy of softmax(x / T), both 0 for ignored rows, and d/dx of sum(g_lp lp + g_h H).
struct Reference {
  at::Tensor logprobs, entropy, grad;
};
Reference reference(const at::Tensor& full, const at::Tensor& target, double temperature, const at::Tensor& g_lp,
                    const at::Tensor& g_h, int64_t ignore_index = -100) {
  const at::Tensor x = full.to(at::kDouble).detach().requires_grad_();
  const at::Tensor lsm = at::log_softmax(x / temperature, -1);
  const at::Tensor valid = target.ne(ignore_index);
  const at::Tensor idx = at::where(valid, target, at::zeros_like(target));
  const at::Tensor lp = lsm.gather(-1, idx.unsqueeze(-1)).squeeze(-1) * valid;
  const at::Tensor h = -(lsm.exp() * lsm).sum(-1) * valid;
  (lp * g_lp + h * g_h).sum().backward();
  return {lp.detach(), h.detach(), x.grad()};
}

at::Tensor sampled(c10::IntArrayRef shape, uint64_t seed, int64_t vocab) {
  return (random_tensor(shape, seed).abs() * 1000).to(at::kLong).remainder(vocab);
}

}  // namespace

TEST(VocabLogprobs, LocalPiecesMatchOneProcessForEveryTemperatureAndUpstreamGradient) {
  for (int64_t world : {1, 2, 3, 4}) {
    run_ranks(world, [world](int64_t rank) {
      auto mesh = hp::init_device_mesh("cpu", {world});
      const hp::Communicator* comm = &mesh.comm(0);
      const at::Tensor full = random_tensor({3, 5, kVocab}, 1) * 4;
      at::Tensor target = sampled({3, 5}, 2, kVocab);
      target.index_put_({1, at::indexing::Slice(at::indexing::None, at::indexing::None, 2)}, -100);
      const at::Tensor g_lp = random_tensor({3, 5}, 3), g_h = random_tensor({3, 5}, 4);
      const at::Tensor x = piece(full, rank, world).contiguous();
      for (auto [temperature, vocab] :
           {std::tuple{1.0, kVocab}, std::tuple{0.7, int64_t{-1}}, std::tuple{2.5, kVocab}}) {
        SCOPED_TRACE("TP " + std::to_string(world) + " T " + std::to_string(temperature));
        const Reference ref = reference(full, target, temperature, g_lp, g_h);
        hp::LogprobsOptions o;
        o.temperature = temperature;
        o.return_entropy = true;
        hp::LogprobsSaved saved;
        hp::reset_collective_counts();
        const hp::Logprobs out = hp::vocab_parallel_logprobs_forward(x, -1, target, comm, vocab, o, &saved);
        // The call's record, then the statistics: the cross-entropy's two all-gathers.
        EXPECT_EQ(hp::collective_counts().all_gather, world == 1 ? 1 : 2);
        EXPECT_EQ(hp::collective_counts().total(), world == 1 ? 1 : 2);
        expect_close(out.logprobs, ref.logprobs, "log-probabilities");
        expect_close(out.entropy, ref.entropy, "entropy");
        hp::reset_collective_counts();
        const at::Tensor grad = hp::vocab_parallel_logprobs_backward(g_lp, g_h, x, -1, target, saved, comm, kVocab, o);
        EXPECT_EQ(hp::collective_counts().total(), 0);
        expect_close(grad, piece(ref.grad, rank, world), "gradient");
        // Either output alone: the other's gradient is none.
        const Reference lp_only = reference(full, target, temperature, g_lp, at::zeros_like(g_h));
        expect_close(hp::vocab_parallel_logprobs_backward(g_lp, at::Tensor(), x, -1, target, saved, comm, kVocab, o),
                     piece(lp_only.grad, rank, world), "gradient of the log-probabilities alone");
        const Reference h_only = reference(full, target, temperature, at::zeros_like(g_lp), g_h);
        expect_close(hp::vocab_parallel_logprobs_backward(at::Tensor(), g_h, x, -1, target, saved, comm, kVocab, o),
                     piece(h_only.grad, rank, world), "gradient of the entropy alone");
      }
    });
  }
}

// At T = 1 the log-probabilities are the cross-entropy's -loss, bit for bit, in every dtype
// (the same statistics, combined the same way), also over several kernel blocks per row.
TEST(VocabLogprobs, AtTemperatureOneTheyAreMinusTheCrossEntropyBitForBit) {
  for (int64_t world : {1, 2, 3}) {
    run_ranks(world, [world](int64_t rank) {
      auto mesh = hp::init_device_mesh("cpu", {world});
      const hp::Communicator* comm = &mesh.comm(0);
      for (at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}) {
        const int64_t vocab = 9001;
        const at::Tensor full = (random_tensor({6, vocab}, 11) * 5).to(dtype);
        at::Tensor target = sampled({6}, 12, vocab);
        target[2] = -100;
        const at::Tensor x = piece(full, rank, world).contiguous();
        hp::VocabCrossEntropyOptions ce;
        ce.reduction = at::Reduction::None;
        const at::Tensor loss =
            hp::vocab_parallel_cross_entropy_forward(x, 1, target, std::nullopt, comm, vocab, ce, nullptr);
        for (bool entropy : {false, true}) {
          hp::LogprobsOptions o;
          o.return_entropy = entropy;
          const hp::Logprobs out = hp::vocab_parallel_logprobs_forward(x, 1, target, comm, vocab, o, nullptr);
          EXPECT_TRUE(at::equal(out.logprobs, loss.neg())) << dtype << " entropy " << entropy << " TP " << world;
        }
      }
    });
  }
}

TEST(VocabLogprobs, ClassShardedDTensorLogitsMatchOneProcessWithAutograd) {
  for (int64_t world : {1, 2, 3, 4}) {
    run_ranks(world, [world](int64_t rank) {
      auto mesh = hp::init_device_mesh("cpu", {world});
      const at::Tensor full = random_tensor({4, 3, kVocab}, 21) * 3;
      const at::Tensor target = sampled({4, 3}, 22, kVocab);
      const at::Tensor g_lp = random_tensor({4, 3}, 23), g_h = random_tensor({4, 3}, 24);
      const Reference ref = reference(full, target, 0.8, g_lp, g_h);
      const at::Tensor logits = hp::distribute_tensor(full, mesh, {hp::Shard(2)}).set_requires_grad(true);
      hp::LogprobsOptions o;
      o.temperature = 0.8;
      o.return_entropy = true;
      const hp::Logprobs out = hp::vocab_parallel_logprobs(logits, target, o);
      ASSERT_TRUE(hp::is_dtensor(out.logprobs));
      expect_close(hp::full_tensor(out.logprobs), ref.logprobs, "log-probabilities");
      expect_close(hp::full_tensor(out.entropy), ref.entropy, "entropy");
      (out.logprobs * g_lp + out.entropy * g_h).sum().backward();
      ASSERT_TRUE(logits.grad().defined());
      expect_close(hp::full_tensor(logits.grad()), ref.grad, "gradient");
      // The entropy left out: one output, its own gradient.
      const at::Tensor again = hp::distribute_tensor(full, mesh, {hp::Shard(2)}).set_requires_grad(true);
      (hp::vocab_parallel_logprobs(again, target, {}).logprobs * g_lp).sum().backward();
      expect_close(hp::full_tensor(again.grad()), reference(full, target, 1.0, g_lp, at::zeros_like(g_h)).grad,
                   "gradient without the entropy");
      (void)rank;
    });
  }
}

TEST(VocabLogprobs, FusedWithTheHeadMatchesOneProcessWithoutTheLogits) {
  for (int64_t world : {1, 2, 3, 4}) {
    run_ranks(world, [world](int64_t rank) {
      auto mesh = hp::init_device_mesh("cpu", {world});
      const hp::Communicator* comm = &mesh.comm(0);
      const at::Tensor hidden = random_tensor({9, 6}, 31), weight = random_tensor({kVocab, 6}, 32) * 2;
      at::Tensor target = sampled({9}, 33, kVocab);
      target[4] = -100;
      const at::Tensor g_lp = random_tensor({9}, 34), g_h = random_tensor({9}, 35);
      // The reference through the matmul: gradients of hidden and weight.
      const at::Tensor h_ref = hidden.clone().requires_grad_(), w_ref = weight.clone().requires_grad_();
      const at::Tensor logits = at::mm(h_ref, w_ref.t());
      const at::Tensor lsm = at::log_softmax(logits / 1.3, -1);
      const at::Tensor valid = target.ne(-100);
      const at::Tensor lp =
          lsm.gather(1, at::where(valid, target, at::zeros_like(target)).unsqueeze(1)).squeeze(1) * valid;
      const at::Tensor h = -(lsm.exp() * lsm).sum(-1) * valid;
      (lp * g_lp + h * g_h).sum().backward();
      hp::LogprobsOptions o;
      o.temperature = 1.3;
      o.return_entropy = true;
      o.chunk_tokens = 4;  // several token chunks and vocabulary blocks: the blocks' merge
      o.vocab_block = 2;
      const at::Tensor local_w = piece(weight, rank, world, 0).contiguous();
      hp::LogprobsSaved saved;
      const hp::Logprobs out = hp::vocab_parallel_linear_logprobs_forward(hidden, local_w, target, comm, -1, o, &saved);
      expect_close(out.logprobs, lp.detach(), "log-probabilities");
      expect_close(out.entropy, h.detach(), "entropy");
      hp::reset_collective_counts();
      const auto g = hp::vocab_parallel_linear_logprobs_backward(g_lp, g_h, hidden, local_w, target, saved, comm,
                                                                 kVocab, o, true, true);
      EXPECT_EQ(hp::collective_counts().all_reduce, 1);  // hidden's gradient, nothing else
      EXPECT_EQ(hp::collective_counts().total(), 1);
      expect_close(g[0], h_ref.grad(), "hidden's gradient");
      expect_close(g[1], piece(w_ref.grad(), rank, world, 0), "weight's gradient");
    });
  }
}

TEST(VocabLogprobs, FusedWithTheDTensorHeadMatchesOneProcessWithAutograd) {
  for (int64_t world : {1, 2, 3}) {
    run_ranks(world, [world](int64_t) {
      auto mesh = hp::init_device_mesh("cpu", {world});
      const at::Tensor hidden = random_tensor({7, 5}, 71), weight = random_tensor({kVocab, 5}, 72) * 2;
      const at::Tensor target = sampled({7}, 73, kVocab);
      const at::Tensor g_lp = random_tensor({7}, 74), g_h = random_tensor({7}, 75);
      const at::Tensor h_ref = hidden.clone().requires_grad_(), w_ref = weight.clone().requires_grad_();
      const at::Tensor lsm = at::log_softmax(at::mm(h_ref, w_ref.t()) / 0.9, -1);
      const at::Tensor lp = lsm.gather(1, target.unsqueeze(1)).squeeze(1);
      const at::Tensor ent = -(lsm.exp() * lsm).sum(-1);
      (lp * g_lp + ent * g_h).sum().backward();
      const at::Tensor h = hidden.clone().requires_grad_();
      const at::Tensor w = hp::distribute_tensor(weight, mesh, {hp::Shard(0)}).set_requires_grad(true);
      hp::LogprobsOptions o;
      o.temperature = 0.9;
      o.return_entropy = true;
      o.vocab_block = 2;
      const hp::Logprobs out = hp::fused_linear_logprobs(h, w, target, o);
      ASSERT_TRUE(hp::is_dtensor(out.logprobs));
      expect_close(hp::full_tensor(out.logprobs), lp.detach(), "log-probabilities");
      expect_close(hp::full_tensor(out.entropy), ent.detach(), "entropy");
      (out.logprobs * g_lp + out.entropy * g_h).sum().backward();
      expect_close(h.grad(), h_ref.grad(), "hidden's gradient");
      expect_close(hp::full_tensor(w.grad()), w_ref.grad(), "weight's gradient");
    });
  }
}

// Rows far apart in scale: logits of +-1e4, one class dominating, a masked (-inf) vocabulary
// tail, a row all but one -inf. Finite and right, with the ATen-op statistics (other devices)
// as with the CPU kernel.
TEST(VocabLogprobs, ExtremeAndMaskedLogitsAreFiniteAndRightOnEveryPath) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = hp::init_device_mesh("cpu", {2});
    const hp::Communicator* comm = &mesh.comm(0);
    const double inf = std::numeric_limits<double>::infinity();
    at::Tensor full = random_tensor({5, kVocab}, 41);
    full[0] = full[0] * 1e4;
    full[1].fill_(-1e4);
    full[1][7] = 1e4;
    full[2].narrow(0, 9, 4).fill_(-inf);
    full[3].fill_(-inf);
    full[3][0] = 3.0;
    full[4] = full[4] * 30;
    const at::Tensor target = at::tensor({3, 7, 2, 0, 12}, at::kLong);
    const at::Tensor g_lp = random_tensor({5}, 42), g_h = random_tensor({5}, 43);
    // The reference analytically in float64 (autograd's p log p is NaN at p = 0).
    const double temperature = 0.9;
    const at::Tensor lsm = at::log_softmax(full / temperature, -1), p = lsm.exp();
    const at::Tensor plogp = at::where(p.gt(0), p * lsm, at::zeros_like(p));
    const at::Tensor ent = -plogp.sum(-1);
    const at::Tensor onehot = at::one_hot(target, kVocab).to(at::kDouble);
    const at::Tensor grad_y = g_lp.unsqueeze(1) * (onehot - p) - g_h.unsqueeze(1) * (plogp + p * ent.unsqueeze(1));
    const at::Tensor ref_grad = grad_y / temperature;
    const at::Tensor x = piece(full, rank, 2).contiguous();
    hp::LogprobsOptions o;
    o.temperature = temperature;
    o.return_entropy = true;
    for (bool aten : {false, true}) {
      SCOPED_TRACE(aten ? "ATen-op statistics" : "CPU kernel");
      std::optional<hp::AtenStatisticsForTesting> use_aten;
      if (aten) use_aten.emplace();
      hp::LogprobsSaved saved;
      const hp::Logprobs out = hp::vocab_parallel_logprobs_forward(x, 1, target, comm, kVocab, o, &saved);
      EXPECT_TRUE(out.logprobs.isfinite().all().item<bool>()) << out.logprobs;
      EXPECT_TRUE(out.entropy.isfinite().all().item<bool>()) << out.entropy;
      expect_close(out.logprobs, lsm.gather(1, target.unsqueeze(1)).squeeze(1), "log-probabilities");
      expect_close(out.entropy, ent, "entropy");
      const at::Tensor grad = hp::vocab_parallel_logprobs_backward(g_lp, g_h, x, 1, target, saved, comm, kVocab, o);
      EXPECT_TRUE(grad.isfinite().all().item<bool>()) << grad;
      expect_close(grad, piece(ref_grad, rank, 2), "gradient");
    }
  });
}

// Below float64: at least as accurate as PyTorch's own computation in that dtype (logits / T,
// log_softmax, gather, -(p * log p).sum()), against float64, for values and gradients.
TEST(VocabLogprobs, SixteenBitLogitsAreAtLeastAsAccurateAsPyTorchInThatDtype) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = hp::init_device_mesh("cpu", {2});
    const hp::Communicator* comm = &mesh.comm(0);
    const int64_t vocab = 3001;
    for (at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
      const at::Tensor full = (random_tensor({64, vocab}, 51) * 4).to(dtype);
      const at::Tensor target = sampled({64}, 52, vocab);
      const at::Tensor g_lp = random_tensor({64}, 53), g_h = random_tensor({64}, 54) * 0.1;
      const Reference ref = reference(full.to(at::kDouble), target, 0.6, g_lp, g_h);
      // PyTorch in the dtype itself.
      const at::Tensor xt = full.detach().requires_grad_();
      const at::Tensor lsm = at::log_softmax(xt / 0.6, -1);
      const at::Tensor lp = lsm.gather(1, target.unsqueeze(1)).squeeze(1);
      const at::Tensor h = -(lsm.exp() * lsm).sum(-1);
      (lp * g_lp.to(dtype) + h * g_h.to(dtype)).sum().backward();
      hp::LogprobsOptions o;
      o.temperature = 0.6;
      o.return_entropy = true;
      const at::Tensor x = piece(full, rank, 2).contiguous();
      hp::LogprobsSaved saved;
      const hp::Logprobs out = hp::vocab_parallel_logprobs_forward(x, 1, target, comm, vocab, o, &saved);
      const at::Tensor grad =
          hp::vocab_parallel_logprobs_backward(g_lp.to(dtype), g_h.to(dtype), x, 1, target, saved, comm, vocab, o);
      SCOPED_TRACE(c10::toString(dtype));
      // 16-bit: no worse than PyTorch's error (a rounding of the result at least). float32: both
      // are at the ulp level, where which is ahead varies with the build (GCC's or clang's
      // contractions): within harness/rounding_bound.h's 1.5x of PyTorch's.
      const double slack = dtype == at::kFloat ? hyper_parallel::testing::kRoundingMultiple : 1.0;
      EXPECT_LE(relative_error(out.logprobs, ref.logprobs), slack * relative_error(lp, ref.logprobs));
      EXPECT_LE(relative_error(out.entropy, ref.entropy), slack * relative_error(h, ref.entropy));
      EXPECT_LE(relative_error(grad, piece(ref.grad, rank, 2)),
                slack * relative_error(piece(xt.grad(), rank, 2), piece(ref.grad, rank, 2)));
    }
  });
}

TEST(VocabLogprobs, BadInputIsTheSameNamedErrorOnEveryRank) {
  run_ranks(3, [](int64_t rank) {
    auto mesh = hp::init_device_mesh("cpu", {3});
    const hp::Communicator* comm = &mesh.comm(0);
    const at::Tensor full = random_tensor({4, kVocab}, 61);
    const at::Tensor x = piece(full, rank, 3).contiguous();
    const at::Tensor target = sampled({4}, 62, kVocab);
    auto message = [&](const hp::LogprobsOptions& o, const at::Tensor& t) -> std::string {
      try {
        hp::vocab_parallel_logprobs_forward(x, 1, t, comm, kVocab, o, nullptr);
      } catch (const std::exception& e) {
        return e.what();
      }
      return "<no error>";
    };
    // A temperature that differs between ranks: named, on every rank.
    hp::LogprobsOptions differs;
    differs.temperature = rank == 1 ? 0.5 : 1.0;
    EXPECT_NE(message(differs, target).find("disagree on the temperature (rank(s) 0, 2: 1; rank(s) 1: 0.5)"),
              std::string::npos)
        << message(differs, target);
    // One rank's bad temperature, and one rank's target out of range: the same error everywhere.
    hp::LogprobsOptions zero;
    zero.temperature = 0.0;
    EXPECT_NE(message(zero, target).find("temperature must be a finite number > 0, got 0"), std::string::npos);
    at::Tensor wrong = target.clone();
    if (rank == 2) wrong[0] = kVocab;
    EXPECT_NE(message({}, wrong).find("out of bounds"), std::string::npos) << message({}, wrong);
    EXPECT_NE(message({}, full.softmax(1)).find("expected the sampled tokens as class indices"), std::string::npos);
    // Backward asked for an entropy gradient that forward did not compute: refused, not dropped.
    hp::LogprobsSaved saved;
    hp::vocab_parallel_logprobs_forward(x, 1, target, comm, kVocab, {}, &saved);
    try {
      hp::vocab_parallel_logprobs_backward(at::ones({4}, at::kDouble), at::ones({4}, at::kDouble), x, 1, target, saved,
                                           comm, kVocab, {});
      ADD_FAILURE() << "no error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("an entropy gradient for a forward that did not compute the entropy"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace vocab_logprobs_test
