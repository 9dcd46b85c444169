// The framework-free C interface (include/hyper_parallel_kernels/loss_kernels.h,
// libhyper_parallel_kernels.so) called as a C caller calls it: every rank's piece of the classes
// (TP 1-4, 3 uneven) gives its statistics, all pieces' statistics are stacked as the caller's
// all-gather would, every rank combines them and takes its piece's gradient. Against a float64
// one-process reference (values and gradients; 16-bit within ATen's own error in that dtype)
// and against the LibTorch route (vocab_parallel_cross_entropy / vocab_parallel_logprobs on the
// same pieces, real collectives), for every option and dtype; then each error code and message.
#include "hyper_parallel_kernels/loss_kernels.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "harness/cross_entropy_data.h"
#include "harness/rank_harness.h"
#include "harness/rounding_bound.h"
#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/loss/vocab_logprobs.h"
#include "hyper_parallel/loss/vocab_parallel.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"

namespace loss_kernels_c_api_test {

namespace hp = hyper_parallel;
using hyper_parallel::testing::random_cross_entropy_data;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::RoundingRecord;
using hyper_parallel::testing::run_ranks;

namespace {

int32_t hpk_dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return HPK_FLOAT32;
    case at::kHalf:
      return HPK_FLOAT16;
    case at::kBFloat16:
      return HPK_BFLOAT16;
    case at::kDouble:
      return HPK_FLOAT64;
    case at::kInt:
      return HPK_INT32;
    default:
      return HPK_INT64;
  }
}

at::ScalarType compute_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

const std::vector<at::ScalarType> kDtypes = {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf};

