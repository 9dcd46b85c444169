// bfloat16 training with float32 master weights: TP 2 follows TP 1,
// both stay within bfloat16 tolerance of the float32 run, a resume restores the float32
// masters (not the rounded weights), and the masters keep updates smaller than a
// bfloat16 ulp that bfloat16 weights would round away.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <iostream>

#include "compat/file_system.h"
#include "harness/rank_harness.h"
#include "harness/train_steps.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel_train/config/job_config.h"
#include "train/optim/master_weights.h"
#include "hyper_parallel_train/trainer.h"

namespace bf16_training_test {

using namespace hyper_parallel;
using namespace hyper_parallel::train;
using hyper_parallel::testing::train_steps;

namespace {

JobConfig bf16_job(const std::string& name, int64_t dp, int64_t tp, const std::string& dtype) {
  JobConfig c;
  c.dump_folder = compat::join_path(compat::temp_directory(), "hp_bf16_" + name + "_" + std::to_string(::getpid()));
  compat::remove_all(c.dump_folder);
  c.model.dim = 32;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.vocab_size = 515;
  c.model.multiple_of = 16;
  c.model.max_seq_len = 32;
  c.training.batch_size = 4;
  c.training.seq_len = 16;
  c.training.steps = 20;
  c.lr_scheduler.warmup_steps = 3;
  c.training.lr = 3e-3;
  c.training.dtype = dtype;
  c.parallelism.tensor_parallel_degree = tp;
  c.parallelism.data_parallel_degree = dp;
  c.validation.enable = false;
  c.checkpoint.enable = false;
  c.metrics.enable_plot = false;
  return c;
}

std::vector<StepResult> run(const JobConfig& job) { return train_steps(job, 1, job.training.steps); }

// Largest relative difference of loss and of gradient norm over the steps.
std::pair<double, double> worst(const std::vector<StepResult>& a, const std::vector<StepResult>& b) {
  double loss = 0, grad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    loss = std::max(loss, std::abs(a[i].loss / b[i].loss - 1));
    grad = std::max(grad, std::abs(a[i].grad_norm / b[i].grad_norm - 1));
  }
  return {loss, grad};
}

}  // namespace

// 20 steps of bfloat16 at TP 2 (and dp 2 x tp 2, with and without 2 micro-batches) against bfloat16 at TP 1, and
// against float32 at TP 1. The logits are widened for the loss (TorchTitan's choice), so the losses agree to about 1e-4
// (measured 0.7-1.6e-4); the gradient norms, computed from bfloat16 gradients (8 significant bits), to about 1e-2.
// Bounds: 2e-3 and 5e-2.
TEST(Bf16Training, Tp2FollowsTp1AndBothStayNearFloat32) {
  const auto fp32 = run(bf16_job("fp32", 1, 1, "float32"));
  const auto tp1 = run(bf16_job("tp1", 1, 1, "bfloat16"));
  const auto tp2 = run(bf16_job("tp2", 1, 2, "bfloat16"));
  const auto dp2tp2 = run(bf16_job("dp2tp2", 2, 2, "bfloat16"));
  JobConfig accumulated = bf16_job("dp2tp2_accum", 2, 2, "bfloat16");
  accumulated.training.grad_accum_steps = 2;
  const auto dp2tp2_accum = run(accumulated);
  ASSERT_EQ(tp1.size(), 20u);
  EXPECT_LT(tp1.back().loss, tp1.front().loss - 0.5) << "the loss falls in bfloat16";
  const auto [tp2_loss, tp2_grad] = worst(tp2, tp1);
  const auto [dp_loss, dp_grad] = worst(dp2tp2, tp1);
  const auto [accum_loss, accum_grad] = worst(dp2tp2_accum, tp1);
  const auto [f_loss, f_grad] = worst(tp2, fp32);
  const auto [f1_loss, f1_grad] = worst(tp1, fp32);
  std::cout << "bf16 TP 2 vs bf16 TP 1: loss " << tp2_loss << ", grad norm " << tp2_grad << "\n"
            << "bf16 dp 2 x TP 2 vs bf16 TP 1: loss " << dp_loss << ", grad norm " << dp_grad << "\n"
            << "bf16 dp 2 x TP 2, 2 micro-batches vs bf16 TP 1: loss " << accum_loss << ", grad norm " << accum_grad
            << "\n"
            << "bf16 TP 2 vs fp32 TP 1: loss " << f_loss << ", grad norm " << f_grad << "\n"
            << "bf16 TP 1 vs fp32 TP 1: loss " << f1_loss << ", grad norm " << f1_grad << std::endl;
  EXPECT_LT(tp2_loss, 2e-3);
  EXPECT_LT(dp_loss, 2e-3);
  EXPECT_LT(accum_loss, 2e-3);
  EXPECT_LT(f_loss, 2e-3);
  EXPECT_LT(f1_loss, 2e-3);
  EXPECT_LT(tp2_grad, 5e-2);
  EXPECT_LT(dp_grad, 5e-2);
  EXPECT_LT(accum_grad, 5e-2);
  EXPECT_LT(f_grad, 5e-2);
}

