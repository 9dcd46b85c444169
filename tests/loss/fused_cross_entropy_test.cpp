// The fused cross-entropy's own options and properties: z-loss and logit soft-capping
// against a single-process float64 reference (TP 1-4, 3 = uneven shards; loss and
// gradients; every reduction, ignore_index, class weights, label smoothing, probability
// targets), the gradient written in forward (exact, autograd-safe), one all-gather in
// forward and none in backward, gradient-buffer reuse, and the CPU kernel on rows that
// exercise its block rescaling, tails and strides; the CUDA kernel the same way where a GPU is.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <vector>

#include "harness/cross_entropy_data.h"
#include "harness/cross_entropy_kernel_args.h"
#include "harness/rank_harness.h"
#include "harness/rounding_bound.h"
#include "hyper_parallel/hyper_parallel.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"
#include "loss/math/gradient_buffer.h"

namespace fused_cross_entropy_test {

using namespace hyper_parallel;
using hyper_parallel::testing::backward_args;
using hyper_parallel::testing::forward_args;
using hyper_parallel::testing::random_cross_entropy_data;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::RoundingRecord;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

struct Case {
  int64_t rows = 12, classes = 19;
  int64_t reduction = at::Reduction::Mean;
  bool weighted = false;
  bool soft = false;
  double label_smoothing = 0.0;
  double ignored_fraction = 0.0;
  double z_loss_weight = 0.0;
  double logit_softcap = 0.0;
  std::string name() const {
    return c10::str(rows, "x", classes,
                    reduction == at::Reduction::None  ? " none"
                    : reduction == at::Reduction::Sum ? " sum"
                                                      : " mean",
                    weighted ? " weighted" : "", soft ? " soft" : "", " eps=", label_smoothing,
                    " ignored=", ignored_fraction, " z=", z_loss_weight, " cap=", logit_softcap);
  }
};

using Data = hyper_parallel::testing::CrossEntropyData;

F::CrossEntropyFuncOptions ce_options(const Case& c, const at::Tensor& weight,
                                      F::CrossEntropyFuncOptions::reduction_t r) {
  auto o = F::CrossEntropyFuncOptions().reduction(r).label_smoothing(c.label_smoothing);
  if (weight.defined()) o = o.weight(weight);
  return o;
}

// The definition, in float64 on the full logits: y = cap tanh(x / cap); cross_entropy(y)
// plus z * lse(y)^2 per counted row; 'mean' divides the z-loss sum by the counted rows.
at::Tensor reference_loss(const Case& c, const at::Tensor& x, const Data& d) {
  const at::Tensor y = c.logit_softcap > 0 ? c.logit_softcap * torch::tanh(x / c.logit_softcap) : x;
  at::Tensor valid = c.soft ? torch::ones({c.rows}, x.options()) : d.target.ne(-100).to(x.scalar_type());
  at::Tensor z_rows = c.z_loss_weight * torch::logsumexp(y, 1).square() * valid;
  if (c.reduction == at::Reduction::None)
    return F::cross_entropy(y, d.target, ce_options(c, d.weight, torch::kNone)) + z_rows;
  if (c.reduction == at::Reduction::Sum)
    return F::cross_entropy(y, d.target, ce_options(c, d.weight, torch::kSum)) + z_rows.sum();
  return F::cross_entropy(y, d.target, ce_options(c, d.weight, torch::kMean)) + z_rows.sum() / valid.sum();
}

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  at::Tensor g = got.cpu().to(at::kDouble), w = want.cpu().to(at::kDouble);
  return (g - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-30);
}

// ATen's own computation in `dtype` (the definition on the logits, weights, soft targets and
// incoming gradient rounded to dtype): its distance from the float64 reference is what
// rounding alone gives, and bounds ours in bf16.
struct InDtype {
  at::Tensor loss, grad;
};

InDtype aten_in_dtype(const Case& c, const Data& d, const at::Tensor& c_loss, at::ScalarType dtype,
                      const at::Device& device) {
  Data dd = d;
  dd.target = c.soft ? d.target.to(dtype).to(device) : d.target.to(device);
  if (d.weight.defined()) dd.weight = d.weight.to(dtype).to(device);
  at::Tensor x = d.logits.to(dtype).to(device).set_requires_grad(true);
  at::Tensor loss = reference_loss(c, x, dd);
  (loss * c_loss.to(dtype).to(device)).sum().backward();
  return {loss.detach().cpu(), x.grad().cpu()};
}