// This rank's piece of `full`'s classes as the C interface reads it: the full array's memory
// with its row stride (no copy), at the piece's first class.
hpk_logits piece_of(const at::Tensor& full, int64_t rank, int64_t tp) {
  const hp::ChunkRange r = hp::chunk_range(full.size(1), tp, rank);
  hpk_logits x;
  x.dtype = hpk_dtype_of(full.scalar_type());
  x.data = static_cast<const char*>(full.const_data_ptr()) + r.offset * full.element_size();
  x.rows = full.size(0);
  x.local_classes = r.length;
  x.row_stride = full.size(1);
  x.class_offset = r.offset;
  x.total_classes = full.size(1);
  return x;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0;
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// The largest differences seen between the C interface and the LibTorch route, per dtype.
struct Agreement {
  std::mutex mutex;
  std::map<std::string, double> loss, grad;
  void record(at::ScalarType t, double l, double g) {
    std::lock_guard<std::mutex> lock(mutex);
    loss[c10::toString(t)] = std::max(loss[c10::toString(t)], l);
    grad[c10::toString(t)] = std::max(grad[c10::toString(t)], g);
  }
  std::string summary() {
    std::ostringstream s;
    for (const auto& [t, l] : loss) s << t << ": loss " << l << ", gradient " << grad[t] << "; ";
    return s.str();
  }
};

// ---- Cross-entropy ------------------------------------------------------------------------

struct Case {
  int64_t rows = 40, classes = 19;
  int32_t reduction = HPK_REDUCTION_MEAN;
  bool weighted = false, soft = false, int32_targets = false;
  double label_smoothing = 0, ignored_fraction = 0, z_loss_weight = 0, logit_softcap = 0;
  std::string name() const {
    std::ostringstream s;
    s << rows << "x" << classes
      << (reduction == 0   ? " none"
          : reduction == 1 ? " mean"
                           : " sum")
      << (weighted ? " weighted" : "") << (soft ? " soft" : "") << (int32_targets ? " int32" : "")
      << " eps=" << label_smoothing << " ignored=" << ignored_fraction << " z=" << z_loss_weight
      << " cap=" << logit_softcap;
    return s.str();
  }
};

struct Data : hyper_parallel::testing::CrossEntropyData {
  at::Tensor grad_loss;  // the incoming gradient, float64
};

Data make_data(const Case& c, uint64_t seed) {
  const at::Tensor grad_loss = random_tensor(
      c.reduction == HPK_REDUCTION_NONE ? std::vector<int64_t>{c.rows} : std::vector<int64_t>{}, seed + 3);
  return {random_cross_entropy_data(c, seed), grad_loss};
}

// The definition on the full logits (any dtype): y = cap tanh(x / cap); cross_entropy(y) plus
// z * lse(y)^2 per counted row, 'mean' dividing the z-loss sum by the counted rows.
at::Tensor reference_loss(const Case& c, const at::Tensor& x, const at::Tensor& target, const at::Tensor& weight) {
  const at::Tensor y = c.logit_softcap > 0 ? c.logit_softcap * at::tanh(x / c.logit_softcap) : x;
  const at::Tensor valid = c.soft ? at::ones({c.rows}, x.options()) : target.ne(-100).to(x.scalar_type());
  const at::Tensor z_rows = c.z_loss_weight * at::logsumexp(y, 1).square() * valid;
  const int64_t reduction = c.reduction;  // hpk_reduction has at::Reduction's values
  const at::Tensor ce =
      at::cross_entropy_loss(y, target, weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt, reduction,
                             -100, c.label_smoothing);
  if (reduction == at::Reduction::None) return ce + z_rows;
  if (reduction == at::Reduction::Sum) return ce + z_rows.sum();
  return ce + z_rows.sum() / valid.sum();
}

struct Result {
  at::Tensor loss, grad;
};

// The reference's loss and gradient with its logits, target and weight in `dtype`.
Result reference(const Case& c, const Data& d, at::ScalarType dtype) {
  const at::Tensor x = d.logits.to(dtype).clone().requires_grad_();  // a leaf of its own
  const at::Tensor target = c.soft ? d.target.to(dtype) : d.target;
  const at::Tensor loss = reference_loss(c, x, target, d.weight.defined() ? d.weight.to(dtype) : at::Tensor());
  (loss * d.grad_loss.to(dtype)).sum().backward();
  return {loss.detach(), x.grad()};
}

hpk_cross_entropy c_problem(const Case& c, const hpk_logits& x, const at::Tensor& target, const at::Tensor& weight) {
  hpk_cross_entropy ce;
  hpk_cross_entropy_init(&ce);
  ce.logits = x;
  if (c.soft) {
    // This rank's columns of the full probability rows.
    ce.target_kind = HPK_TARGET_PROBABILITIES;
    ce.target_dtype = hpk_dtype_of(target.scalar_type());
    ce.target = static_cast<const char*>(target.const_data_ptr()) + x.class_offset * target.element_size();
    ce.target_row_stride = target.size(1);
  } else {
    ce.target_dtype = hpk_dtype_of(target.scalar_type());
    ce.target = target.const_data_ptr();
  }
  if (weight.defined()) {
    ce.weight = weight.const_data_ptr();
    ce.weight_dtype = hpk_dtype_of(weight.scalar_type());
    ce.weight_length = weight.numel();
  }
  ce.reduction = c.reduction;
  ce.label_smoothing = c.label_smoothing;
  ce.z_loss_weight = c.z_loss_weight;
  ce.logit_softcap = c.logit_softcap;
  return ce;
}

// The C interface at TP `tp` on logits, targets and weights in `dtype` (index targets int64 or
// int32): stats per rank, the gather as a stack, combine on every rank (each must give the
// same loss, bit for bit), backward per rank into its columns of one gradient.
Result c_interface(const Case& c, const Data& d, at::ScalarType dtype, int64_t tp) {
  const at::ScalarType ct = compute_type(dtype);
  const at::Tensor x = d.logits.to(dtype).contiguous();
  const at::Tensor target =
      c.soft ? d.target.to(dtype).contiguous() : d.target.to(c.int32_targets ? at::kInt : at::kLong).contiguous();
  const at::Tensor weight = d.weight.defined() ? d.weight.to(dtype).contiguous() : at::Tensor();
  const at::Tensor grad_loss = d.grad_loss.to(ct).contiguous();
  const int64_t rows = c.rows;
  at::Tensor all = at::full({tp, HPK_STATS, rows}, std::nan(""), x.options().dtype(ct));
  hpk_error err;
  for (int64_t p = 0; p < tp; ++p) {
    const hpk_cross_entropy ce = c_problem(c, piece_of(x, p, tp), target, weight);
    EXPECT_EQ(hpk_cross_entropy_stats(&ce, all[p].data_ptr(), &err), HPK_OK) << err.message;
  }
  Result out;
  out.grad = at::full_like(x, std::nan(""));
  for (int64_t p = 0; p < tp; ++p) {
    const hpk_cross_entropy ce = c_problem(c, piece_of(x, p, tp), target, weight);
    at::Tensor loss = at::empty(c.reduction == HPK_REDUCTION_NONE ? std::vector<int64_t>{rows} : std::vector<int64_t>{},
                                x.options().dtype(ct));
    at::Tensor saved = at::empty({HPK_CE_SAVED, rows}, x.options().dtype(ct));
    EXPECT_EQ(hpk_cross_entropy_combine(&ce, all.const_data_ptr(), tp, loss.data_ptr(), saved.data_ptr(), &err), HPK_OK)
        << err.message;
    if (p == 0)
      out.loss = loss;
    else
      EXPECT_TRUE(at::equal(loss, out.loss)) << "rank " << p << "'s loss differs from rank 0's";
    char* grad_piece = static_cast<char*>(out.grad.data_ptr()) + ce.logits.class_offset * out.grad.element_size();
    EXPECT_EQ(hpk_cross_entropy_backward(&ce, saved.const_data_ptr(), grad_loss.const_data_ptr(), grad_piece,
                                         out.grad.size(1), &err),
              HPK_OK)
        << err.message;
  }
  return out;
}

// The LibTorch route on the same pieces: vocab_parallel_cross_entropy_forward / _backward at TP
// `tp` over real collectives (ranks as threads), every case in every dtype in one world: their
// losses (the logits' dtype) and gradients, [case][dtype].
using Routes = std::vector<std::map<at::ScalarType, Result>>;
Routes libtorch_route(const std::vector<Case>& cases, const std::vector<Data>& data, int64_t tp) {
  Routes out(cases.size());
  for (size_t i = 0; i < cases.size(); ++i)
    for (at::ScalarType dtype : kDtypes) out[i][dtype] = {at::Tensor(), at::empty_like(data[i].logits.to(dtype))};
  std::mutex mutex;
  run_ranks(tp, [&](int64_t rank) {
    auto mesh = hp::init_device_mesh("cpu", {tp});
    const hp::Communicator* comm = &mesh.comm(0);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const Data& d = data[i];
      const hp::ChunkRange r = hp::chunk_range(c.classes, tp, rank);
      for (at::ScalarType dtype : kDtypes) {
        const at::Tensor local = d.logits.to(dtype).narrow(1, r.offset, r.length).contiguous();
        const at::Tensor target = c.soft ? d.target.to(dtype).narrow(1, r.offset, r.length).contiguous() : d.target;
        const std::optional<at::Tensor> weight =
            d.weight.defined() ? std::optional<at::Tensor>(d.weight.to(dtype)) : std::nullopt;
        hp::VocabCrossEntropyOptions o;
        o.reduction = c.reduction;
        o.label_smoothing = c.label_smoothing;
        o.z_loss_weight = c.z_loss_weight;
        o.logit_softcap = c.logit_softcap;
        hp::VocabCrossEntropySaved saved;
        const at::Tensor loss =
            hp::vocab_parallel_cross_entropy_forward(local, 1, target, weight, comm, c.classes, o, &saved);
        const at::Tensor grad = hp::vocab_parallel_cross_entropy_backward(d.grad_loss.to(dtype), local, 1, target,
                                                                          weight, saved, comm, c.classes, o);
        std::lock_guard<std::mutex> lock(mutex);
        if (rank == 0) out[i][dtype].loss = loss;
        out[i][dtype].grad.narrow(1, r.offset, r.length).copy_(grad);
      }
    }
  });
  return out;
}

