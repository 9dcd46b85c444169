// NaN, +inf and -inf logits anywhere in a row (the first column, inside a CUDA thread's
// first 256, past them, the whole row) give what ATen's cross_entropy gives: the CUDA
// kernel's running log-sum-exp (running_logsumexp.h) run the way the kernel runs it (256
// threads striding the row, then the block's tree merge), and the CPU kernel through
// loss_parallel at TP 1-3, loss and gradient. tests/cuda_test.cpp runs the same rows on a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "harness/nonfinite_rows.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"
#include "loss/running_logsumexp.h"

using namespace hyper_parallel;
using hyper_parallel::testing::expect_same_values;
using hyper_parallel::testing::nonfinite_rows;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

// The CUDA forward kernel's (max, sum-exp) of one row: thread t pushes columns t, t + 256,
// ...; then the block merges halves, stride 128 down to 1, as block_reduce does.
std::pair<float, float> kernel_running_lse(const float* y, int64_t cols) {
  constexpr int kThreads = 256;
  std::vector<float> m(kThreads, -std::numeric_limits<float>::infinity()), s(kThreads, 0.f);
  for (int t = 0; t < kThreads; ++t) {
    for (int64_t j = t; j < cols; j += kThreads) ce_kernel::running_lse_push(m[t], s[t], y[j]);
  }
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    for (int t = 0; t < stride; ++t) ce_kernel::running_lse_merge(m[t], s[t], m[t + stride], s[t + stride]);
  }
  return {m[0], s[0]};
}

// The CUDA forward kernel's label-smoothing sum of one row, relative to the row max, as its
// threads and block_reduce form it: {max, sum_c w_c (y_c - max)}.
std::pair<float, float> kernel_relative_sum(const float* y, const float* w, int64_t cols) {
  constexpr int kThreads = 256;
  std::vector<float> m(kThreads, -std::numeric_limits<float>::infinity()), s(kThreads, 0.f), v(kThreads, 0.f),
      u(kThreads, 0.f);
  for (int t = 0; t < kThreads; ++t) {
    for (int64_t j = t; j < cols; j += kThreads) {
      const float before = m[t];
      ce_kernel::running_lse_push(m[t], s[t], y[j]);
      ce_kernel::relative_sum_push(v[t], u[t], before, m[t], y[j], w[j]);
    }
  }
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    for (int t = 0; t < stride; ++t) {
      float mm = m[t];
      ce_kernel::running_lse_merge(mm, s[t], m[t + stride], s[t + stride]);
      ce_kernel::relative_sum_merge(v[t], u[t], m[t], v[t + stride], u[t + stride], m[t + stride], mm);
      m[t] = mm;
    }
  }
  return {m[0], v[0]};
}

}  // namespace

// At logits near 3e4, sum_c w_c y_c in float is ~1e-3 off (about the smoothing loss itself);
// kept relative to the running max, the sum is as accurate as its small terms.
TEST(RunningLogSumExp, TheCudaKernelsSmoothingSumIsRelativeToTheMaxAndFloat32Accurate) {
  const int64_t cols = 1003;
  const at::Tensor x = (at::randn({cols}, at::kDouble) * 4 + 3e4).to(at::kFloat);
  const at::Tensor w = (at::rand({cols}, at::kDouble) + 0.5).to(at::kFloat);
  const auto [m, v] = kernel_relative_sum(x.const_data_ptr<float>(), w.const_data_ptr<float>(), cols);
  const at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble);
  EXPECT_EQ(m, x.max().item<float>());
  const double want = (wd * (xd - xd.max())).sum().item<double>();
  EXPECT_NEAR(v, want, 1e-5 * std::abs(want)) << "relative sum " << v << " vs float64 " << want;
}

TEST(RunningLogSumExp, TheCudaKernelsThreadsAndMergeGiveAtenOnNonFiniteRows) {
  for (int64_t cols : {300, 600, 1003}) {
    const auto rows = nonfinite_rows(cols);
    const at::Tensor x = rows.logits.to(at::kFloat).contiguous();
    const at::Tensor want = F::cross_entropy(x, rows.target, F::CrossEntropyFuncOptions().reduction(torch::kNone));
    at::Tensor got = at::empty_like(want);
    for (int64_t r = 0; r < x.size(0); ++r) {
      const auto [m, s] = kernel_running_lse(x[r].const_data_ptr<float>(), cols);
      // The loss of an index target: lse - y_t.
      got[r] = m + std::log(s) - x[r][rows.target[r].item<int64_t>()].item<float>();
    }
    expect_same_values(got, want, 1e-5, rows.names, c10::str(cols, " classes"));
  }
}

TEST(RunningLogSumExp, MergeKeepsANanFromEitherHalf) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), ninf = -std::numeric_limits<float>::infinity();
  for (auto [m2, s2] : std::vector<std::pair<float, float>>{{nan, nan}, {ninf, nan}, {2.f, nan}}) {
    float m = 1.f, s = 1.f;
    ce_kernel::running_lse_merge(m, s, m2, s2);
    EXPECT_TRUE(std::isnan(m + std::log(s))) << m2 << ", " << s2;
    float n = m2, t = s2;
    ce_kernel::running_lse_merge(n, t, 1.f, 1.f);
    EXPECT_TRUE(std::isnan(n + std::log(t))) << m2 << ", " << s2;
  }
}

TEST(FusedCrossEntropyKernel, NonFiniteLogitsGiveAtensLossAndGradientAtEveryDegree) {
  const int64_t cols = 600;
  const auto rows = nonfinite_rows(cols);
  for (auto dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
    at::Tensor rx = rows.logits.to(dtype).clone().set_requires_grad(true);
    const at::Tensor want = F::cross_entropy(rx, rows.target, F::CrossEntropyFuncOptions().reduction(torch::kNone));
    want.sum().backward();
    const double tol = dtype == at::kDouble ? 1e-12 : dtype == at::kFloat ? 1e-5 : 2e-2;
    for (int64_t tp : {1, 2, 3}) {
      run_ranks(tp, [&](int64_t) {
        auto mesh = init_device_mesh("cpu", {tp});
        at::Tensor x = distribute_tensor(rows.logits.to(dtype), mesh, {Shard(1)}).set_requires_grad(true);
        auto guard = loss_parallel();
        at::Tensor loss = F::cross_entropy(x, rows.target, F::CrossEntropyFuncOptions().reduction(torch::kNone));
        to_local(loss).sum().backward();
        const std::string what = c10::str(dtype, " TP ", tp);
        expect_same_values(full_tensor(loss), want, tol, rows.names, "loss, " + what);
        expect_same_values(full_tensor(x.grad()), rx.grad(), tol, rows.names, "gradient, " + what);
      });
    }
  }
}
