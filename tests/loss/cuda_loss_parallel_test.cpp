// cuda_loss_parallel_test.cpp — loss_parallel, the log-probabilities and the fused linear
// cross-entropy on CUDA logits (the CUDA kernel) against the float64 CPU definition.
// Every test skips, saying why, where no GPU is present: they compile everywhere and run
// through scripts/gpu_check.sh on a GPU machine.
#include <gtest/gtest.h>

#include <cmath>
#include <torch/torch.h>

#include "harness/nonfinite_rows.h"
#include "harness/rank_harness.h"
#include "harness/rounding_bound.h"
#include "hyper_parallel/loss/fused_linear_loss.h"
#include "hyper_parallel/hyper_parallel.h"

namespace cuda_loss_parallel_test {

using namespace hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::relative_error;
using hyper_parallel::testing::run_cuda_ranks;
namespace F = torch::nn::functional;

TEST(CudaLossParallel, FusedCrossEntropyMatchesTheFullLogits) {
  HP_REQUIRE_CUDA();
  for (int64_t tp : {2, 3}) {
    for (at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
      run_cuda_ranks(tp, [&](int64_t) {
        auto mesh = init_device_mesh("cuda", {tp}, {"tp"});
        const at::Device dev = mesh.device();
        const int64_t tokens = 64, vocab = 1003;
        at::Tensor full = (random_tensor({tokens, vocab}, 5) * 3).to(dev);
        auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
        at::Tensor target = at::randint(vocab, {tokens}, gen, at::kLong);
        target.masked_fill_(at::rand({tokens}, gen, at::kDouble) < 0.3, -100);
        target = target.to(dev);
        at::Tensor weight = (at::rand({vocab}, gen, at::kDouble) + 0.5).to(dev);
        for (double smoothing : {0.0, 0.1}) {
          auto opts = F::CrossEntropyFuncOptions().label_smoothing(smoothing).weight(weight);
          at::Tensor rx = full.clone().set_requires_grad(true);
          at::Tensor ref = F::cross_entropy(rx, target, opts);
          ref.backward();
          at::Tensor x = distribute_tensor(full.to(dtype), mesh, {Shard(1)}).set_requires_grad(true);
          auto guard = loss_parallel();
          at::Tensor loss = F::cross_entropy(x, target, opts.weight(weight.to(dtype)));
          loss.backward();
          EXPECT_TRUE(to_local(loss).is_cuda());
          const double got_loss = relative_error(full_tensor(loss), ref),
                       got_grad = relative_error(full_tensor(x.grad()), rx.grad());
          if (dtype == at::kBFloat16) {
            // ATen's own bfloat16 cross-entropy on the same device and data: rounding alone
            // (harness/rounding_bound.h); ours within 2x of it (the CPU grid's figure is <= 1.3x).
            at::Tensor ax = full.to(dtype).clone().set_requires_grad(true);
            at::Tensor aten = F::cross_entropy(ax, target, opts.weight(weight.to(dtype)));
            aten.backward();
            hyper_parallel::testing::RoundingRecord record(2.0);
            EXPECT_LE(got_loss, record.bound(aten, ref, dtype, got_loss)) << "TP " << tp;
            EXPECT_LE(got_grad, record.bound(ax.grad(), rx.grad(), dtype, got_grad)) << "TP " << tp;
          } else {
            const double tol = dtype == at::kDouble ? 1e-12 : 1e-5;
            EXPECT_LE(got_loss, tol) << "TP " << tp << " " << dtype;
            EXPECT_LE(got_grad, tol) << "TP " << tp << " " << dtype;
          }
        }
      });
    }
  }
}

// vocab_parallel_logprobs on CUDA: the ATen-op statistics at a temperature with the entropy
// (the CUDA kernel has neither), and the kernel itself at T = 1 without it, against the
// float64 CPU definition, values and gradients, TP 2 and 3.
TEST(CudaLossParallel, LogprobsAndEntropyMatchTheFullLogits) {
  HP_REQUIRE_CUDA();
  for (int64_t tp : {2, 3}) {
    for (auto [t, e] : {std::pair{0.7, true}, std::pair{1.0, false}}) {
      // Named copies: a lambda may not capture a structured binding (clang before 16).
      run_cuda_ranks(tp, [&, temperature = t, entropy = e](int64_t) {
        auto mesh = init_device_mesh("cuda", {tp}, {"tp"});
        const at::Device dev = mesh.device();
        const int64_t tokens = 64, vocab = 1003;
        const at::Tensor full = random_tensor({tokens, vocab}, 7) * 3;
        auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
        at::Tensor target = at::randint(vocab, {tokens}, gen, at::kLong);
        const at::Tensor g_lp = random_tensor({tokens}, 9), g_h = random_tensor({tokens}, 10);
        at::Tensor rx = full.clone().set_requires_grad(true);
        const at::Tensor lsm = at::log_softmax(rx / temperature, -1);
        const at::Tensor ref_lp = lsm.gather(1, target.unsqueeze(1)).squeeze(1);
        const at::Tensor ref_h = -(lsm.exp() * lsm).sum(-1);
        (ref_lp * g_lp + (entropy ? ref_h * g_h : at::zeros_like(ref_h))).sum().backward();
        at::Tensor x = distribute_tensor(full.to(dev), mesh, {Shard(1)}).set_requires_grad(true);
        LogprobsOptions o;
        o.temperature = temperature;
        o.return_entropy = entropy;
        const Logprobs out = vocab_parallel_logprobs(x, target.to(dev), o);
        EXPECT_TRUE(to_local(out.logprobs).is_cuda());
        at::Tensor objective = out.logprobs * g_lp.to(dev);
        if (entropy) objective = objective + out.entropy * g_h.to(dev);
        objective.sum().backward();
        EXPECT_LE(relative_error(full_tensor(out.logprobs), ref_lp), 1e-12) << "TP " << tp;
        if (entropy) EXPECT_LE(relative_error(full_tensor(out.entropy), ref_h), 1e-12) << "TP " << tp;
        EXPECT_LE(relative_error(full_tensor(x.grad()), rx.grad()), 1e-12) << "TP " << tp;
      });
    }
  }
}

// fused_linear_cross_entropy on CUDA (cuBLAS per block + the fused CE's CUDA kernel),
// fp32 and bf16, against the float64 CPU definition: loss, d hidden, d weight, TP 2 and 3
// (uneven), blocks that divide neither the tokens nor the shards, z-loss, smoothing, cap.
TEST(CudaLossParallel, FusedLinearCrossEntropyMatchesTheFullLogits) {
  HP_REQUIRE_CUDA();
  const int64_t T = 301, D = 64, V = 1003;
  const at::Tensor hidden = random_tensor({T, D}, 21), weight = random_tensor({V, D}, 22) * 0.3;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  at::Tensor target = at::randint(V, {T}, gen, at::kLong);
  target.masked_fill_(at::rand({T}, gen, at::kDouble) < 0.2, -100);
  FusedLinearCrossEntropyOptions o;
  o.label_smoothing = 0.1;
  o.z_loss_weight = 1e-3;
  o.logit_softcap = 20;
  o.chunk_tokens = 64;
  o.vocab_block = 100;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    // The definition on the inputs rounded to dtype, in float64 on the CPU.
    at::Tensor h = hidden.to(dtype).to(at::kDouble).set_requires_grad(true);
    at::Tensor w = weight.to(dtype).to(at::kDouble).set_requires_grad(true);
    const at::Tensor y = o.logit_softcap * torch::tanh(h.mm(w.t()) / o.logit_softcap);
    const at::Tensor valid = target.ne(-100).to(at::kDouble);
    at::Tensor ref = F::cross_entropy(y, target, F::CrossEntropyFuncOptions().label_smoothing(o.label_smoothing)) +
                     o.z_loss_weight * (torch::logsumexp(y, 1).square() * valid).sum() / valid.sum();
    ref.backward();
    const double tol = dtype == at::kFloat ? 2e-5 : 2e-2;
    for (int64_t tp : {2, 3}) {
      SCOPED_TRACE(c10::str(dtype, " TP ", tp));
      run_cuda_ranks(tp, [&](int64_t) {
        auto mesh = init_device_mesh("cuda", {tp}, {"tp"});
        at::Tensor x = hidden.to(dtype).to(mesh.device()).set_requires_grad(true);
        at::Tensor wd = distribute_tensor(weight.to(dtype).to(mesh.device()), mesh, {Shard(0)}).set_requires_grad(true);
        at::Tensor loss = fused_linear_cross_entropy(x, wd, target.to(mesh.device()), o);
        EXPECT_TRUE(to_local(loss).is_cuda());
        EXPECT_LE(relative_error(to_local(loss), ref), tol);
        loss.backward();
        EXPECT_LE(relative_error(x.grad(), h.grad()), tol) << "d hidden";
        EXPECT_LE(relative_error(full_tensor(wd.grad()), w.grad()), tol) << "d weight";
      });
    }
  }
}