std::vector<Case> option_grid() {
  std::vector<Case> cases;
  for (int32_t r : {HPK_REDUCTION_NONE, HPK_REDUCTION_MEAN, HPK_REDUCTION_SUM}) {
    for (bool w : {false, true}) {
      for (auto [z, cap] : std::vector<std::pair<double, double>>{{0, 0}, {1e-2, 0}, {0, 5}}) {
        Case base;
        base.reduction = r;
        base.weighted = w;
        base.z_loss_weight = z;
        base.logit_softcap = cap;
        cases.push_back(base);
        Case ign = base;
        ign.ignored_fraction = 0.3;
        ign.int32_targets = true;
        cases.push_back(ign);
        Case ls = ign;
        ls.label_smoothing = 0.1;
        ls.int32_targets = false;
        cases.push_back(ls);
        Case soft = base;
        soft.soft = true;
        soft.label_smoothing = r == HPK_REDUCTION_SUM ? 0.2 : 0;
        cases.push_back(soft);
      }
    }
  }
  return cases;
}

// ---- Log-probabilities ----------------------------------------------------------------------

struct LogprobsCase {
  int64_t rows = 15, classes = 13;
  double temperature = 1;
  bool entropy = false, ignored = false;
  std::string name() const {
    std::ostringstream s;
    s << rows << "x" << classes << " T=" << temperature << (entropy ? " entropy" : "") << (ignored ? " ignored" : "");
    return s.str();
  }
};

struct LogprobsResult {
  at::Tensor logprobs, entropy, grad;
};

struct LogprobsData {
  at::Tensor logits, target, g_lp, g_h;
};

LogprobsData make_logprobs_data(const LogprobsCase& c, uint64_t seed) {
  LogprobsData d;
  d.logits = random_tensor({c.rows, c.classes}, seed) * 4;
  d.target = (random_tensor({c.rows}, seed + 1).abs() * 1000).to(at::kLong).remainder(c.classes);
  if (c.ignored) d.target.index_put_({at::arange(0, c.rows, 3)}, -100);
  d.g_lp = random_tensor({c.rows}, seed + 2);
  d.g_h = random_tensor({c.rows}, seed + 3);
  return d;
}

LogprobsResult logprobs_reference(const LogprobsCase& c, const LogprobsData& d, at::ScalarType dtype) {
  const at::Tensor x = d.logits.to(dtype).clone().requires_grad_();  // a leaf of its own
  const at::Tensor lsm = at::log_softmax(x / c.temperature, -1);
  const at::Tensor valid = d.target.ne(-100);
  const at::Tensor idx = at::where(valid, d.target, at::zeros_like(d.target));
  const at::Tensor lp = lsm.gather(-1, idx.unsqueeze(-1)).squeeze(-1) * valid;
  const at::Tensor h = -(lsm.exp() * lsm).sum(-1) * valid;
  at::Tensor objective = (lp * d.g_lp.to(dtype)).sum();
  if (c.entropy) objective = objective + (h * d.g_h.to(dtype)).sum();
  objective.backward();
  return {lp.detach(), h.detach(), x.grad()};
}