// --training.fused_linear_loss in bfloat16 sums the token losses and scales the backward in
// float32, as the unfused path (which widens the logits) does: summed in bfloat16, a sum of
// ~400 is rounded to a step of 2 (up to 0.25 %, measured 0.1-0.4 %) and the backward scaled
// by a rounded 1 / count. The two paths differ otherwise only in summation order: 5 steps
// at TP 1 agree to 5e-4 (a bfloat16 sum would miss that on nearly every step).
TEST(Bf16Training, FusedLinearLossSumsInFloat32AsTheUnfusedPath) {
  JobConfig unfused_job = bf16_job("unfused", 1, 1, "bfloat16");
  unfused_job.training.steps = 5;
  JobConfig fused_job = bf16_job("fused", 1, 1, "bfloat16");
  fused_job.training.steps = 5;
  fused_job.training.fused_linear_loss = true;
  const auto unfused = run(unfused_job);
  const auto fused = run(fused_job);
  ASSERT_EQ(fused.size(), 5u);
  const auto [loss, grad] = worst(fused, unfused);
  std::cout << "bf16 fused vs unfused over 5 steps: loss " << loss << ", grad norm " << grad << std::endl;
  EXPECT_LT(loss, 5e-4);
}

// A checkpoint of a bfloat16 run holds the float32 masters and their AdamW state: 10
// steps, save, resume, 10 more give exactly the 20 straight steps.
TEST(Bf16Training, ResumeRestoresTheFloat32Masters) {
  const auto full = run(bf16_job("straight", 1, 2, "bfloat16"));
  JobConfig first = bf16_job("split", 1, 2, "bfloat16");
  first.checkpoint.enable = true;
  first.checkpoint.interval = 100;
  train_steps(first, 1, 10, /*save=*/true);
  JobConfig second = first;
  second.checkpoint.resume = true;
  const auto rest = train_steps(second, 11, 20);
  ASSERT_EQ(rest.size(), 10u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i].loss, full[10 + i].loss) << "step " << 11 + i;
}

// Updates of 1e-4 to a weight of 1 (a bfloat16 ulp there is 2^-7): bfloat16 weights round
// every one away; the float32 master accumulates them and the model follows.
TEST(Bf16Training, MasterWeightsKeepUpdatesSmallerThanABf16Ulp) {
  at::Tensor w = at::ones({4}, at::kBFloat16).requires_grad_(true);
  torch::OrderedDict<std::string, at::Tensor> params;
  params.insert("w", w);
  MasterWeights master(params);
  ASSERT_EQ(master.parameters()[0].scalar_type(), at::kFloat);
  at::Tensor plain = at::ones({4}, at::kBFloat16);
  {
    at::NoGradGuard no_grad;
    for (int i = 0; i < 100; ++i) {
      master.parameters()[0].sub_(1e-4);
      plain.sub_(1e-4);
    }
  }
  master.master_to_model();
  EXPECT_EQ(plain[0].item<float>(), 1.0f) << "bfloat16 alone rounds each update away";
  EXPECT_NEAR(master.parameters()[0][0].item<float>(), 0.99f, 1e-5);
  EXPECT_NEAR(w[0].item<float>(), 0.99f, 4e-3) << "the model holds the master rounded to bfloat16";
  // Gradients move to the master as float32 and leave the model's empty.
  (w * w).sum().backward();
  master.accumulate_gradients();
  EXPECT_FALSE(w.grad().defined());
  ASSERT_TRUE(master.parameters()[0].grad().defined());
  EXPECT_EQ(master.parameters()[0].grad().scalar_type(), at::kFloat);
  EXPECT_NEAR(master.parameters()[0].grad()[0].item<float>(), 2 * w[0].item<float>(), 1e-6);
}

// Micro-batches' gradients 1 and 2^-9 (a bfloat16 ulp at 1 is 2^-7): summed in the model's
// bfloat16 .grad the second is rounded away; summed on the float32 master it is kept.
TEST(Bf16Training, MicroBatchGradientsAccumulateInFloat32) {
  const float small = std::ldexp(1.0f, -9);
  at::Tensor w = at::ones({1}, at::kBFloat16).requires_grad_(true);
  (w * 1.0).sum().backward();
  (w * small).sum().backward();
  EXPECT_EQ(w.grad().item<float>(), 1.0f) << "bfloat16 .grad alone rounds the second gradient away";
  w.mutable_grad() = at::Tensor();
  torch::OrderedDict<std::string, at::Tensor> params;
  params.insert("w", w);
  MasterWeights master(params);
  (w * 1.0).sum().backward();
  master.accumulate_gradients();
  EXPECT_FALSE(w.grad().defined());
  (w * small).sum().backward();
  master.accumulate_gradients();
  EXPECT_EQ(master.parameters()[0].grad().item<float>(), 1.0f + small);
}

}  // namespace bf16_training_test