// The CUDA kernel on NaN / +inf / -inf rows (tests/harness/nonfinite_rows.h: the first
// column, inside a thread's first 256, past them, whole rows) gives ATen's loss and gradient,
// TP 1-3. tests/loss/cross_entropy_nonfinite_test.cpp runs the kernel's update and merge on the CPU.
TEST(CudaLossParallel, NonFiniteLogitsGiveAtensLossAndGradient) {
  HP_REQUIRE_CUDA();
  using hyper_parallel::testing::expect_same_values;
  for (int64_t cols : {300, 600}) {
    const auto rows = hyper_parallel::testing::nonfinite_rows(cols);
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      at::Tensor rx = rows.logits.to(dtype).clone().set_requires_grad(true);
      const auto none = F::CrossEntropyFuncOptions().reduction(torch::kNone);
      const at::Tensor want = F::cross_entropy(rx, rows.target, none);
      want.sum().backward();
      const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
      for (int64_t tp : {1, 2, 3}) {
        run_cuda_ranks(tp, [&](int64_t) {
          auto mesh = init_device_mesh("cuda", {tp}, {"tp"});
          at::Tensor x =
              distribute_tensor(rows.logits.to(dtype).to(mesh.device()), mesh, {Shard(1)}).set_requires_grad(true);
          auto guard = loss_parallel();
          at::Tensor loss = F::cross_entropy(x, rows.target.to(mesh.device()), none);
          to_local(loss).sum().backward();
          const std::string what = c10::str(cols, " classes, ", dtype, ", TP ", tp);
          expect_same_values(full_tensor(loss), want, tol, rows.names, "loss, " + what);
          expect_same_values(full_tensor(x.grad()), rx.grad(), tol, rows.names, "gradient, " + what);
        });
      }
    }
  }
}