LogprobsResult logprobs_c_interface(const LogprobsCase& c, const LogprobsData& d, at::ScalarType dtype, int64_t tp) {
  const at::ScalarType ct = compute_type(dtype);
  const at::Tensor x = d.logits.to(dtype).contiguous();
  const at::Tensor g_lp = d.g_lp.to(ct), g_h = d.g_h.to(ct);
  at::Tensor all = at::full({tp, HPK_STATS, c.rows}, std::nan(""), x.options().dtype(ct));
  hpk_error err;
  auto problem = [&](int64_t p) {
    hpk_logprobs lp;
    hpk_logprobs_init(&lp);
    lp.logits = piece_of(x, p, tp);
    lp.target = d.target.const_data_ptr();
    lp.temperature = c.temperature;
    lp.entropy = c.entropy;
    return lp;
  };
  for (int64_t p = 0; p < tp; ++p) {
    const hpk_logprobs lp = problem(p);
    EXPECT_EQ(hpk_logprobs_stats(&lp, all[p].data_ptr(), &err), HPK_OK) << err.message;
  }
  LogprobsResult out;
  out.grad = at::full_like(x, std::nan(""));
  for (int64_t p = 0; p < tp; ++p) {
    const hpk_logprobs lp = problem(p);
    at::Tensor logprobs = at::empty({c.rows}, x.options().dtype(ct)), entropy = at::zeros_like(logprobs);
    at::Tensor saved = at::empty({HPK_LOGPROBS_SAVED, c.rows}, x.options().dtype(ct));
    EXPECT_EQ(hpk_logprobs_combine(&lp, all.const_data_ptr(), tp, logprobs.data_ptr(),
                                   c.entropy ? entropy.data_ptr() : nullptr, saved.data_ptr(), &err),
              HPK_OK)
        << err.message;
    if (p == 0) {
      out.logprobs = logprobs;
      out.entropy = entropy;
    } else {
      EXPECT_TRUE(at::equal(logprobs, out.logprobs) && at::equal(entropy, out.entropy)) << "rank " << p;
    }
    char* grad_piece = static_cast<char*>(out.grad.data_ptr()) + lp.logits.class_offset * out.grad.element_size();
    EXPECT_EQ(hpk_logprobs_backward(&lp, saved.const_data_ptr(), g_lp.const_data_ptr(),
                                    c.entropy ? g_h.const_data_ptr() : nullptr, grad_piece, out.grad.size(1), &err),
              HPK_OK)
        << err.message;
  }
  return out;
}

using LogprobsRoutes = std::vector<std::map<at::ScalarType, LogprobsResult>>;
LogprobsRoutes logprobs_libtorch_route(const std::vector<LogprobsCase>& cases, const std::vector<LogprobsData>& data,
                                       int64_t tp) {
  LogprobsRoutes out(cases.size());
  for (size_t i = 0; i < cases.size(); ++i)
    for (at::ScalarType dtype : kDtypes)
      out[i][dtype] = {at::Tensor(), at::Tensor(), at::empty_like(data[i].logits.to(dtype))};
  std::mutex mutex;
  run_ranks(tp, [&](int64_t rank) {
    auto mesh = hp::init_device_mesh("cpu", {tp});
    const hp::Communicator* comm = &mesh.comm(0);
    for (size_t i = 0; i < cases.size(); ++i) {
      const LogprobsCase& c = cases[i];
      const LogprobsData& d = data[i];
      const hp::ChunkRange r = hp::chunk_range(c.classes, tp, rank);
      for (at::ScalarType dtype : kDtypes) {
        const at::Tensor local = d.logits.to(dtype).narrow(1, r.offset, r.length).contiguous();
        hp::LogprobsOptions o;
        o.temperature = c.temperature;
        o.return_entropy = c.entropy;
        hp::LogprobsSaved saved;
        const hp::Logprobs res = hp::vocab_parallel_logprobs_forward(local, 1, d.target, comm, c.classes, o, &saved);
        const at::Tensor grad =
            hp::vocab_parallel_logprobs_backward(d.g_lp.to(dtype), c.entropy ? d.g_h.to(dtype) : at::Tensor(), local, 1,
                                                 d.target, saved, comm, c.classes, o);
        std::lock_guard<std::mutex> lock(mutex);
        if (rank == 0) {
          out[i][dtype].logprobs = res.logprobs;
          out[i][dtype].entropy = res.entropy;
        }
        out[i][dtype].grad.narrow(1, r.offset, r.length).copy_(grad);
      }
    }
  });
  return out;
}

// ---- Errors ---------------------------------------------------------------------------------

struct Small {
  at::Tensor logits = random_tensor({4, 6}, 7).to(at::kFloat);
  at::Tensor target = at::tensor({0, 5, -100, 2}, at::kLong);
  hpk_cross_entropy ce() const {
    hpk_cross_entropy ce;
    hpk_cross_entropy_init(&ce);
    ce.logits = piece_of(logits, 0, 1);
    ce.target = target.const_data_ptr();
    return ce;
  }
};

// The status and message of stats on `ce`; the statistics must be left as they were.
std::pair<int32_t, std::string> stats_error(const hpk_cross_entropy& ce) {
  // (Rows beyond what a test allocates stop at the checks.)
  std::vector<float> stats(static_cast<size_t>(HPK_STATS * std::clamp<int64_t>(ce.logits.rows, 1, 1024)), 42.f);
  hpk_error err;
  std::memset(&err, 0, sizeof err);
  const int32_t code = hpk_cross_entropy_stats(&ce, stats.data(), &err);
  EXPECT_EQ(err.code, code);
  if (code != HPK_OK) {
    for (float v : stats) EXPECT_EQ(v, 42.f) << "outputs written despite the error: " << err.message;
  }
  return {code, err.message};
}

}  // namespace

