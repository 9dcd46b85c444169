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

}  // namespace

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