// A CPU target, soft target or class weight with CUDA logits is PyTorch's device-mismatch
// error naming both devices, before any kernel runs: the CUDA context stays usable.
TEST(CudaLossParallel, CpuInputsWithCudaLogitsAreAnErrorNamingBothDevices) {
  HP_REQUIRE_CUDA();
  run_cuda_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cuda", {2}, {"tp"});
    const at::Device dev = mesh.device();
    at::Tensor x = distribute_tensor(random_tensor({4, 10}, 1).to(dev), mesh, {Shard(1)});
    const at::Tensor t = torch::tensor({1, 2, 3, 9});
    const std::string cuda_name = dev.str();
    auto guard = loss_parallel();
    auto expect_error = [&](const std::function<at::Tensor()>& fn, const std::string& what) {
      try {
        full_tensor(fn());
        ADD_FAILURE() << "a " << what << " on cpu with logits on " << cuda_name << " was accepted";
      } catch (const c10::Error& e) {
        const std::string m = e.what_without_backtrace();
        EXPECT_NE(m.find("the " + what + " is on cpu and the logits on " + cuda_name), std::string::npos) << m;
      }
    };
    expect_error([&] { return F::cross_entropy(x, t); }, "target");
    expect_error([&] { return F::cross_entropy(x, torch::full({4, 10}, 0.1, torch::kDouble)); }, "probability target");
    expect_error(
        [&] {
          return F::cross_entropy(x, t.to(dev), F::CrossEntropyFuncOptions().weight(torch::ones({10}, torch::kDouble)));
        },
        "class weight");
    // The context is intact: the same loss with the target moved runs and agrees with ATen.
    const at::Tensor want = F::cross_entropy(random_tensor({4, 10}, 1), t);
    EXPECT_NEAR(full_tensor(F::cross_entropy(x, t.to(dev))).cpu().item<double>(), want.item<double>(), 1e-12);
  });
}

}  // namespace cuda_loss_parallel_test