TEST(LossKernelsCApi, CrossEntropyMatchesFloat64ReferenceAndTheLibTorchRouteAtEveryDegree) {
  RoundingRecord rounding;
  Agreement agreement;
  const std::vector<Case> cases = option_grid();
  std::vector<Data> data;
  for (size_t i = 0; i < cases.size(); ++i) data.push_back(make_data(cases[i], 100 + i));
  std::map<int64_t, Routes> routes;  // the LibTorch route at TP 1 and 3 (uneven)
  for (int64_t tp : {1, 3}) routes[tp] = libtorch_route(cases, data, tp);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Data& d = data[i];
    const Result ref = reference(c, d, at::kDouble);
    for (at::ScalarType dtype : kDtypes) {
      // ATen's own computation in this dtype: how far rounding alone takes a result.
      const Result aten = c10::elementSize(dtype) == 2 ? reference(c, d, dtype) : Result{};
      for (int64_t tp : {1, 2, 3, 4}) {
        SCOPED_TRACE(c.name() + " " + c10::toString(dtype) + " TP " + std::to_string(tp));
        const Result got = c_interface(c, d, dtype, tp);
        const double loss_err = hyper_parallel::testing::relative_error(got.loss, ref.loss);
        EXPECT_LE(loss_err, rounding.tolerance(dtype, aten.loss, ref.loss, loss_err)) << got.loss << ref.loss;
        const double grad_err = hyper_parallel::testing::relative_error(got.grad, ref.grad);
        EXPECT_LE(grad_err, rounding.tolerance(dtype, aten.grad, ref.grad, grad_err)) << "gradient";
        if (!routes.count(tp)) continue;
        // The LibTorch route: the same kernels, so the same values to the dtype's last bits. Its
        // loss is in the logits' dtype (ours rounded to it) and so is its incoming gradient: ours
        // given that rounded one too. (The coefficients' products are rounded in another order.)
        const Result& lt = routes[tp][i][dtype];
        Data rounded = d;
        rounded.grad_loss = d.grad_loss.to(dtype).to(at::kDouble);
        const Result same_input = c_interface(c, rounded, dtype, tp);
        const double loss_diff = max_abs_diff(got.loss.to(dtype), lt.loss);
        const double grad_diff = max_abs_diff(same_input.grad, lt.grad);
        const double loss_scale = std::max(1.0, ref.loss.abs().max().item<double>());
        const double grad_scale = ref.grad.abs().max().item<double>();
        // With soft-capping, one rounding step of a 16-bit dtype: the tanh is Sleef's in
        // LibTorch and libm's here (src/kernels_c/sleef_lanes.cpp), a float ulp apart at times,
        // which can move a 16-bit value's rounding by one step.
        const double ulp16 = dtype == at::kHalf ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
        const double eps = dtype == at::kDouble  ? 1e-14
                           : dtype == at::kFloat ? 1e-6
                           : c.logit_softcap > 0 ? ulp16
                                                 : 2e-5;
        EXPECT_LE(loss_diff, eps * loss_scale) << "loss vs the LibTorch route: " << got.loss << lt.loss;
        EXPECT_LE(grad_diff, eps * grad_scale) << "gradient vs the LibTorch route";
        agreement.record(dtype, loss_diff / loss_scale, grad_diff / grad_scale);
      }
    }
  }
  std::cout << "[ 16-bit   ] " << rounding.summary()
            << "\n[ LibTorch ] largest difference / scale: " << agreement.summary() << std::endl;
}

// Rows longer than the kernel's 2048-class blocks (the running max rescaled), and more ranks
// than some pieces have classes.
TEST(LossKernelsCApi, LongRowsAndEmptyPiecesMatchTheReference) {
  Case c;
  c.rows = 40;
  c.classes = 4100;
  c.ignored_fraction = 0.2;
  c.label_smoothing = 0.1;
  c.weighted = true;
  c.z_loss_weight = 1e-3;
  const Data d = make_data(c, 7);
  const Result ref = reference(c, d, at::kDouble);
  for (int64_t tp : {1, 3}) {
    const Result got = c_interface(c, d, at::kFloat, tp);
    EXPECT_LE(hyper_parallel::testing::relative_error(got.loss, ref.loss), 2e-5) << "TP " << tp;
    EXPECT_LE(hyper_parallel::testing::relative_error(got.grad, ref.grad), 2e-5) << "TP " << tp;
  }
  // Rows in tasks on OpenMP's threads (40 x 4100 logits: three tasks of the kernels' grain at
  // three threads), each row computed alone: the same bits as on one thread.
  hpk_error err;
  ASSERT_EQ(hpk_set_num_threads(1, &err), HPK_OK);
  const Result one_thread = c_interface(c, d, at::kFloat, 1);
  ASSERT_EQ(hpk_set_num_threads(3, &err), HPK_OK);
  const Result three_threads = c_interface(c, d, at::kFloat, 1);
  EXPECT_TRUE(at::equal(one_thread.loss, three_threads.loss) && at::equal(one_thread.grad, three_threads.grad));
  ASSERT_EQ(hpk_set_num_threads(0, &err), HPK_OK);
  Case tiny;
  tiny.classes = 3;  // TP 4: torch.chunk gives pieces 1, 1, 1, 0
  tiny.ignored_fraction = 0.3;
  const Data t = make_data(tiny, 8);
  const Result tiny_ref = reference(tiny, t, at::kDouble);
  const Result got = c_interface(tiny, t, at::kDouble, 4);
  EXPECT_LE(hyper_parallel::testing::relative_error(got.loss, tiny_ref.loss), 1e-12);
  EXPECT_LE(hyper_parallel::testing::relative_error(got.grad, tiny_ref.grad), 1e-12);
}

