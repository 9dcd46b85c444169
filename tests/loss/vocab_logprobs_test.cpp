// hyper_parallel/loss/vocab_logprobs.h: per-token log-probabilities and entropy at a temperature,
// on local pieces, on class-sharded DTensors and fused with the head, against one process's
// ATen in float64 (values and gradients for random upstream gradients on both outputs),
// TP 1-4 (13 classes: uneven pieces), and against the cross-entropy bit for bit at T = 1.
#include "hyper_parallel/loss/vocab_logprobs.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "harness/rank_harness.h"
#include "harness/rounding_bound.h"
#include "hyper_parallel/core/collective_stats.h"
#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/loss/vocab_parallel.h"
#include "loss/math/fused_cross_entropy.h"

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

namespace {

// Logits where a temperature matters: odd rows have their classes within a few T of one
// another at an offset of up to ~30 (x / T is then large, and its own rounding is no longer
// small against the differences that decide the softmax), even rows are spread over +-8
// (one-hot at small T, near uniform at large T).
at::Tensor temperature_logits(int64_t rows, int64_t vocab, double temperature, uint64_t seed) {
  const at::Tensor near =
      random_tensor({rows, 1}, seed) * 10 + random_tensor({rows, vocab}, seed + 1) * (3 * temperature);
  const at::Tensor wide = random_tensor({rows, vocab}, seed + 2) * 4;
  return at::where(at::arange(rows).remainder(2).eq(1).unsqueeze(1), near, wide);
}

// max |got - want| / max |want|: the error against the result's own scale (an entropy
// gradient near a one-hot row is small everywhere, and so must its error be).
double scaled_error(const at::Tensor& got, const at::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (got.to(at::kDouble) - want).abs().max().item<double>() / std::max(scale, 1e-300);
}

// What is compared for one call: both values and the gradient of each output alone.
struct TemperatureResults {
  at::Tensor logprobs, entropy, grad_of_logprobs, grad_of_entropy;
};

// PyTorch in `dtype` on the whole logits: log_softmax(x / T), gathered; -(p * log p).sum().
TemperatureResults pytorch_in_dtype(const at::Tensor& full, const at::Tensor& target, double temperature,
                                    const at::Tensor& g_lp, const at::Tensor& g_h) {
  TemperatureResults r;
  for (int which = 0; which < 2; ++which) {
    const at::Tensor x = full.detach().requires_grad_();
    const at::Tensor lsm = at::log_softmax(x / temperature, -1);
    const at::Tensor lp = lsm.gather(1, target.unsqueeze(1)).squeeze(1);
    const at::Tensor h = -(lsm.exp() * lsm).sum(-1);
    ((which == 0 ? lp * g_lp.to(full.scalar_type()) : h * g_h.to(full.scalar_type())).sum()).backward();
    r.logprobs = lp.detach();
    r.entropy = h.detach();
    (which == 0 ? r.grad_of_logprobs : r.grad_of_entropy) = x.grad();
  }
  return r;
}

// Float64 against float64 to rounding; float32 within 1e-5 of the result's scale at every
// temperature (the rounding of x / T is not amplified by 1 / T); 16-bit no worse than PyTorch
// in that dtype (up to a rounding of the result, 2 ulps), and within 4 ulps of the result.
void expect_temperature_accuracy(const TemperatureResults& ours, const TemperatureResults& truth,
                                 const TemperatureResults* pytorch, at::ScalarType dtype, const std::string& what) {
  const double ulp = dtype == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  auto check = [&](const at::Tensor& got, const at::Tensor& want, const at::Tensor* aten, const char* name) {
    const double err = scaled_error(got, want);
    if (dtype == at::kDouble) {
      EXPECT_LE(err, 1e-12) << what << " " << name;
    } else if (dtype == at::kFloat) {
      EXPECT_LE(err, 1e-5) << what << " " << name;
    } else {
      EXPECT_LE(err, 4 * ulp) << what << " " << name;
      if (aten) EXPECT_LE(err, std::max(scaled_error(*aten, want), 2 * ulp)) << what << " " << name << " vs PyTorch";
    }
  };
  check(ours.logprobs, truth.logprobs, pytorch ? &pytorch->logprobs : nullptr, "log-probabilities");
  check(ours.entropy, truth.entropy, pytorch ? &pytorch->entropy : nullptr, "entropy");
  check(ours.grad_of_logprobs, truth.grad_of_logprobs, pytorch ? &pytorch->grad_of_logprobs : nullptr,
        "gradient of the log-probabilities");
  check(ours.grad_of_entropy, truth.grad_of_entropy, pytorch ? &pytorch->grad_of_entropy : nullptr,
        "gradient of the entropy");
}

const std::vector<double> kTemperatures = {1e-3, 1e-2, 0.1, 1.0, 10.0, 1e3};

}  // namespace

