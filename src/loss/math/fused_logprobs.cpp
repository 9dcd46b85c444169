// fused_logprobs.h: log-probabilities and entropy from the fused cross-entropy's statistics.
#include "loss/math/fused_logprobs.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <cmath>

#include "dtensor/dtensor_impl.h"
#include "loss/kernel/cross_entropy_combine.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/call/loss_input_checks.h"

namespace hyper_parallel {

namespace k = ce_kernel;

LossCallRecord logprobs_call(const std::string& op, int64_t rows, at::ScalarType dtype,
                             const LogprobsOptions& options) {
  LossCallRecord call;
  call.op = op;
  call.rows = rows;
  call.dtype = static_cast<int64_t>(dtype);
  call.definition.ignore_index = options.ignore_index;
  call.temperature = options.temperature;
  call.entropy = options.return_entropy;
  return call;
}

void check_logprobs_options(const LogprobsOptions& o, const std::string& op, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(std::isfinite(o.temperature) && o.temperature > 0, op,
                    ": temperature must be a finite number > 0, got ", o.temperature);
  // The kernels scale by 1 / T in the compute type: below 1 / FLT_MAX (~2.9e-39) it overflows
  // float, and every scaled difference would be inf or NaN.
  const bool in_float = compute_type(dtype) != at::kDouble;
  const double inv_t = 1.0 / o.temperature;
  TORCH_CHECK_VALUE(in_float ? std::isfinite(static_cast<float>(inv_t)) : std::isfinite(inv_t), op, ": temperature ",
                    o.temperature, " is too small for ", dtype, " logits: 1 / T overflows ",
                    in_float ? "float32, their compute type (T >= 2.9e-39 is fine; float64 logits take T >= 5.6e-309)"
                             : "float64 (T >= 5.6e-309 is fine)");
  check_block_sizes(o.chunk_tokens, o.vocab_block, op);
}

at::Tensor logprobs_target(const at::Tensor& target, c10::IntArrayRef shape, int64_t vocab, int64_t ignore_index,
                           const std::string& op) {
  if (target.is_floating_point()) {
    throw LossParallelUnsupportedError(op +
                                       ": expected the sampled tokens as class indices, got a floating-point "
                                       "target (probability targets have no log-probability of one token)");
  }
  check_index_target_dtype(target, op, OptionErrorKind::value_error);
  check_no_target_or_weight_grad(target, c10::nullopt, op);
  TORCH_CHECK_VALUE(target.sizes() == shape, op, ": expected a target of shape ", shape,
                    " (one class per row of the logits), got ", target.sizes());
  check_targets(target, vocab, ignore_index);
  return target.reshape({-1}).to(at::kLong);
}

namespace {

// fused_logprobs_combine on the CPU: the raw-array combine (cross_entropy_combine.h) on the
// gathered statistics. Sets what the tensor combine sets.
LogprobsRows logprobs_combine_with_kernel(FusedCrossEntropy& ce, const at::Tensor& gathered) {
  const at::Tensor all = gathered.contiguous();
  const int64_t rows = all.size(2);
  const auto opts = all.options();
  const at::Tensor valid = ce.valid.to(at::kByte).contiguous();
  const at::Tensor mean_difference = at::empty({rows}, opts);
  LogprobsRows out;
  out.logprobs = at::empty({rows}, opts);
  if (ce.entropy_sum) out.entropy = at::empty({rows}, opts);
  ce.row_max = at::empty({rows}, opts);
  ce.log_sum = at::empty({rows}, opts);
  AT_DISPATCH_FLOATING_TYPES(all.scalar_type(), "fused log-probabilities combine", [&] {
    k::LogprobsCombineArgs<scalar_t> args;
    args.all = all.const_data_ptr<scalar_t>();
    args.ranks = all.size(0);
    args.rows = rows;
    args.valid = valid.const_data_ptr<uint8_t>();
    args.temperature = ce.temperature;
    args.entropy = ce.entropy_sum;
    args.logprobs = out.logprobs.data_ptr<scalar_t>();
    args.entropy_rows = ce.entropy_sum ? out.entropy.data_ptr<scalar_t>() : nullptr;
    args.mean_difference = mean_difference.data_ptr<scalar_t>();
    args.row_max = ce.row_max.data_ptr<scalar_t>();
    args.log_sum = ce.log_sum.data_ptr<scalar_t>();
    k::logprobs_combine(args);
  });
  ce.lse = ce.row_max + ce.log_sum;
  // Without the entropy mu stays undefined: backward then refuses an entropy gradient.
  if (ce.entropy_sum) out.mean_difference = mean_difference;
  return out;
}

}  // namespace

LogprobsRows fused_logprobs_combine(FusedCrossEntropy& ce, const at::Tensor& stats, const ClassShard& shard,
                                    const InputAgreement* agreement) {
  const at::Tensor all = all_gather_stats(stats, shard, agreement);
  if (combines_with_kernel(all)) return logprobs_combine_with_kernel(ce, all);
  const at::Tensor sum_exp = combine_log_sum_exp(ce, all);
  const at::Tensor valid = ce.valid.to(at::kBool);
  auto or_zero = [&](const at::Tensor& t) { return at::where(valid, t, at::zeros_like(t)); };
  // The cross-entropy's (M - y_t) + L, negated: equal to its -loss bit for bit at T = 1.
  const at::Tensor target_logit = all.select(1, k::kV1).sum(0);
  LogprobsRows rows;
  rows.logprobs = or_zero(-(scaled_difference(ce.row_max - target_logit, ce.temperature) + ce.log_sum));
  if (ce.entropy_sum) {
    const at::Tensor w = rebased_entropy_sum(all.select(1, k::kV2), all.select(1, k::kSumExp), all.select(1, k::kMax),
                                             ce.row_max, ce.temperature)
                             .sum(0);
    rows.mean_difference = or_zero(w / sum_exp);
    rows.entropy = or_zero(ce.log_sum - rows.mean_difference);
  }
  return rows;
}

Logprobs replicated_on(const DeviceMesh& mesh, Logprobs out) {
  const Layout replicated(mesh, Placements(mesh.ndim(), Placement::replicate()), out.logprobs.sizes().vec());
  out.logprobs = make_dtensor(out.logprobs, replicated);
  if (out.entropy.defined()) out.entropy = make_dtensor(out.entropy, replicated);
  return out;
}

Logprobs logprobs_results(const FusedCrossEntropy& ce, const LogprobsRows& combined, at::ScalarType dtype,
                          c10::IntArrayRef shape, int64_t vocab_size, LogprobsSaved* saved) {
  Logprobs out;
  out.logprobs = combined.logprobs.to(dtype).reshape(shape);
  if (combined.entropy.defined()) out.entropy = combined.entropy.to(dtype).reshape(shape);
  if (saved) {
    saved->row_max = ce.row_max;
    saved->log_sum = ce.log_sum;
    saved->mean_difference = combined.mean_difference;
    saved->vocab_size = vocab_size;
  }
  return out;
}

FusedCrossEntropyCoefficients fused_logprobs_coefficients(const FusedCrossEntropy& ce,
                                                          const at::Tensor& mean_difference,
                                                          const at::Tensor& grad_logprobs,
                                                          const at::Tensor& grad_entropy) {
  const at::Tensor valid = ce.valid.to(at::kBool);
  const double inv_t = 1.0 / ce.temperature;
  const auto opts = ce.row_max.options();
  // Per row, in terms of d_j = (x_j - M) / T (each then times 1/T):
  //   g_lp [j = t] + p_j (a + e d_j), a = -g_lp + g_H mu, e = -g_H (fused_logprobs.h).
  auto per_row = [&](const at::Tensor& g) {
    if (!g.defined()) return at::zeros_like(ce.row_max);
    const at::Tensor rows = g.reshape({-1}).to(opts.dtype());
    return at::where(valid, rows, at::zeros_like(rows));
  };
  const at::Tensor g_lp = per_row(grad_logprobs), g_h = per_row(grad_entropy);
  FusedCrossEntropyCoefficients co;
  co.t = (-inv_t * g_lp).contiguous();
  co.a = co.t;
  if (grad_entropy.defined()) {
    TORCH_CHECK(mean_difference.defined(),
                "vocab_parallel_logprobs backward: an entropy gradient for a forward that did not ",
                "compute the entropy");
    co.a = (co.a + inv_t * g_h * mean_difference).contiguous();
    co.e = (-inv_t * g_h).contiguous();
  }
  return co;
}

}  // namespace hyper_parallel