TEST(LossKernelsCApi, LogprobsAndEntropyMatchFloat64ReferenceAndTheLibTorchRoute) {
  RoundingRecord rounding;
  Agreement agreement;
  std::vector<LogprobsCase> cases;
  for (double t : {1.0, 0.7, 1e-3})
    for (bool entropy : {false, true})
      for (bool ignored : {false, true}) cases.push_back({15, 13, t, entropy, ignored});
  std::vector<LogprobsData> data;
  for (size_t i = 0; i < cases.size(); ++i) data.push_back(make_logprobs_data(cases[i], 300 + i));
  std::map<int64_t, LogprobsRoutes> routes;
  for (int64_t tp : {1, 3}) routes[tp] = logprobs_libtorch_route(cases, data, tp);
  for (size_t i = 0; i < cases.size(); ++i) {
    const LogprobsCase& c = cases[i];
    const LogprobsData& d = data[i];
    const LogprobsResult ref = logprobs_reference(c, d, at::kDouble);
    for (at::ScalarType dtype : kDtypes) {
      const LogprobsResult aten = c10::elementSize(dtype) == 2 ? logprobs_reference(c, d, dtype) : LogprobsResult{};
      for (int64_t tp : {1, 2, 3, 4}) {
        SCOPED_TRACE(c.name() + " " + c10::toString(dtype) + " TP " + std::to_string(tp));
        const LogprobsResult got = logprobs_c_interface(c, d, dtype, tp);
        // At T = 1e-3 ATen's log_softmax(x / T) in 16 bits is far off (x / T rounded first):
        // there the bound is a fixed one, as for the compute type float32 at 16-bit inputs.
        const bool aten_bound = !(c.temperature < 0.1 && c10::elementSize(dtype) == 2);
        auto check = [&](const at::Tensor& ours, const at::Tensor& theirs, const at::Tensor& want, const char* what) {
          const double err = hyper_parallel::testing::relative_error(ours, want);
          const double tol = aten_bound ? rounding.tolerance(dtype, theirs, want, err) : 1e-2;
          EXPECT_LE(err, tol) << what;
        };
        check(got.logprobs, aten.logprobs, ref.logprobs, "log-probabilities");
        if (c.entropy) check(got.entropy, aten.entropy, ref.entropy, "entropy");
        check(got.grad, aten.grad, ref.grad, "gradient");
        if (!routes.count(tp)) continue;
        // The LibTorch route, given the incoming gradients in the logits' dtype: ours too.
        const LogprobsResult& lt = routes[tp][i][dtype];
        LogprobsData rounded = d;
        rounded.g_lp = d.g_lp.to(dtype).to(at::kDouble);
        rounded.g_h = d.g_h.to(dtype).to(at::kDouble);
        const LogprobsResult same_input = logprobs_c_interface(c, rounded, dtype, tp);
        const double lp_diff = max_abs_diff(got.logprobs.to(dtype), lt.logprobs);
        const double grad_diff = max_abs_diff(same_input.grad, lt.grad);
        const double lp_scale = std::max(1.0, ref.logprobs.abs().max().item<double>());
        const double grad_scale = ref.grad.abs().max().item<double>();
        const double eps = dtype == at::kDouble ? 1e-13 : dtype == at::kFloat ? 1e-6 : 2e-5;
        EXPECT_LE(lp_diff, eps * lp_scale) << "log-probabilities vs the LibTorch route";
        EXPECT_LE(grad_diff, eps * grad_scale) << "gradient vs the LibTorch route";
        if (c.entropy) {
          EXPECT_LE(max_abs_diff(got.entropy.to(dtype), lt.entropy), eps * lp_scale) << "entropy";
        }
        agreement.record(dtype, lp_diff / lp_scale, grad_diff / grad_scale);
      }
    }
  }
  std::cout << "[ 16-bit   ] " << rounding.summary()
            << "\n[ LibTorch ] largest difference / scale: " << agreement.summary() << std::endl;
}