// The issue this guards: the gradients' float32 error grew as 1 / T (2.4e-3 at T = 0.01, 0.62
// at 1e-3, where the entropy's true gradient is below 6e-4), because y = x / T was rounded
// at the scale of x / T and its differences then taken. Now every difference is taken before
// it is scaled. TP 1-3 (3: uneven pieces; 5003 classes: several kernel blocks per row), the
// CPU kernel and the ATen-op path other devices take.
TEST(VocabLogprobs, EveryTemperatureFrom1em3To1e3KeepsItsAccuracyInEveryDtype) {
  const int64_t vocab = 5003, rows = 12;
  for (int64_t world : {1, 2, 3}) {
    run_ranks(world, [world](int64_t rank) {
      auto mesh = hp::init_device_mesh("cpu", {world});
      const hp::Communicator* comm = &mesh.comm(0);
      const at::Tensor target = sampled({rows}, 91, vocab);
      const at::Tensor g_lp = random_tensor({rows}, 92), g_h = random_tensor({rows}, 93);
      for (double temperature : kTemperatures) {
        for (at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}) {
          const at::Tensor full = temperature_logits(rows, vocab, temperature, 94).to(dtype);
          const Reference lp_ref = reference(full, target, temperature, g_lp, at::zeros_like(g_h));
          const Reference h_ref = reference(full, target, temperature, at::zeros_like(g_lp), g_h);
          const TemperatureResults truth{lp_ref.logprobs, lp_ref.entropy, piece(lp_ref.grad, rank, world),
                                         piece(h_ref.grad, rank, world)};
          TemperatureResults aten = pytorch_in_dtype(full, target, temperature, g_lp, g_h);
          aten.grad_of_logprobs = piece(aten.grad_of_logprobs, rank, world);
          aten.grad_of_entropy = piece(aten.grad_of_entropy, rank, world);
          const at::Tensor x = piece(full, rank, world).contiguous();
          hp::LogprobsOptions o;
          o.temperature = temperature;
          o.return_entropy = true;
          for (bool aten_path : {false, true}) {
            std::optional<hp::AtenStatisticsForTesting> use_aten;
            if (aten_path) use_aten.emplace();
            hp::LogprobsSaved saved;
            const hp::Logprobs out = hp::vocab_parallel_logprobs_forward(x, 1, target, comm, vocab, o, &saved);
            const TemperatureResults ours{
                out.logprobs, out.entropy,
                hp::vocab_parallel_logprobs_backward(g_lp.to(dtype), at::Tensor(), x, 1, target, saved, comm, vocab, o),
                hp::vocab_parallel_logprobs_backward(at::Tensor(), g_h.to(dtype), x, 1, target, saved, comm, vocab, o)};
            std::ostringstream what;
            what << "TP " << world << " rank " << rank << " T " << temperature << " " << dtype
                 << (aten_path ? " ATen-op path" : " CPU kernel");
            expect_temperature_accuracy(ours, truth, &aten, dtype, what.str());
          }
        }
      }
    });
  }
}