// Where the grid runs: the device of the logits, and the dtypes.
struct GridDevice {
  std::string device = "cpu";
  std::vector<at::ScalarType> dtypes = {at::kDouble, at::kFloat, at::kBFloat16};
};

// Loss and gradient: float64 to rounding, float32 to 2e-5, bf16 and fp16 within a small
// multiple of ATen's own error in that dtype on the same data (harness/rounding_bound.h).
RoundingRecord& rounding_errors() {
  static RoundingRecord record;
  return record;
}
double tolerance(at::ScalarType t, const at::Tensor& aten, const at::Tensor& want, double ours) {
  return rounding_errors().tolerance(t, aten, want, ours);
}

LossParallelOptions guard_options(const Case& c, bool grad_in_forward) {
  LossParallelOptions o;
  o.z_loss_weight = c.z_loss_weight;
  o.logit_softcap = c.logit_softcap;
  o.gradient_in_forward = grad_in_forward;
  return o;
}

void check(const DeviceMesh& mesh, const Case& c, const Data& d, const at::Tensor& ref_loss, const at::Tensor& ref_grad,
           const at::Tensor& c_loss, const InDtype& aten, at::ScalarType dtype, bool grad_in_forward) {
  SCOPED_TRACE(c.name() + " " + c10::toString(dtype) + " TP " + std::to_string(mesh.size()) +
               (grad_in_forward ? " gradient_in_forward" : ""));
  const at::Device dev = mesh.device();
  at::Tensor logits = distribute_tensor(d.logits.to(dtype).to(dev), mesh, {Shard(1)}).set_requires_grad(true);
  const at::Tensor target = c.soft ? d.target.to(dtype).to(dev) : d.target.to(dev);
  const at::Tensor weight = d.weight.defined() ? d.weight.to(dtype).to(dev) : at::Tensor();
  const F::CrossEntropyFuncOptions::reduction_t r =
      c.reduction == at::Reduction::None  ? F::CrossEntropyFuncOptions::reduction_t(torch::kNone)
      : c.reduction == at::Reduction::Sum ? F::CrossEntropyFuncOptions::reduction_t(torch::kSum)
                                          : F::CrossEntropyFuncOptions::reduction_t(torch::kMean);
  auto guard = loss_parallel(guard_options(c, grad_in_forward));
  // The gradient is written in forward over non-leaf logits only (as a model's head gives).
  const at::Tensor input = grad_in_forward ? logits * 1.0 : logits;
  reset_collective_counts();
  at::Tensor loss = F::cross_entropy(input, target, ce_options(c, weight, r));
  // The call's record (fixed size: ranks that differ are named before anything sized by
  // rows), then the per-row statistics; one rank needs neither record nor agreement.
  const int64_t gathers = mesh.size() == 1 ? 1 : 2;
  EXPECT_EQ(collective_counts().all_gather, gathers);
  EXPECT_EQ(collective_counts().total(), gathers) << "the record and the statistics in forward";
  const double loss_err = rel_err(to_local(loss), ref_loss);
  EXPECT_LE(loss_err, tolerance(dtype, aten.loss, ref_loss, loss_err)) << to_local(loss) << " vs " << ref_loss;
  reset_collective_counts();
  (to_local(loss) * c_loss.to(dtype).to(dev)).sum().backward();
  EXPECT_EQ(collective_counts().total(), 0) << "no collective in backward";
  // The whole gradient (a shard of a few columns measures rounding too noisily).
  const double grad_err = rel_err(full_tensor(logits.grad()), ref_grad);
  EXPECT_LE(grad_err, tolerance(dtype, aten.grad, ref_grad, grad_err)) << "gradient";
}