// The gradient written over the logits (grad_logits == logits), as a framework that donates
// the logits' memory does.
TEST(LossKernelsCApi, BackwardMayWriteOverTheLogits) {
  Case c;
  c.ignored_fraction = 0.2;
  c.label_smoothing = 0.1;
  const Data d = make_data(c, 11);
  const Result want = c_interface(c, d, at::kFloat, 2);
  at::Tensor x = d.logits.to(at::kFloat).contiguous();
  const at::Tensor target = d.target.contiguous();
  const at::Tensor grad_loss = d.grad_loss.to(at::kFloat);
  at::Tensor all = at::empty({2, HPK_STATS, c.rows}, at::kFloat);
  std::vector<at::Tensor> saved;
  hpk_error err;
  for (int64_t p = 0; p < 2; ++p) {
    const hpk_cross_entropy ce = c_problem(c, piece_of(x, p, 2), target, at::Tensor());
    ASSERT_EQ(hpk_cross_entropy_stats(&ce, all[p].data_ptr(), &err), HPK_OK) << err.message;
  }
  for (int64_t p = 0; p < 2; ++p) {
    const hpk_cross_entropy ce = c_problem(c, piece_of(x, p, 2), target, at::Tensor());
    at::Tensor loss = at::empty({}, at::kFloat);
    saved.push_back(at::empty({HPK_CE_SAVED, c.rows}, at::kFloat));
    ASSERT_EQ(hpk_cross_entropy_combine(&ce, all.const_data_ptr(), 2, loss.data_ptr(), saved[p].data_ptr(), &err),
              HPK_OK);
    ASSERT_EQ(hpk_cross_entropy_backward(&ce, saved[p].const_data_ptr(), grad_loss.const_data_ptr(),
                                         const_cast<void*>(ce.logits.data), ce.logits.row_stride, &err),
              HPK_OK)
        << err.message;
  }
  EXPECT_TRUE(at::equal(x, want.grad));
}