// The same through the fused head, whose blocks (of tokens and of classes) merge their
// statistics before the ranks combine them. Hidden and weight are chosen so that the logits
// are exact in float32 (in 16 bits: a coarser grid, exact there too): the comparison is then
// of the log-probabilities' own arithmetic, not of the matmul's rounding. Hidden's gradient
// sum_c g_c w_c cancels (every class has the same offset weight), so its error is measured
// against max (|g| |W|), the scale a matmul's rounding is relative to, not its own.
TEST(VocabLogprobs, FusedWithTheHeadEveryTemperatureKeepsItsAccuracy) {
  const int64_t tokens = 16, dim = 4, vocab = 37;
  for (int64_t world : {1, 2, 3}) {
    run_ranks(world, [world](int64_t rank) {
      auto mesh = hp::init_device_mesh("cpu", {world});
      const hp::Communicator* comm = &mesh.comm(0);
      const at::Tensor target = sampled({tokens}, 81, vocab);
      const at::Tensor g_lp = random_tensor({tokens}, 82), g_h = random_tensor({tokens}, 83);
      for (double temperature : kTemperatures) {
        for (at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}) {
          const bool sixteen_bits = dtype == at::kBFloat16 || dtype == at::kHalf;
          // Logits 20 + h_1 w_1 (w_1 multiples of 1/16: a wide spread, 0 on odd tokens) + fine
          // parts in multiples of 2^-13 (near ties at T = 1e-3): exact in float32. 16 bits:
          // multiples of 1/4 up to 16, exact there.
          at::Tensor hidden = (random_tensor({tokens, dim}, 84) * 2).round() / 2;
          at::Tensor weight = (random_tensor({vocab, dim}, 85) * 32).round() * std::ldexp(1.0, -12);
          hidden.select(1, 0).fill_(1);
          hidden.select(1, 1).mul_(at::arange(tokens).remainder(2).eq(0));
          weight.select(1, 0).fill_(20);
          weight.select(1, 1).copy_((random_tensor({vocab}, 86) * 32).round() / 16);
          if (sixteen_bits) {
            hidden = (random_tensor({tokens, dim}, 87) * 2).round().clamp(-2, 2) / 2;
            weight = (random_tensor({vocab, dim}, 88) * 2).round().clamp(-4, 4) / 2;
          }
          hidden = hidden.to(dtype);
          weight = weight.to(dtype);
          // The truth in float64 through the matmul, for each output alone, and the scale of
          // hidden's gradient; PyTorch in the dtype itself, for 16 bits.
          TemperatureResults truth, aten;
          at::Tensor scale[2];
          for (int which = 0; which < 2; ++which) {
            for (bool in_dtype : {false, true}) {
              if (in_dtype && !sixteen_bits) continue;
              const at::ScalarType t = in_dtype ? dtype : at::kDouble;
              const at::Tensor h = hidden.to(t).detach().clone().requires_grad_(), w = weight.to(t);
              const at::Tensor logits = at::mm(h, w.t());
              logits.retain_grad();
              const at::Tensor lsm = at::log_softmax(logits / temperature, -1);
              const at::Tensor lp = lsm.gather(1, target.unsqueeze(1)).squeeze(1);
              const at::Tensor ent = -(lsm.exp() * lsm).sum(-1);
              (which == 0 ? lp * g_lp.to(t) : ent * g_h.to(t)).sum().backward();
              TemperatureResults& r = in_dtype ? aten : truth;
              r.logprobs = lp.detach();
              r.entropy = ent.detach();
              (which == 0 ? r.grad_of_logprobs : r.grad_of_entropy) = h.grad();
              if (!in_dtype) scale[which] = at::mm(logits.grad().abs(), w.abs()).max();
            }
          }
          hp::LogprobsOptions o;
          o.temperature = temperature;
          o.return_entropy = true;
          o.chunk_tokens = 5;  // token chunks and class blocks that divide neither: the blocks' merge
          o.vocab_block = 4;
          const at::Tensor local_w = piece(weight, rank, world, 0).contiguous();
          hp::LogprobsSaved saved;
          const hp::Logprobs out =
              hp::vocab_parallel_linear_logprobs_forward(hidden, local_w, target, comm, vocab, o, &saved);
          auto hidden_grad = [&](const at::Tensor& gl, const at::Tensor& gh) {
            return hp::vocab_parallel_linear_logprobs_backward(gl, gh, hidden, local_w, target, saved, comm, vocab, o,
                                                               true, false)[0];
          };
          const TemperatureResults ours{out.logprobs, out.entropy, hidden_grad(g_lp.to(dtype), at::Tensor()),
                                        hidden_grad(at::Tensor(), g_h.to(dtype))};
          std::ostringstream what;
          what << "fused head, TP " << world << " rank " << rank << " T " << temperature << " " << dtype;
          const double tol = dtype == at::kDouble ? 1e-12 : 1e-5;
          auto grad_error = [&](const at::Tensor& got, const at::Tensor& want, int which) {
            return (got.to(at::kDouble) - want).abs().max().item<double>() / scale[which].item<double>();
          };
          if (!sixteen_bits) {
            EXPECT_LE(scaled_error(ours.logprobs, truth.logprobs), tol) << what.str() << " log-probabilities";
            EXPECT_LE(scaled_error(ours.entropy, truth.entropy), tol) << what.str() << " entropy";
            EXPECT_LE(grad_error(ours.grad_of_logprobs, truth.grad_of_logprobs, 0), tol)
                << what.str() << " hidden's gradient of the log-probabilities";
            EXPECT_LE(grad_error(ours.grad_of_entropy, truth.grad_of_entropy, 1), tol)
                << what.str() << " hidden's gradient of the entropy";
          } else {
            // No worse than PyTorch in the dtype, up to a rounding of the result (2 ulps).
            const double ulp = dtype == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
            EXPECT_LE(scaled_error(ours.logprobs, truth.logprobs),
                      std::max(scaled_error(aten.logprobs, truth.logprobs), 2 * ulp))
                << what.str() << " log-probabilities";
            EXPECT_LE(scaled_error(ours.entropy, truth.entropy),
                      std::max(scaled_error(aten.entropy, truth.entropy), 2 * ulp))
                << what.str() << " entropy";
            EXPECT_LE(grad_error(ours.grad_of_logprobs, truth.grad_of_logprobs, 0),
                      std::max(grad_error(aten.grad_of_logprobs, truth.grad_of_logprobs, 0), 2 * ulp))
                << what.str() << " hidden's gradient of the log-probabilities";
            EXPECT_LE(grad_error(ours.grad_of_entropy, truth.grad_of_entropy, 1),
                      std::max(grad_error(aten.grad_of_entropy, truth.grad_of_entropy, 1), 2 * ulp))
                << what.str() << " hidden's gradient of the entropy";
          }
        }
      }
    });
  }
}