void run_grid(const std::vector<Case>& cases, const std::vector<int64_t>& degrees, const GridDevice& where = {}) {
  const at::Device device(where.device);
  std::vector<Data> data;
  std::vector<at::Tensor> ref_loss, ref_grad, c_loss;
  std::vector<std::map<at::ScalarType, InDtype>> aten_16bit;
  for (size_t i = 0; i < cases.size(); ++i) {
    data.push_back(random_cross_entropy_data(cases[i], 500 + i));
    at::Tensor x = data.back().logits.clone().set_requires_grad(true);
    at::Tensor loss = reference_loss(cases[i], x, data.back());
    c_loss.push_back(random_tensor(loss.sizes(), 9000 + i));
    (loss * c_loss.back()).sum().backward();
    ref_loss.push_back(loss.detach());
    ref_grad.push_back(x.grad());
    aten_16bit.emplace_back();
    for (auto dtype : where.dtypes)
      if (c10::elementSize(dtype) == 2)
        aten_16bit.back()[dtype] = aten_in_dtype(cases[i], data.back(), c_loss.back(), dtype, device);
  }
  const auto body = [&](int64_t tp) {
    auto mesh = init_device_mesh(where.device, {tp}, {"tp"});
    for (size_t i = 0; i < cases.size(); ++i) {
      for (auto dtype : where.dtypes) {
        const InDtype aten = c10::elementSize(dtype) == 2 ? aten_16bit[i].at(dtype) : InDtype{};
        for (bool gif : {false, true})
          check(mesh, cases[i], data[i], ref_loss[i], ref_grad[i], c_loss[i], aten, dtype, gif);
      }
    }
  };
  for (int64_t tp : degrees) {
    if (device.is_cuda())
      hyper_parallel::testing::run_cuda_ranks(tp, [&](int64_t) { body(tp); });
    else
      run_ranks(tp, [&](int64_t) { body(tp); });
  }
  std::cout << "[ 16-bit   ] " << rounding_errors().summary() << std::endl;
}

std::vector<Case> option_grid() {
  std::vector<Case> cases;
  for (int64_t r : {at::Reduction::None, at::Reduction::Mean, at::Reduction::Sum}) {
    for (bool w : {false, true}) {
      for (auto [z, cap] : std::vector<std::pair<double, double>>{{0, 0}, {1e-2, 0}, {0, 5}, {0.1, 3}}) {
        Case base;
        base.reduction = r;
        base.weighted = w;
        base.z_loss_weight = z;
        base.logit_softcap = cap;
        cases.push_back(base);
        Case ign = base;
        ign.ignored_fraction = 0.3;
        cases.push_back(ign);
        Case ls = ign;
        ls.label_smoothing = 0.1;
        cases.push_back(ls);
        Case soft = base;
        soft.soft = true;
        cases.push_back(soft);
        Case soft_ls = soft;
        soft_ls.label_smoothing = 0.2;
        cases.push_back(soft_ls);
      }
    }
  }
  return cases;
}

}  // namespace

TEST(FusedCrossEntropy, ZLossAndSoftcapMatchTheFloat64DefinitionAtEveryDegree) {
  run_grid(option_grid(), {1, 2, 3, 4});
}

// The loss layer's plain form of the definition (what hp-train computes without loss
// parallel) is this file's float64 reference, which the sharded paths above are compared to.
TEST(FusedCrossEntropy, PlainCrossEntropyWithTermsIsTheFloat64Definition) {
  for (const Case& c : option_grid()) {
    if (c.weighted || c.soft) continue;  // class-index targets without class weights
    SCOPED_TRACE(c.name());
    const Data d = random_cross_entropy_data(c, 5);
    CrossEntropyDefinition definition{
        {.z_loss_weight = c.z_loss_weight, .logit_softcap = c.logit_softcap}, -100, c.reduction, c.label_smoothing};
    const at::Tensor got = cross_entropy_with_terms(d.logits, d.target, definition);
    EXPECT_LE(rel_err(got, reference_loss(c, d.logits, d)), 1e-14);
  }
}

// Rows longer than the kernel's 2048-class blocks, with the max in a later block (the
// running sum is rescaled), class counts off the vector width, an uneven TP 3.
TEST(FusedCrossEntropy, LongRowsAcrossBlocksMatchTheDefinition) {
  Case c;
  c.rows = 6;
  c.classes = 6151;
  c.ignored_fraction = 0.2;
  c.z_loss_weight = 1e-3;
  Case capped = c;
  capped.logit_softcap = 30;
  capped.label_smoothing = 0.1;
  capped.weighted = true;
  run_grid({c, capped}, {1, 3});
}

// The CUDA kernel (where a GPU is present; skips, saying why, elsewhere): the option grid
// in every dtype it takes (fp16 too) at TP 1 and 3, then rows that take both of its grids:
// few long rows, each split into pieces merged per row (50000 classes: pieces in every
// dtype up to TP 3), and many short rows of odd length (a block per row; rows that start
// off the 16-byte packs).
TEST(FusedCrossEntropy, CudaKernelMatchesTheDefinitionInEveryDtypeAndOption) {
  HP_REQUIRE_CUDA();
  const GridDevice cuda{"cuda", {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}};
  run_grid(option_grid(), {1, 3}, cuda);
  Case few;
  few.rows = 16;
  few.classes = 50000;
  few.ignored_fraction = 0.2;
  few.label_smoothing = 0.1;
  few.z_loss_weight = 1e-3;
  few.logit_softcap = 30;
  Case few_soft = few;
  few_soft.soft = true;
  few_soft.weighted = true;
  Case many;
  many.rows = 700;
  many.classes = 1003;
  many.weighted = true;
  many.ignored_fraction = 0.1;
  many.reduction = at::Reduction::None;
  run_grid({few, few_soft, many}, {1, 2, 3}, cuda);
}

