// NaN, +inf and -inf logits anywhere in a row (the first column, inside a CUDA thread's
// first 256, past them, the whole row) give what ATen's cross_entropy gives: the CUDA
// kernel's running log-sum-exp (running_logsumexp.h) run the way the kernel runs it (256
// threads striding the row in 16-byte packs after a scalar head, the block's tree merge,
// rows split into pieces merged in order), and the CPU kernel through
// loss_parallel at TP 1-3, loss and gradient. tests/loss/cuda_loss_parallel_test.cpp runs the same rows on a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "harness/nonfinite_rows.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"
#include "loss/kernel/running_logsumexp.h"

namespace cross_entropy_nonfinite_test {

using namespace hyper_parallel;
using hyper_parallel::testing::expect_same_values;
using hyper_parallel::testing::nonfinite_rows;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

// The CUDA forward kernel's (max, sum-exp) of one row, formed as its blocks form it: the
// row in pieces of `piece` classes (a block each), each piece a scalar head of `head`
// classes (a row that starts off the 16-byte packs), packs of kPack classes, a scalar tail;
// thread t takes elements t, t + 256, ... of head and tail and packs t, t + 256, ...; each
// block merges halves, stride 128 down to 1; then the pieces are merged in order.
template <int kPack>
std::pair<float, float> kernel_running_lse(const float* y, int64_t cols, int64_t head = 0, int64_t piece = 0) {
  constexpr int kThreads = 256;
  const float ninf = -std::numeric_limits<float>::infinity();
  if (piece <= 0) piece = std::max<int64_t>(cols, 1);
  float row_m = ninf, row_s = 0.f;
  for (int64_t begin = 0; begin < cols; begin += piece) {
    const int64_t end = std::min(cols, begin + piece);
    const int64_t head_end = std::min(end, begin + head);
    const int64_t packs_end = head_end + (end - head_end) / kPack * kPack;
    std::vector<float> m(kThreads, ninf), s(kThreads, 0.f);
    for (int t = 0; t < kThreads; ++t) {
      for (int64_t j = begin + t; j < head_end; j += kThreads) ce_kernel::running_lse_push(m[t], s[t], y[j]);
      for (int64_t j = head_end + int64_t{t} * kPack; j < packs_end; j += int64_t{kThreads} * kPack) {
        float pack[kPack];
        std::copy(y + j, y + j + kPack, pack);
        ce_kernel::running_lse_push_pack(m[t], s[t], pack);
      }
      for (int64_t j = packs_end + t; j < end; j += kThreads) ce_kernel::running_lse_push(m[t], s[t], y[j]);
    }
    for (int stride = kThreads / 2; stride > 0; stride /= 2) {
      for (int t = 0; t < stride; ++t) ce_kernel::running_lse_merge(m[t], s[t], m[t + stride], s[t + stride]);
    }
    ce_kernel::running_lse_merge(row_m, row_s, m[0], s[0]);
  }
  return {row_m, row_s};
}

// The CUDA forward kernel's label-smoothing sum of one row, relative to the row max, as
// element-wise pushes (its scalar head and tail) and its block's tree merge form it:
// {max, sum_c w_c (y_c - max)}.
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
    // Scalar pushes only (a head as long as the row); packs of 4 (float) and 8 (bf16), aligned or after a
    // head of 3; the same split into pieces of 64 classes.
    using Kernel = std::function<std::pair<float, float>(const float*)>;
    const std::vector<std::pair<std::string, Kernel>> kernels = {
        {"scalar", [&](const float* y) { return kernel_running_lse<4>(y, cols, cols); }},
        {"packs of 4", [&](const float* y) { return kernel_running_lse<4>(y, cols); }},
        {"packs of 8 after 3", [&](const float* y) { return kernel_running_lse<8>(y, cols, 3); }},
        {"pieces of 64, packs of 4 after 1", [&](const float* y) { return kernel_running_lse<4>(y, cols, 1, 64); }},
        {"pieces of 64, packs of 8", [&](const float* y) { return kernel_running_lse<8>(y, cols, 0, 64); }},
    };
    for (const auto& [name, kernel] : kernels) {
      at::Tensor got = at::empty_like(want);
      for (int64_t r = 0; r < x.size(0); ++r) {
        const auto [m, s] = kernel(x[r].const_data_ptr<float>());
        // The loss of an index target: lse - y_t.
        got[r] = m + std::log(s) - x[r][rows.target[r].item<int64_t>()].item<float>();
      }
      expect_same_values(got, want, 1e-5, rows.names, c10::str(cols, " classes, ", name));
    }
  }
}

// A pack of values gives the state that pushing them one by one gives: the same class of
// non-finite result (NaN anywhere, +inf twice, -inf adding nothing, an all -inf pack
// leaving the empty state) from every kind of state, and the same sum to rounding.
TEST(RunningLogSumExp, APackLeavesTheStateThatItsValuesPushedOneByOneLeave) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> kinds = {nan, inf, -inf};
  const std::vector<std::pair<float, float>> states = {{-inf, 0.f}, {0.5f, 1.5f}, {9.f, 2.f}, {inf, nan}, {nan, nan}};
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> value(-8.f, 8.f);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int trial = 0; trial < 4000; ++trial) {
    float pack[8];
    for (float& v : pack) {
      const int k = pick(gen);  // mostly finite; now and then NaN, +inf or -inf
      v = k < static_cast<int>(kinds.size()) && trial % 3 == 0 ? kinds[k] : value(gen);
    }
    if (trial % 7 == 0) std::fill(pack, pack + 8, -inf);
    for (auto [m0, s0] : states) {
      float m1 = m0, s1 = s0, m2 = m0, s2 = s0;
      for (float v : pack) ce_kernel::running_lse_push(m1, s1, v);
      ce_kernel::running_lse_push_pack(m2, s2, pack);
      const std::string what = c10::str("trial ", trial, " from (", m0, ", ", s0, ")");
      EXPECT_EQ(std::isnan(m1), std::isnan(m2)) << what << ": max " << m1 << " vs " << m2;
      EXPECT_EQ(std::isnan(s1), std::isnan(s2)) << what << ": sum " << s1 << " vs " << s2;
      if (!std::isnan(m1)) EXPECT_EQ(m1, m2) << what;
      if (std::isfinite(s1))
        EXPECT_NEAR(s1, s2, 1e-5f * s1) << what;
      else if (!std::isnan(s1))
        EXPECT_EQ(s1, s2) << what;
    }
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
  // 600 columns: one of the kernel's blocks per row; 5000: several, up to TP 2.
  for (int64_t cols : {600, 5000}) {
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
}

}  // namespace cross_entropy_nonfinite_test