// At T = 1e-200 in float64 the truth is finite (one-hot rows: gradients of 0 and +-1e200),
// and so is every result; below what float32 can scale by (1 / T overflows it), 16- and 32-bit
// logits are refused by name, the same on every rank.
TEST(VocabLogprobs, TinyTemperaturesAreFiniteInFloat64AndRefusedWhereFloatCannotScale) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = hp::init_device_mesh("cpu", {2});
    const hp::Communicator* comm = &mesh.comm(0);
    const at::Tensor full = random_tensor({8, kVocab}, 95) * 4;
    const at::Tensor target = sampled({8}, 96, kVocab);
    const at::Tensor g_lp = random_tensor({8}, 97), g_h = random_tensor({8}, 98);
    hp::LogprobsOptions o;
    o.temperature = 1e-200;
    o.return_entropy = true;
    const at::Tensor x = piece(full, rank, 2).contiguous();
    for (bool aten_path : {false, true}) {
      SCOPED_TRACE(aten_path ? "ATen-op path" : "CPU kernel");
      std::optional<hp::AtenStatisticsForTesting> use_aten;
      if (aten_path) use_aten.emplace();
      hp::LogprobsSaved saved;
      const hp::Logprobs out = hp::vocab_parallel_logprobs_forward(x, 1, target, comm, kVocab, o, &saved);
      const at::Tensor grad = hp::vocab_parallel_logprobs_backward(g_lp, g_h, x, 1, target, saved, comm, kVocab, o);
      const Reference ref = reference(full, target, o.temperature, g_lp, g_h);
      ASSERT_TRUE(ref.grad.isfinite().all().item<bool>());
      EXPECT_TRUE(grad.isfinite().all().item<bool>()) << grad;
      expect_close(out.logprobs, ref.logprobs, "log-probabilities");
      expect_close(out.entropy, ref.entropy, "entropy");
      EXPECT_LE(scaled_error(grad, piece(ref.grad, rank, 2)), 1e-12) << "gradient";
    }
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      try {
        hp::vocab_parallel_logprobs_forward(x.to(dtype), 1, target, comm, kVocab, o, nullptr);
        ADD_FAILURE() << "no error for " << dtype;
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("temperature 1e-200 is too small for "), std::string::npos) << e.what();
      }
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