TEST(FusedCrossEntropy, GradientInForwardBumpsTheVersionSoOtherSavedUsersRaise) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor logits = distribute_tensor(random_tensor({4, 10}, 1), mesh, {Shard(1)}).set_requires_grad(true);
    at::Tensor h = logits * 1.0;       // a non-leaf, as logits are in a model
    at::Tensor other = (h * h).sum();  // saves h
    LossParallelOptions o;
    o.gradient_in_forward = true;
    auto guard = loss_parallel(o);
    at::Tensor loss = F::cross_entropy(h, torch::tensor({1, 2, 3, 9}));
    loss.backward();  // ours: fine
    try {
      other.backward();
      ADD_FAILURE() << "the other user of the overwritten logits did not raise";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("modified by an inplace operation"), std::string::npos) << e.what();
    }
  });
}

TEST(FusedCrossEntropy, GradientInForwardIsScaledByTheIncomingGradient) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    const at::Tensor full = random_tensor({5, 9}, 4);
    const at::Tensor t = torch::tensor({0, 8, 3, -100, 4});
    at::Tensor ref_x = full.clone().set_requires_grad(true);
    (F::cross_entropy(ref_x, t) * 2.5).backward();
    at::Tensor x = distribute_tensor(full, mesh, {Shard(1)}).set_requires_grad(true);
    LossParallelOptions o;
    o.gradient_in_forward = true;
    auto guard = loss_parallel(o);
    (to_local(F::cross_entropy(x * 1.0, t)) * 2.5).backward();
    EXPECT_TRUE(at::allclose(full_tensor(x.grad()), ref_x.grad(), 1e-12, 1e-14));
  });
}

// A second backward through a retained graph accumulates what ATen's does, whether or not
// its incoming gradient is the first one's (the first scaled the stored gradient in place).
TEST(FusedCrossEntropy, GradientInForwardBackwardTwiceAccumulatesAsAten) {
  const at::Tensor full = random_tensor({5, 9}, 4);
  const at::Tensor t = torch::tensor({0, 8, 3, -100, 4});
  const at::Tensor c1 = random_tensor({5}, 5), c2 = random_tensor({5}, 6);
  for (bool per_row : {false, true}) {
    // loss * c1 then loss * c2 (scalars 2.5 and 2.5, then 2.5 and 0.5, for the mean)
    for (bool same : {true, false}) {
      SCOPED_TRACE(c10::str(per_row ? "none, per-row gradients" : "mean", same ? ", same" : ", different"));
      const auto opts =
          F::CrossEntropyFuncOptions().reduction(per_row ? F::CrossEntropyFuncOptions::reduction_t(torch::kNone)
                                                         : F::CrossEntropyFuncOptions::reduction_t(torch::kMean));
      const at::Tensor g1 = per_row ? c1 : torch::tensor(2.5, torch::kDouble);
      const at::Tensor g2 = same ? g1 : per_row ? c2 : torch::tensor(0.5, torch::kDouble);
      at::Tensor ref_x = full.clone().set_requires_grad(true);
      const at::Tensor ref = F::cross_entropy(ref_x, t, opts);
      (ref * g1).sum().backward({}, /*retain_graph=*/true);
      (ref * g2).sum().backward();
      run_ranks(2, [&](int64_t) {
        auto mesh = init_device_mesh("cpu", {2});
        at::Tensor x = distribute_tensor(full, mesh, {Shard(1)}).set_requires_grad(true);
        LossParallelOptions o;
        o.gradient_in_forward = true;
        auto guard = loss_parallel(o);
        const at::Tensor loss = to_local(F::cross_entropy(x * 1.0, t, opts));
        (loss * g1).sum().backward({}, /*retain_graph=*/true);
        (loss * g2).sum().backward();
        EXPECT_TRUE(at::allclose(full_tensor(x.grad()), ref_x.grad(), 1e-12, 1e-14))
            << full_tensor(x.grad())[0][0].item<double>() << " where ATen gives " << ref_x.grad()[0][0].item<double>();
      });
    }
  }
}