TEST(LossKernelsCApi, EveryErrorHasItsCodeAndNamesWhatWasExpectedAndFound) {
  const Small s;
  auto expect = [](const hpk_cross_entropy& ce, int32_t code, const std::string& words) {
    const auto [got, message] = stats_error(ce);
    EXPECT_EQ(got, code) << message;
    EXPECT_NE(message.find(words), std::string::npos) << "message: " << message << "\nexpected to contain: " << words;
    EXPECT_EQ(message.rfind("hpk_cross_entropy_stats: ", 0), 0u) << message;
  };
  EXPECT_EQ(stats_error(s.ce()).first, HPK_OK);
  {
    hpk_error err;
    EXPECT_EQ(hpk_cross_entropy_stats(nullptr, nullptr, &err), HPK_ERROR_NULL_POINTER);
    EXPECT_STREQ(err.message, "hpk_cross_entropy_stats: expected ce to point at data, got NULL");
    hpk_cross_entropy ce = s.ce();
    EXPECT_EQ(hpk_cross_entropy_stats(&ce, nullptr, nullptr), HPK_ERROR_NULL_POINTER) << "a NULL error: the code only";
  }
  hpk_cross_entropy ce = s.ce();
  ce.logits.dtype = 9;
  expect(ce, HPK_ERROR_DTYPE,
         "expected logits.dtype HPK_FLOAT32, HPK_FLOAT16, HPK_BFLOAT16 or HPK_FLOAT64, got an unknown dtype (9)");
  ce = s.ce();
  ce.logits.data = nullptr;
  expect(ce, HPK_ERROR_NULL_POINTER, "expected logits.data to point at data, got NULL");
  ce = s.ce();
  ce.logits.class_offset = 1;
  expect(ce, HPK_ERROR_SHAPE,
         "expected this rank's classes inside the total: class_offset (1) + local_classes (6) <= total_classes (6)");
  ce = s.ce();
  ce.logits.row_stride = 5;
  expect(ce, HPK_ERROR_SHAPE, "expected logits.row_stride 0 or >= 6 (the classes of a row), got 5");
  ce = s.ce();
  ce.logits.rows = -1;
  expect(ce, HPK_ERROR_SHAPE, "expected logits.rows >= 0, got -1");
  ce = s.ce();
  const at::Tensor bad_target = at::tensor({0, 6, 1, 2}, at::kLong);
  ce.target = bad_target.const_data_ptr();
  expect(ce, HPK_ERROR_TARGET,
         "expected index targets in [0, 6) (total_classes) or equal to ignore_index (-100), got 6 at row 1");
  ce = s.ce();
  ce.target_dtype = HPK_FLOAT32;
  expect(ce, HPK_ERROR_DTYPE, "expected index targets of HPK_INT32 or HPK_INT64, got HPK_FLOAT32");
  ce = s.ce();
  const at::Tensor weight = at::ones({5}, at::kFloat);
  ce.weight = weight.const_data_ptr();
  ce.weight_length = 5;
  expect(ce, HPK_ERROR_WEIGHT, "expected class weights of length total_classes (6), got weight_length 5");
  ce.weight_length = 6;
  ce.weight_dtype = HPK_INT64;
  expect(ce, HPK_ERROR_DTYPE,
         "expected class weights of HPK_FLOAT32, HPK_FLOAT16, HPK_BFLOAT16 or HPK_FLOAT64, got HPK_INT64");
  ce = s.ce();
  ce.reduction = 3;
  expect(ce, HPK_ERROR_OPTION,
         "expected reduction HPK_REDUCTION_NONE (0), HPK_REDUCTION_MEAN (1) or HPK_REDUCTION_SUM (2), got 3");
  ce = s.ce();
  ce.label_smoothing = 1.5;
  expect(ce, HPK_ERROR_OPTION, "expected label_smoothing in [0, 1], got 1.5");
  ce = s.ce();
  ce.z_loss_weight = -1;
  expect(ce, HPK_ERROR_OPTION, "expected z_loss_weight finite and >= 0, got -1");
  ce = s.ce();
  ce.logit_softcap = std::numeric_limits<double>::infinity();
  expect(ce, HPK_ERROR_OPTION, "expected logit_softcap finite and >= 0 (0: off), got inf");
  ce = s.ce();
  ce.target_kind = HPK_TARGET_PROBABILITIES;
  ce.target_dtype = HPK_FLOAT32;
  ce.target = s.logits.const_data_ptr();
  ce.ignore_index = 0;
  expect(ce, HPK_ERROR_OPTION,
         "probability targets take no ignore_index: expected a negative ignore_index (PyTorch's rule), got 0");
  ce.target_kind = 2;
  expect(ce, HPK_ERROR_OPTION, "expected target_kind HPK_TARGET_INDEX (0) or HPK_TARGET_PROBABILITIES (1), got 2");
  // An exception inside the library (a vector too large to allocate) is a status, not a crash.
  ce = s.ce();
  ce.logits.rows = int64_t{1} << 61;
  ce.logits.row_stride = 6;
  const auto [internal, message] = stats_error(ce);
  EXPECT_EQ(internal, HPK_ERROR_INTERNAL) << message;

  // combine, backward and the log-probabilities' own checks.
  hpk_error err;
  std::vector<float> all(HPK_STATS * 4), loss(4), saved(HPK_CE_SAVED * 4);
  ce = s.ce();
  EXPECT_EQ(hpk_cross_entropy_combine(&ce, all.data(), 0, loss.data(), saved.data(), &err), HPK_ERROR_SHAPE);
  EXPECT_STREQ(err.message, "hpk_cross_entropy_combine: expected ranks >= 1 (the first dimension of all_stats), got 0");
  EXPECT_EQ(hpk_cross_entropy_combine(&ce, all.data(), 1, loss.data(), nullptr, &err), HPK_ERROR_NULL_POINTER);
  EXPECT_STREQ(err.message, "hpk_cross_entropy_combine: expected saved to point at data, got NULL");
  std::vector<float> grad(24);
  EXPECT_EQ(hpk_cross_entropy_backward(&ce, saved.data(), loss.data(), const_cast<void*>(ce.logits.data), 7, &err),
            HPK_ERROR_SHAPE);
  EXPECT_STREQ(err.message,
               "hpk_cross_entropy_backward: grad_logits is the logits' memory: expected its row stride to be theirs "
               "(6), got 7");
  hpk_logprobs lp;
  hpk_logprobs_init(&lp);
  lp.logits = piece_of(s.logits, 0, 1);
  lp.target = s.target.const_data_ptr();
  lp.temperature = 1e-40;
  EXPECT_EQ(hpk_logprobs_stats(&lp, all.data(), &err), HPK_ERROR_OPTION);
  EXPECT_STREQ(err.message,
               "hpk_logprobs_stats: expected temperature > 0 with 1 / temperature finite in the compute type "
               "(float32), got 1e-40");
  lp.temperature = 1;
  EXPECT_EQ(hpk_logprobs_backward(&lp, saved.data(), loss.data(), loss.data(), grad.data(), 0, &err), HPK_ERROR_OPTION);
  EXPECT_STREQ(err.message,
               "hpk_logprobs_backward: an entropy gradient needs the entropy: expected lp->entropy set (as in "
               "forward), got 0");
  EXPECT_EQ(hpk_set_num_threads(-1, &err), HPK_ERROR_OPTION);
  EXPECT_STREQ(err.message, "hpk_set_num_threads: expected threads >= 1 (or 0: OpenMP's own), got -1");
  EXPECT_EQ(hpk_cross_entropy_stats(&ce, all.data(), &err), HPK_OK);
  EXPECT_EQ(err.code, HPK_OK);
  EXPECT_STREQ(err.message, "");
}

// The library's version and the kernel variant it runs: the one libhyper_parallel's dispatch
// picks on this CPU (both ask the CPU the same way; ATEN_CPU_CAPABILITY caps both).
TEST(LossKernelsCApi, ReportsItsVersionAndTheVariantLibHyperParallelRunsToo) {
  EXPECT_TRUE(std::regex_match(hpk_version(), std::regex("[0-9]+\\.[0-9]+\\.[0-9]+"))) << hpk_version();
  EXPECT_STREQ(hpk_capability(), hyper_parallel::ce_kernel::capability_name());
  EXPECT_EQ(hpk_compute_dtype(HPK_BFLOAT16), HPK_FLOAT32);
  EXPECT_EQ(hpk_compute_dtype(HPK_FLOAT64), HPK_FLOAT64);
  EXPECT_EQ(hpk_compute_dtype(HPK_INT64), -1);
  EXPECT_EQ(hpk_dtype_size(HPK_FLOAT16), 2);
  std::cout << "[ kernels  ] libhyper_parallel_kernels " << hpk_version() << ", variant " << hpk_capability()
            << std::endl;
}

}  // namespace loss_kernels_c_api_test
