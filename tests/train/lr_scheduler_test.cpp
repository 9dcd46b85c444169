// TorchTitan's warm-up-stable-decay schedule (train/optim/lr_scheduler.h): its phases, its
// step convention and its edge cases, against factors worked out by hand from TorchTitan's
// formula. tests/train/lr_schedule_reference.py checks hp-train's logged lr against an
// independent Python implementation driven by PyTorch's LambdaLR.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "train/optim/lr_scheduler.h"

namespace lr_scheduler_test {

using hyper_parallel::train::LrSchedulerConfig;
using hyper_parallel::train::WarmupStableDecay;
using ::testing::HasSubstr;

LrSchedulerConfig schedule(int64_t warmup, double ratio, const std::string& type, double min_factor) {
  LrSchedulerConfig c;
  c.warmup_steps = warmup;
  c.decay_ratio = ratio;
  c.decay_type = type;
  c.min_lr_factor = min_factor;
  return c;
}

std::string error_of(const LrSchedulerConfig& c, int64_t steps) {
  try {
    WarmupStableDecay s(c, steps);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LrScheduler, WarmupCountsStepsFromOneAndReachesLrAtItsLastStep) {
  const WarmupStableDecay s(schedule(5, 1.0, "cosine", 0.1), 60);
  for (int64_t step = 1; step <= 5; ++step) EXPECT_DOUBLE_EQ(s.factor(step), step / 5.0) << step;
  EXPECT_EQ(s.warmup_steps(), 5);
  EXPECT_EQ(s.stable_steps(), 1);  // TorchTitan's virtual last step
  EXPECT_EQ(s.decay_steps(), 55);
}

// decay_ratio 1 is TorchTitan's None: one held step after warm-up, then the decay, whose last
// step stops one short of min_lr_factor.
TEST(LrScheduler, RatioOneDecaysRightAfterWarmupAndNeverReachesTheMinimum) {
  const WarmupStableDecay s(schedule(2, 1.0, "linear", 0.0), 10);
  EXPECT_DOUBLE_EQ(s.factor(1), 0.5);
  EXPECT_DOUBLE_EQ(s.factor(2), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(3), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(4), 1.0 - 1.0 / 8);  // progress (4 - 2 - 1) / 8
  EXPECT_DOUBLE_EQ(s.factor(10), 1.0 - 7.0 / 8);
  EXPECT_GT(s.factor(10), 0.0);
}

TEST(LrScheduler, WithoutWarmupTheFirstStepRunsAtLr) {
  const WarmupStableDecay s(schedule(0, 1.0, "linear", 0.0), 4);
  EXPECT_EQ(s.decay_steps(), 4);
  EXPECT_DOUBLE_EQ(s.factor(1), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(2), 0.75);
  EXPECT_DOUBLE_EQ(s.factor(4), 0.25);
}

TEST(LrScheduler, RatioZeroHoldsLrAfterWarmup) {
  const WarmupStableDecay s(schedule(3, 0.0, "cosine", 0.1), 10);
  EXPECT_EQ(s.decay_steps(), 0);
  EXPECT_DOUBLE_EQ(s.factor(3), 1.0);
  for (int64_t step = 4; step <= 10; ++step) EXPECT_DOUBLE_EQ(s.factor(step), 1.0) << step;
}

// Warm-up 2, then 5 held steps (3-7), then 4 cosine decay steps from step 8.
TEST(LrScheduler, StablePhaseThenEachDecayCurve) {
  const double m = 0.1;
  const double p1 = 1.0 / 4, p3 = 3.0 / 4;  // steps 8 and 10
  for (const auto& [type, curve] : std::vector<std::pair<std::string, double (*)(double)>>{
           {"linear", [](double p) { return 1 - p; }},
           {"sqrt", [](double p) { return 1 - std::sqrt(p); }},
           {"cosine", [](double p) { return 0.5 * (1 + std::cos(M_PI * p)); }}}) {
    const WarmupStableDecay s(schedule(2, 0.4, type, m), 10);
    EXPECT_EQ(s.stable_steps(), 5) << type;
    EXPECT_EQ(s.decay_steps(), 4) << type;
    for (int64_t step = 3; step <= 7; ++step) EXPECT_DOUBLE_EQ(s.factor(step), 1.0) << type << " step " << step;
    EXPECT_DOUBLE_EQ(s.factor(8), m + (1 - m) * curve(p1)) << type;
    EXPECT_DOUBLE_EQ(s.factor(10), m + (1 - m) * curve(p3)) << type;
  }
}

TEST(LrScheduler, MinLrFactorScalesTheDecayRange) {
  const WarmupStableDecay half(schedule(0, 1.0, "linear", 0.5), 4);
  EXPECT_DOUBLE_EQ(half.factor(3), 0.5 + 0.5 * 0.5);
  const WarmupStableDecay flat(schedule(1, 1.0, "cosine", 1.0), 6);
  for (int64_t step = 1; step <= 6; ++step) EXPECT_DOUBLE_EQ(flat.factor(step), 1.0) << step;
}

// round(T x decay_ratio) as Python rounds: halves to the even integer.
TEST(LrScheduler, DecayStepsRoundHalvesToEvenAsPython) {
  EXPECT_EQ(WarmupStableDecay(schedule(0, 0.25, "linear", 0), 10).decay_steps(), 2);  // 2.5
  EXPECT_EQ(WarmupStableDecay(schedule(0, 0.25, "linear", 0), 6).decay_steps(), 2);   // 1.5
  EXPECT_EQ(WarmupStableDecay(schedule(0, 0.25, "linear", 0), 14).decay_steps(), 4);  // 3.5
  // Cut to the steps after warm-up.
  EXPECT_EQ(WarmupStableDecay(schedule(4, 0.8, "linear", 0), 10).decay_steps(), 6);
}

TEST(LrScheduler, WarmupLongerThanTheRunIsCutToIt) {
  const WarmupStableDecay s(schedule(20, 1.0, "cosine", 0.1), 10);
  EXPECT_TRUE(s.warmup_cut());
  EXPECT_EQ(s.warmup_steps(), 10);
  EXPECT_DOUBLE_EQ(s.factor(1), 0.1);
  EXPECT_DOUBLE_EQ(s.factor(10), 1.0);
  EXPECT_THAT(s.describe(1e-3), HasSubstr("lr_scheduler.warmup_steps = 20 cut to training.steps"));
}

TEST(LrScheduler, DescribeNamesEachPhasesSteps) {
  EXPECT_EQ(WarmupStableDecay(schedule(5, 1.0, "cosine", 0.1), 60).describe(0.003),
            "learning rate 0.003: warm-up over steps 1-5, held over step 6, cosine decay over steps 7-60 towards "
            "0.1 x lr");
  EXPECT_EQ(WarmupStableDecay(schedule(0, 0.0, "linear", 0), 3).describe(1), "learning rate 1: held over steps 1-3");
}

TEST(LrScheduler, BadKeysAreErrorsNamingThem) {
  EXPECT_THAT(error_of(schedule(1, 1.0, "exponential", 0), 10),
              HasSubstr("lr_scheduler.decay_type = \"exponential\" is not one of linear, sqrt, cosine"));
  EXPECT_THAT(error_of(schedule(1, 1.5, "linear", 0), 10),
              HasSubstr("lr_scheduler.decay_ratio = 1.5 must be in [0, 1]"));
  EXPECT_THAT(error_of(schedule(1, -0.1, "linear", 0), 10), HasSubstr("lr_scheduler.decay_ratio = -0.1"));
  EXPECT_THAT(error_of(schedule(1, 1.0, "linear", 2), 10), HasSubstr("lr_scheduler.min_lr_factor = 2 must be in"));
  EXPECT_THAT(error_of(schedule(-1, 1.0, "linear", 0), 10), HasSubstr("lr_scheduler.warmup_steps = -1 must be >= 0"));
}

}  // namespace lr_scheduler_test