// Where the first incoming gradient had a zero that the second has not, the stored gradient
// cannot be recovered: a clear error, not a wrong gradient. A freed graph says so as ATen does.
TEST(FusedCrossEntropy, GradientInForwardSecondBackwardItCannotServeIsAClearError) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor x = distribute_tensor(random_tensor({3, 8}, 7), mesh, {Shard(1)}).set_requires_grad(true);
    LossParallelOptions o;
    o.gradient_in_forward = true;
    auto guard = loss_parallel(o);
    const auto none = F::CrossEntropyFuncOptions().reduction(torch::kNone);
    const at::Tensor loss = to_local(F::cross_entropy(x * 1.0, torch::tensor({1, 2, 7}), none));
    (loss * torch::tensor({1.0, 0.0, 2.0}, torch::kDouble)).sum().backward({}, /*retain_graph=*/true);
    try {
      loss.sum().backward({}, /*retain_graph=*/true);
      ADD_FAILURE() << "a second backward through a gradient scaled by zero did not raise";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be undone"), std::string::npos) << e.what();
    }
    const at::Tensor freed = to_local(F::cross_entropy(x * 1.0, torch::tensor({1, 2, 7})));
    freed.backward();
    try {
      freed.backward();
      ADD_FAILURE() << "a second backward through a freed graph did not raise";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("backward through the graph a second time"), std::string::npos) << e.what();
    }
  });
}

// Leaf logits keep their values and get a .grad of their own: the gradient is written in
// forward only over logits that are not a leaf (a leaf's values are the caller's).
TEST(FusedCrossEntropy, GradientInForwardLeavesALeafsValuesAndGradSeparate) {
  const at::Tensor full = random_tensor({4, 10}, 8);
  const at::Tensor t = torch::tensor({1, 2, 3, 9});
  at::Tensor ref_x = full.clone().set_requires_grad(true);
  F::cross_entropy(ref_x, t).backward();
  run_ranks(2, [&](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor x = distribute_tensor(full, mesh, {Shard(1)}).set_requires_grad(true);
    LossParallelOptions o;
    o.gradient_in_forward = true;
    auto guard = loss_parallel(o);
    F::cross_entropy(x, t).backward();
    EXPECT_TRUE(full_tensor(x.detach()).equal(full)) << "the leaf's values were overwritten";
    EXPECT_FALSE(to_local(x.grad()).is_alias_of(to_local(x.detach()))) << "the leaf's .grad aliases its data";
    EXPECT_TRUE(at::allclose(full_tensor(x.grad()), ref_x.grad(), 1e-12, 1e-14));
  });
}

TEST(FusedCrossEntropy, GradientBufferIsReusedOnceThePreviousOneIsFree) {
  release_gradient_buffers();
  at::Tensor a = reusable_gradient_buffer(64, 8192, at::kFloat);
  const void* p = a.data_ptr();
  at::Tensor b = reusable_gradient_buffer(64, 8192, at::kFloat);
  EXPECT_NE(b.data_ptr(), p) << "a buffer still in use is not handed out again";
  a = at::Tensor();
  b = at::Tensor();
  at::Tensor c = reusable_gradient_buffer(64, 8192, at::kFloat);
  at::Tensor d = reusable_gradient_buffer(8192, 64, at::kFloat);
  EXPECT_TRUE(c.data_ptr() != p || d.data_ptr() != p);
  c = at::Tensor();
  d = at::Tensor();
  // Once free, the same storage comes back (no fresh pages to fault in).
  at::Tensor e = reusable_gradient_buffer(64, 8192, at::kFloat);
  const void* q = e.data_ptr();
  e = at::Tensor();
  EXPECT_EQ(reusable_gradient_buffer(64, 8192, at::kFloat).data_ptr(), q);
  release_gradient_buffers();
}

TEST(FusedCrossEntropy, ZLossAndSoftcapAreRefusedOnTheDecomposedRoutes) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor x = distribute_tensor(random_tensor({4, 10}, 1), mesh, {Shard(1)});
    LossParallelOptions o;
    o.logit_softcap = 10;
    auto guard = loss_parallel(o);
    EXPECT_THROW(torch::log_softmax(x, 1), LossParallelUnsupportedError);
  });
}

// The kernel alone, on strided rows with -inf entries, an all -inf row and a row whose
// max sits in its last block, in every dtype: the statistics ATen's ops give.
TEST(FusedCrossEntropyKernel, StatisticsAndGradientMatchAtenOnAwkwardRows) {
  const int64_t rows = 5, cols = 4099, ld = 4111;
  at::Tensor base = random_tensor({rows, ld}, 3) * 3;
  base[1].fill_(-std::numeric_limits<double>::infinity());
  base[2].narrow(0, 0, 100).fill_(-std::numeric_limits<double>::infinity());
  base[3][cols - 2] = 40;
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor storage = base.to(dtype);
    const at::Tensor x = storage.narrow(1, 0, cols);
    const at::ScalarType ct = dtype == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor xd = x.to(at::kDouble);
    const at::Tensor col = torch::tensor(std::vector<int64_t>{5, -1, 4098, cols - 2, 0});
    at::Tensor stats = at::empty({ce_kernel::kStats, rows}, at::TensorOptions().dtype(ct));
    ce_kernel::ForwardArgs f = forward_args(x, ld, stats);
    f.target_col = col.const_data_ptr<int64_t>();
    f.smoothing_sum = true;
    ce_kernel::forward_stats(f);
    const at::Tensor sd = stats.to(at::kDouble);
    const at::Tensor lse = sd[0] + sd[1].log();
    const at::Tensor want = torch::logsumexp(xd, 1);
    const double tol = dtype == at::kDouble ? 1e-12 : 1e-5;
    EXPECT_TRUE(torch::isneginf(lse[1]).item<bool>()) << lse;
    for (int64_t r : {0, 2, 3, 4})
      EXPECT_NEAR(lse[r].item<double>(), want[r].item<double>(), tol * std::abs(want[r].item<double>()));
    EXPECT_EQ(sd[2][3].item<double>(), xd[3][cols - 2].item<double>());
    EXPECT_EQ(sd[2][1].item<double>(), 0.0);
    // The smoothing sum relative to the row's max, and the weight summed into it (no weights: cols).
    const at::Tensor rel = xd[0] - xd[0].max();
    EXPECT_NEAR(sd[3][0].item<double>(), rel.sum().item<double>(), 1e-5 * rel.abs().sum().item<double>());
    EXPECT_EQ(sd[4][0].item<double>(), static_cast<double>(cols));
    // Backward: a p - b - [t] t_coef, written over a copy of the rows in place.
    at::Tensor out = storage.clone();
    // The log-sum-exp as the combine hands it over: (max, log_sum), an all -inf row's max as 0.
    const at::Tensor max_ct = torch::where(torch::isneginf(sd[0]), torch::zeros_like(sd[0]), sd[0]).to(ct).contiguous();
    const at::Tensor log_sum_ct = stats[1].log().contiguous();
    const at::Tensor a = torch::tensor({1.0, 0.0, 2.0, 0.5, 1.0}).to(ct),
                     b = torch::tensor({0.01, 0.0, 0.0, 0.0, 0.02}).to(ct);
    const at::Tensor tc = torch::tensor({1.0, 0.0, 2.0, 0.5, 1.0}).to(ct);
    ce_kernel::BackwardArgs g = backward_args(out.narrow(1, 0, cols), out, ld, max_ct, log_sum_ct, a);
    g.b = b.const_data_ptr();
    g.t_coef = tc.const_data_ptr();
    g.target_col = col.const_data_ptr<int64_t>();
    ce_kernel::backward(g);
    const at::Tensor lse_d = max_ct.to(at::kDouble) + log_sum_ct.to(at::kDouble);
    at::Tensor expect =
        (xd - lse_d.unsqueeze(1)).exp() * a.to(at::kDouble).unsqueeze(1) - b.to(at::kDouble).unsqueeze(1);
    expect[1].zero_();  // a = b = t = 0: exact zeros
    for (int64_t r : {0, 2, 3, 4}) expect[r][col[r].item<int64_t>()] -= tc[r].item<double>();
    // bf16/fp16: the error of rounding the exact gradient to the dtype once, measured here
    // (the kernel computes in float and rounds once: about 1x of it).
    const double rounding = hyper_parallel::testing::relative_error(expect.to(dtype), expect);
    const double gtol = dtype == at::kDouble  ? 1e-12
                        : dtype == at::kFloat ? 1e-5
                                              : hyper_parallel::testing::kRoundingMultiple * rounding;
    EXPECT_LE(hyper_parallel::testing::relative_error(out.narrow(1, 0, cols), expect), gtol)
        << "rounding alone " << rounding;
    EXPECT_TRUE(out[1].narrow(0, 0, cols).eq(0).all().item<bool>());
    EXPECT_TRUE(out.narrow(1, cols, ld - cols).equal(storage.narrow(1, cols, ld - cols))) << "wrote past the rows";
  }
}

// The gradient of a logits matrix larger than the caches (written with streaming stores)
// is the gradient of its rows computed a few at a time (cached stores), bit for bit, in
// every dtype, also written over the logits; and the bf16 and fp16 gradients are the float32 gradient of the same
// values rounded as ATen rounds, bit for bit. Plain rows (the kernel's own bf16 rounding) and rows with a smoothing
// term (ATen's rounding); large, small and negative incoming gradients; -inf logits; rows 32-byte aligned (cols 4112)
// and not (cols 4099, and the small matrix).
TEST(FusedCrossEntropyKernel, LargeAndBf16GradientsAreTheSmallFloat32OnesBitForBit) {
  for (const auto& shape : {std::pair<int64_t, int64_t>{6, 5003}, {1200, 4112}, {1200, 4099}}) {
    // Named copies, not a structured binding: the lambdas below capture them (clang < 16).
    const int64_t rows = shape.first, cols = shape.second;
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    at::Tensor x = (random_tensor({rows, cols}, 17) * 4).to(at::kBFloat16);
    x[2].narrow(0, 0, 700).fill_(-std::numeric_limits<double>::infinity());
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor row_max = std::get<0>(xf.max(1)).contiguous();
    const at::Tensor log_sum =
        (xf.to(at::kDouble) - row_max.to(at::kDouble).unsqueeze(1)).exp().sum(1).log().to(at::kFloat);
    at::Tensor a = at::full({rows}, 1.0 / 4096, at::kFloat);
    a.narrow(0, 0, 6).copy_(torch::tensor({1.0 / 4096, 1.0, 3.5e20, -0.75, 1e-20, 2.0}, at::kFloat));
    at::Tensor col = at::full({rows}, int64_t{3}, at::kLong);
    col.narrow(0, 0, 6).copy_(torch::tensor(std::vector<int64_t>{5, -1, 4098, cols - 2, 0, 17}));
    const at::Tensor tc = a.clone();
    for (bool smoothing : {false, true}) {
      SCOPED_TRACE(smoothing ? "smoothing term" : "plain rows");
      const at::Tensor b = torch::full({rows}, smoothing ? 1e-6 : 0.0, at::kFloat);
      // Rows [r0, r0 + n) of the gradient of `in`, written into `out`.
      auto backward = [&](const at::Tensor& in, at::Tensor& out, int64_t r0, int64_t n) {
        ce_kernel::BackwardArgs g =
            backward_args(in.narrow(0, r0, n), out.narrow(0, r0, n), cols, row_max.narrow(0, r0, n),
                          log_sum.narrow(0, r0, n), a.narrow(0, r0, n));
        g.b = b.const_data_ptr<float>() + r0;
        g.t_coef = tc.const_data_ptr<float>() + r0;
        g.target_col = col.const_data_ptr<int64_t>() + r0;
        ce_kernel::backward(g);
      };
      auto whole = [&](const at::Tensor& in) {
        at::Tensor out = at::empty_like(in);
        backward(in, out, 0, rows);
        return out;
      };
      auto by_rows = [&](const at::Tensor& in) {
        at::Tensor out = at::empty_like(in);
        for (int64_t r0 = 0; r0 < rows; r0 += 16) backward(in, out, r0, std::min<int64_t>(16, rows - r0));
        return out;
      };
      auto expect_same_bits = [](const at::Tensor& want, const at::Tensor& got, const char* what) {
        const at::Tensor differ = want.view(at::kByte).ne(got.view(at::kByte));
        EXPECT_EQ(differ.sum().item<int64_t>(), 0) << what << ", first differing byte: " << differ.nonzero()[0];
      };
      // Written over the logits themselves, as gradient_in_forward does.
      auto in_place = [&](const at::Tensor& in) {
        at::Tensor out = in.clone();
        backward(out, out, 0, rows);
        return out;
      };
      const at::Tensor f32 = whole(xf);
      expect_same_bits(by_rows(xf), f32, "float32 whole vs by rows");
      expect_same_bits(in_place(xf), f32, "float32 in place vs not");
      expect_same_bits(in_place(x), whole(x), "bf16 in place vs not");
      const at::Tensor xh = x.to(at::kHalf);
      expect_same_bits(by_rows(xh), whole(xh), "float16 whole vs by rows");
      expect_same_bits(in_place(xh), whole(xh), "float16 in place vs not");
      expect_same_bits(whole(xh.to(at::kFloat)).to(at::kHalf), whole(xh), "float16 vs float32 rounded by ATen");
      expect_same_bits(by_rows(x), whole(x), "bf16 whole vs by rows");
      expect_same_bits(f32.to(at::kBFloat16), whole(x), "bf16 vs float32 rounded by ATen");
    }
  }
}

// The kernel's float exp (every exp it takes: the forward's sums and every gradient
// element) on x <= 0, against exp in float64 on fresh random arguments over its whole
// range and at the edges (0, exactly ln 2 multiples, where it flushes to 0: below
// FLT_MIN's log, -inf), on every vector-length tail: within 1 ulp where the vector FMA is
// fused (0.92 measured with AVX2), 1.5 without (the DEFAULT variant: 1.19 measured).
// ATen's softmax takes Sleef's 1-ulp exp.
TEST(FusedCrossEntropyKernel, ItsExpIsWithinAnUlpOnItsWholeDomain) {
  std::vector<float> x;
  at::manual_seed(11);
  for (double lo : {-88.0, -20.0, -1.0}) {
    const at::Tensor u = at::rand({100000}, at::kDouble) * lo;
    const double* p = u.data_ptr<double>();
    for (int64_t i = 0; i < u.numel(); ++i) x.push_back(static_cast<float>(p[i]));
  }
  for (int k = -126; k <= 0; ++k) x.push_back(static_cast<float>(k * std::log(2.0)));
  for (float e : {0.0f, -0.0f, -1e-30f, -87.0f, -87.33f, -87.4f, -87.7f, -88.0f, -100.0f, -1e30f,
                  -std::numeric_limits<float>::infinity()})
    x.push_back(e);
  x.push_back(-0.5f);  // an odd count: the last vector is partial
  const double bound = std::string(ce_kernel::capability_name()) == "DEFAULT" ? 1.5 : 1.0;
  std::vector<float> got(x.size());
  ce_kernel::exp_values(x.data(), got.data(), static_cast<int64_t>(x.size()));
  double worst_ulp = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    if (want < std::numeric_limits<float>::min()) {
      // Below FLT_MIN: 0 or the value (ATen's polynomial exp flushes to 0 there too).
      EXPECT_LE(got[i], std::numeric_limits<float>::min()) << "exp(" << x[i] << ")";
      EXPECT_GE(got[i], 0.0f) << "exp(" << x[i] << ")";
      continue;
    }
    const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
    const double err = std::abs(got[i] - want) / ulp;
    worst_ulp = std::max(worst_ulp, err);
    ASSERT_LE(err, bound) << "exp(" << x[i] << ") = " << got[i] << ", float64 " << want;
  }
  std::cout << "[ exp ] worst error " << worst_ulp << " ulp over " << x.size() << " arguments ("
            << ce_kernel::capability_name() << ")" << std::endl;
}

// A training loop's next step finds the previous step's gradient buffer free again and
// writes into it, instead of faulting in a fresh logits-sized buffer; what it writes there
// is each step's own gradient (ATen's on the full logits), not a stale one.
TEST(FusedCrossEntropy, TrainingStepsReuseTheGradientBuffer) {
  // The targets are replicated: the same seeded draw on every rank, with one ignored row.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor t = at::randint(16384, {64}, gen, at::kLong);
  t[5] = -100;
  std::vector<at::Tensor> fulls, want;
  for (uint64_t seed : {2, 3, 4}) {
    fulls.push_back(random_tensor({64, 16384}, seed, at::kFloat));
    at::Tensor ref = fulls.back().clone().set_requires_grad(true);
    F::cross_entropy(ref, t).backward();
    want.push_back(ref.grad());
  }
  run_ranks(2, [&](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    auto step = [&](size_t i) {
      at::Tensor x = distribute_tensor(fulls[i], mesh, {Shard(1)}).set_requires_grad(true);
      auto guard = loss_parallel();
      F::cross_entropy(x, t).backward();
      EXPECT_TRUE(at::allclose(full_tensor(x.grad()), want[i], 1e-5, 1e-9)) << "step " << i;
      return to_local(x.grad()).const_data_ptr();
    };
    const void* first = step(0);
    EXPECT_EQ(step(1), first);
    EXPECT_EQ(step(2), first);
  });
}

}  // namespace fused_cross_entropy_test
