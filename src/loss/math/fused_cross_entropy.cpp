#include "loss/math/fused_cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/core/Reduction.h>
#include <c10/util/Exception.h>

#include <limits>

#include "loss/kernel/cross_entropy_combine.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"
#if defined(HP_CE_HAVE_CUDA)
#include "loss/kernel/cross_entropy_cuda_kernel.h"
#endif
#include "loss/math/gradient_buffer.h"

namespace hyper_parallel {

namespace {

namespace k = ce_kernel;

// The kernel reads rows with a unit class stride; anything else is copied once.
at::Tensor unit_class_stride(const at::Tensor& rows) {
  return rows.size(1) <= 1 || rows.stride(1) == 1 ? rows : rows.contiguous();
}

int64_t row_stride(const at::Tensor& rows) { return rows.size(0) <= 1 ? rows.size(1) : rows.stride(0); }

const void* ptr_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }

thread_local bool aten_for_testing = false;

// Whether x's device has a kernel of its own for `ce` (else the ATen-op path below runs). The
// CUDA kernel has no temperature or entropy sum.
bool has_kernel(const FusedCrossEntropy& ce, const at::Tensor& x) {
  if (aten_for_testing) return false;
#if defined(HP_CE_HAVE_CUDA)
  if (x.is_cuda()) return ce.temperature == 1.0 && !ce.entropy_sum;
#endif
  return x.device().is_cpu();
}

// Devices without a dedicated kernel: the same statistics and gradient with ATen ops,
// rows in blocks so that temporaries stay near 4 M elements.
template <typename Fn>
void for_aten_row_blocks(int64_t rows, int64_t cols, Fn&& fn) {
  const int64_t step = std::max<int64_t>(1, (int64_t{1} << 22) / std::max<int64_t>(1, cols));
  for (int64_t r0 = 0; r0 < rows; r0 += step) fn(r0, std::min(step, rows - r0));
}

at::Tensor capped(const at::Tensor& x, double cap) { return cap > 0 ? (x / cap).tanh_().mul_(cap) : x; }

// running_logsumexp.h's relative sums on tensors: the reference a max gives (0 where the max
// is not finite), and V = sum u (y - reference of m) moved to reference ref.
at::Tensor relative_sum_reference(const at::Tensor& m) { return at::where(at::isfinite(m), m, at::zeros_like(m)); }
at::Tensor rebased_relative_sum(const at::Tensor& v, const at::Tensor& u, const at::Tensor& m, const at::Tensor& ref) {
  const at::Tensor shift = (relative_sum_reference(m) - ref) * u;
  return v + at::where(u.ne(0), shift, at::zeros_like(shift));
}

// One block's slice of the per-row and per-class inputs: rows [r0, r0 + n), local classes
// [c0, c0 + nc). Target columns become block-local (-1 where the target lies outside).
struct BlockView {
  at::Tensor target_col, q, w;
};

BlockView block_view(const FusedCrossEntropy& ce, int64_t r0, int64_t n, int64_t c0, int64_t nc,
                     const ClassShard& shard) {
  BlockView v;
  if (ce.soft) {
    v.q = ce.q.narrow(0, r0, n).narrow(1, c0, nc);
  } else {
    v.target_col = ce.target_col.narrow(0, r0, n);
    if (c0 != 0 || nc != shard.local) {
      const at::Tensor& t = v.target_col;
      v.target_col = at::where(t.ge(c0).logical_and(t.lt(c0 + nc)), t - c0, at::full_like(t, -1)).contiguous();
    }
  }
  if (ce.weight) v.w = ce.weight->narrow(0, shard.offset + c0, nc).contiguous();
  return v;
}

void forward_stats_aten(const FusedCrossEntropy& ce, const at::Tensor& x, const BlockView& v, at::Tensor& stats,
                        double q_scale, double q_shift) {
  const at::ScalarType ct = stats.scalar_type();
  const at::Tensor& w = v.w;
  // The label-smoothing weight of every row: a 0-dim tensor, so that no block waits for the
  // device (an .item() here was a host sync per block on CUDA).
  const at::Tensor weight_sum = w.defined() && ce.definition.label_smoothing > 0 && !ce.soft ? w.sum() : at::Tensor();
  for_aten_row_blocks(x.size(0), x.size(1), [&](int64_t r0, int64_t n) {
    const at::Tensor y = capped(x.narrow(0, r0, n).to(ct), ce.definition.logit_softcap);
    const at::Tensor m = y.amax(1);
    const at::Tensor shift = at::where(at::isneginf(m), at::zeros_like(m), m);
    // (y - max) / T, the kernel's d (cross_entropy_cpu_kernel_impl.h: why not y / T - max / T).
    const at::Tensor d = scaled_difference(y - shift.unsqueeze(1), ce.temperature);
    stats[k::kMax].narrow(0, r0, n).copy_(m);
    stats[k::kSumExp].narrow(0, r0, n).copy_(d.exp().sum(1));
    // kV2 relative to the row's max (running_logsumexp.h), with its weight kU.
    const at::Tensor relative_y = y - relative_sum_reference(m).unsqueeze(1);
    if (ce.soft) {
      at::Tensor wq = v.q.narrow(0, r0, n) * q_scale + q_shift;
      if (w.defined()) wq = wq * w.unsqueeze(0);
      stats[k::kV1].narrow(0, r0, n).copy_(wq.sum(1));
      stats[k::kV2].narrow(0, r0, n).copy_((wq * relative_y).sum(1));
      stats[k::kU].narrow(0, r0, n).copy_(wq.sum(1));
    } else {
      const at::Tensor col = v.target_col.narrow(0, r0, n);
      const at::Tensor picked = y.gather(1, col.clamp_min(0).unsqueeze(1)).squeeze(1);
      stats[k::kV1].narrow(0, r0, n).copy_(at::where(col.ge(0), picked, at::zeros_like(picked)));
      if (ce.entropy_sum) {
        // d clamped as the kernel clamps it (cross_entropy_cpu_kernel_impl.h: a -inf logit).
        stats[k::kV2].narrow(0, r0, n).copy_((d.exp() * d.clamp_min(-1000.0)).sum(1));
        stats[k::kU].narrow(0, r0, n).zero_();
      } else if (ce.definition.label_smoothing > 0) {
        stats[k::kV2].narrow(0, r0, n).copy_((w.defined() ? relative_y * w.unsqueeze(0) : relative_y).sum(1));
        at::Tensor u = stats[k::kU].narrow(0, r0, n);
        if (weight_sum.defined()) {
          u.fill_(weight_sum);
        } else {
          u.fill_(static_cast<double>(y.size(1)));
        }
      } else {
        stats[k::kV2].narrow(0, r0, n).zero_();
        stats[k::kU].narrow(0, r0, n).zero_();
      }
    }
  });
}

using Coefficients = FusedCrossEntropyCoefficients;

Coefficients coefficients(const FusedCrossEntropy& ce, const at::Tensor& g_rows, const ClassShard& shard) {
  const double eps = ce.definition.label_smoothing;
  const double C = static_cast<double>(shard.total);
  at::Tensor sc = g_rows, sz = g_rows;
  if (ce.definition.reduction == at::Reduction::Mean) {
    sc = sc / ce.ce_denominator;
    sz = sz / ce.z_denominator;
  }
  // Ignored rows get exactly 0, even when a mean divided by a total weight of 0.
  sc = at::where(ce.valid.to(at::kBool), sc, at::zeros_like(sc));
  sz = at::where(ce.valid.to(at::kBool), sz, at::zeros_like(sz));
  Coefficients k;
  if (ce.soft) {
    k.a = sc * ce.row_weight;
    k.c = sc * (1 - eps);
  } else {
    k.a = sc * ((1 - eps) * ce.row_weight);
    if (eps > 0) {
      const at::Tensor W = ce.weight ? ce.weight->sum() : at::scalar_tensor(C, sc.options());
      k.a = k.a + sc * ((eps / C) * W);
    }
    k.t = sc * ((1 - eps) * ce.row_weight);
  }
  if (eps > 0) k.b = sc * (eps / C);
  if (ce.definition.z_loss_weight != 0) k.a = k.a + sz * (2 * ce.definition.z_loss_weight) * ce.lse;
  for (at::Tensor* p : {&k.a, &k.b, &k.c, &k.t}) {
    if (p->defined()) *p = p->contiguous();
  }
  return k;
}

// fused_cross_entropy_combine on the CPU: the raw-array combine (cross_entropy_combine.h) on
// the gathered statistics, which also gives the gradient's coefficients for a unit incoming
// gradient. Sets what the tensor combine sets.
at::Tensor combine_with_kernel(FusedCrossEntropy& ce, const at::Tensor& gathered, const ClassShard& shard) {
  const at::Tensor all = gathered.contiguous();
  const int64_t rows = all.size(2);
  const auto opts = all.options();
  const double eps = ce.definition.label_smoothing;
  const bool none = ce.definition.reduction == at::Reduction::None;
  at::Tensor loss = none ? at::empty({rows}, opts) : at::empty({}, opts);
  ce.row_max = at::empty({rows}, opts);
  ce.log_sum = at::empty({rows}, opts);
  const at::Tensor unit = at::empty({4, rows}, opts);  // a, b, c, t
  const at::Tensor valid = ce.valid.to(at::kByte).contiguous();
  const at::Tensor row_weight = ce.soft ? at::empty({rows}, opts) : ce.row_weight.contiguous();
  // Label smoothing's W = sum_c w_c, as the tensor coefficients take it (in the compute type).
  const double weight_sum =
      ce.weight && eps > 0 && !ce.soft ? ce.weight->sum().item<double>() : static_cast<double>(shard.total);
  AT_DISPATCH_FLOATING_TYPES(all.scalar_type(), "fused cross-entropy combine", [&] {
    k::CrossEntropyCombineArgs<scalar_t> args;
    args.all = all.const_data_ptr<scalar_t>();
    args.ranks = all.size(0);
    args.rows = rows;
    args.probabilities = ce.soft;
    args.valid = valid.const_data_ptr<uint8_t>();
    args.classes = shard.total;
    args.weight_sum = weight_sum;
    args.label_smoothing = eps;
    args.z_loss_weight = ce.definition.z_loss_weight;
    args.reduction = ce.definition.reduction;
    if (ce.soft) {
      args.target_weight_sum = row_weight.data_ptr<scalar_t>();
    } else {
      args.row_weight = row_weight.const_data_ptr<scalar_t>();
    }
    args.loss = loss.data_ptr<scalar_t>();
    args.row_max = ce.row_max.data_ptr<scalar_t>();
    args.log_sum = ce.log_sum.data_ptr<scalar_t>();
    args.a = unit[0].data_ptr<scalar_t>();
    args.b = unit[1].data_ptr<scalar_t>();
    args.c = unit[2].data_ptr<scalar_t>();
    args.t = unit[3].data_ptr<scalar_t>();
    k::cross_entropy_combine(args);
  });
  ce.lse = ce.row_max + ce.log_sum;
  if (ce.soft) {
    ce.row_weight = row_weight;  // A = sum_c w_c q'_c
    ce.ce_denominator = at::scalar_tensor(static_cast<double>(rows), opts);
    ce.z_denominator = ce.ce_denominator;
  } else {
    ce.ce_denominator = ce.row_weight.sum();
    ce.z_denominator = ce.valid.sum();
  }
  // The kernel writes every coefficient; the ones that are 0 by the options stay undefined,
  // as the tensor coefficients leave them (the backward kernel then skips them).
  Coefficients& co = ce.unit_coefficients;
  co = Coefficients{};
  co.a = unit[0];
  if (eps > 0) co.b = unit[1];
  if (ce.soft) co.c = unit[2];
  if (!ce.soft) co.t = unit[3];
  return loss;
}

// The block's rows of a per-row array (undefined stays undefined).
at::Tensor rows_of(const at::Tensor& t, int64_t r0, int64_t n) { return t.defined() ? t.narrow(0, r0, n) : t; }

void backward_aten(const FusedCrossEntropy& ce, const at::Tensor& x, const at::Tensor& out, const Coefficients& co,
                   const BlockView& v, const at::Tensor& row_max, const at::Tensor& log_sum) {
  const at::ScalarType ct = row_max.scalar_type();
  const at::Tensor& w = v.w;
  for_aten_row_blocks(x.size(0), x.size(1), [&](int64_t r0, int64_t n) {
    auto rows = [&](const at::Tensor& t) { return t.narrow(0, r0, n).unsqueeze(1); };
    const at::Tensor xc = x.narrow(0, r0, n).to(ct);
    // cap' from the tanh itself (cross_entropy_cpu_kernel_impl.h says why).
    const at::Tensor th = ce.definition.logit_softcap > 0 ? (xc / ce.definition.logit_softcap).tanh_() : at::Tensor();
    const at::Tensor y = ce.definition.logit_softcap > 0 ? th * ce.definition.logit_softcap : xc;
    const at::Tensor d = scaled_difference(y - rows(row_max), ce.temperature);
    at::Tensor g = (d - rows(log_sum)).exp_();
    if (co.e.defined()) {
      // p (a + e d), d clamped as the kernel clamps it (a -inf logit has p = 0).
      g.mul_(d.clamp_min(-1000.0).mul_(rows(co.e)).add_(rows(co.a)));
    } else {
      g.mul_(rows(co.a));
    }
    if (co.b.defined() || co.c.defined()) {
      at::Tensor sub = co.b.defined() ? rows(co.b) : at::zeros({n, 1}, g.options());
      if (co.c.defined()) sub = sub + rows(co.c) * v.q.narrow(0, r0, n);
      g.sub_(w.defined() ? sub * w.unsqueeze(0) : sub);
    }
    if (co.t.defined()) {
      const at::Tensor col = v.target_col.narrow(0, r0, n);
      const at::Tensor hit = at::where(col.ge(0), co.t.narrow(0, r0, n), at::zeros_like(co.t.narrow(0, r0, n)));
      g.scatter_add_(1, col.clamp_min(0).unsqueeze(1), -hit.unsqueeze(1));
    }
    if (ce.definition.logit_softcap > 0) g.mul_(1 - th.square());
    out.narrow(0, r0, n).copy_(g);
  });
}

// The incoming gradient as one value per row.
at::Tensor per_row(const at::Tensor& g, int64_t rows, int64_t reduction) {
  return reduction == at::Reduction::None ? g.reshape({-1}) : g.reshape({}).expand({rows});
}

}  // namespace

void fused_cross_entropy_prepare(FusedCrossEntropy& ce, int64_t rows, const ClassShard& shard,
                                 const at::TensorOptions& opts) {
  const at::ScalarType ct = opts.dtype().toScalarType();
  if (ce.soft) {
    ce.q = unit_class_stride(ce.target.to(ct));
    ce.valid = at::ones({rows}, opts);
    return;
  }
  const at::Tensor& t = ce.target;
  const at::Tensor valid = t.ne(ce.definition.ignore_index);
  const at::Tensor owned = valid.logical_and(t.ge(shard.offset)).logical_and(t.lt(shard.offset + shard.local));
  ce.target_col = at::where(owned, t - shard.offset, at::full_like(t, -1)).contiguous();
  ce.valid = valid.to(ct);
  if (ce.weight) {
    at::Tensor idx = at::where(valid, t, at::zeros_like(t)).clamp(0, shard.total - 1);
    ce.row_weight = ce.weight->index_select(0, idx) * ce.valid;
  } else {
    ce.row_weight = ce.valid;
  }
}

at::Tensor fused_cross_entropy_block_stats(const FusedCrossEntropy& ce, const at::Tensor& x_in, int64_t r0, int64_t c0,
                                           const ClassShard& shard) {
  const at::Tensor x = unit_class_stride(x_in);
  const int64_t n = x.size(0), nc = x.size(1);
  const at::ScalarType ct = compute_type(x.scalar_type());
  at::Tensor stats = at::empty({k::kStats, n}, x.options().dtype(ct));
  if (nc == 0) {
    // An empty piece (more ranks than classes): -inf max, nothing summed.
    stats.zero_();
    stats[k::kMax].fill_(-std::numeric_limits<double>::infinity());
    return stats;
  }
  if (n == 0) return stats;
  const double eps = ce.definition.label_smoothing;
  const double C = static_cast<double>(shard.total);
  const BlockView v = block_view(ce, r0, n, c0, nc, shard);
  // The relative sums of smoothing and probability targets are kept in the logits' units.
  TORCH_INTERNAL_ASSERT(ce.temperature == 1.0 || (!ce.soft && eps == 0),
                        "fused cross-entropy: a temperature only for index targets without label smoothing");
  if (!has_kernel(ce, x)) {
    forward_stats_aten(ce, x, v, stats, 1 - eps, eps / C);
    return stats;
  }
  k::ForwardArgs args;
  args.dtype = x.scalar_type();
  args.x = x.const_data_ptr();
  args.rows = n;
  args.cols = nc;
  args.ldx = row_stride(x);
  args.logit_softcap = ce.definition.logit_softcap;
  args.inv_temperature = 1.0 / ce.temperature;
  args.entropy_sum = ce.entropy_sum;
  args.weight = ptr_or_null(v.w);
  if (ce.soft) {
    args.q = v.q.const_data_ptr();
    args.ldq = row_stride(v.q);
    args.q_scale = 1 - eps;
    args.q_shift = eps / C;
  } else {
    args.target_col = v.target_col.const_data_ptr<int64_t>();
    args.smoothing_sum = eps > 0;
  }
  args.stats = stats.data_ptr();
#if defined(HP_CE_HAVE_CUDA)
  if (x.is_cuda())
    k::cuda_forward_stats(args, x.device().index());
  else
    k::forward_stats(args);
#else
  k::forward_stats(args);
#endif
  return stats;
}

void merge_block_stats(const FusedCrossEntropy& ce, at::Tensor& acc, const at::Tensor& block) {
  const at::Tensor m1 = acc[k::kMax], m2 = block[k::kMax];
  const at::Tensor top = at::maximum(m1, m2);
  // Rows whose max is -inf in both have nothing summed: shift them by 0, not by -inf. (Not
  // +inf: exp(inf - inf) must make the sum NaN, as ATen's does.)
  const at::Tensor shift = at::where(at::isneginf(top), at::zeros_like(top), top);
  // kV2 from both halves before kSumExp is merged (the entropy sum is rebased with it).
  at::Tensor v2;
  if (ce.entropy_sum) {
    v2 = rebased_entropy_sum(acc[k::kV2], acc[k::kSumExp], m1, shift, ce.temperature) +
         rebased_entropy_sum(block[k::kV2], block[k::kSumExp], m2, shift, ce.temperature);
  } else {
    const at::Tensor ref = relative_sum_reference(top);
    v2 = rebased_relative_sum(acc[k::kV2], acc[k::kU], m1, ref) +
         rebased_relative_sum(block[k::kV2], block[k::kU], m2, ref);
  }
  acc[k::kSumExp].copy_(acc[k::kSumExp] * scaled_difference(m1 - shift, ce.temperature).exp() +
                        block[k::kSumExp] * scaled_difference(m2 - shift, ce.temperature).exp());
  acc[k::kV2].copy_(v2);
  acc[k::kMax].copy_(top);
  acc[k::kV1].add_(block[k::kV1]);
  acc[k::kU].add_(block[k::kU]);
}

at::Tensor rebased_entropy_sum(const at::Tensor& h, const at::Tensor& s, const at::Tensor& m, const at::Tensor& shift,
                               double temperature) {
  // g clamped in the product as the kernel clamps d: exp(g) is 0 below it, and an overflowing
  // g (a tiny T) times that 0 would be NaN.
  const at::Tensor g = scaled_difference(m - shift, temperature);
  const at::Tensor moved = (h + g.clamp_min(-1000.0) * s) * g.exp();
  return at::where(at::isneginf(m), at::zeros_like(moved), moved);
}

at::Tensor scaled_difference(const at::Tensor& difference, double temperature) {
  return temperature == 1.0 ? difference : difference * (1.0 / temperature);
}

at::Tensor all_gather_stats(const at::Tensor& stats, const ClassShard& shard, const InputAgreement* agreement) {
  const int64_t rows = stats.size(1);
  const auto opts = stats.options();
  // The statistics and, after them, this rank's input-agreement record (when given).
  at::Tensor sent = stats.reshape({-1});
  if (agreement) {
    const at::Tensor record = at::empty({InputAgreement::kRecordSize}, opts);
    agreement->write_record(record);
    sent = at::cat({sent, record});
  }
  // The forward's one collective: every rank's per-row statistics (and record), [P, ...].
  const at::Tensor gathered =
      shard.comm ? shard.comm->all_gather(sent.unsqueeze(0), 0, std::vector<int64_t>(shard.comm->size(), 1))
                 : sent.unsqueeze(0);
  if (agreement) agreement->settle(gathered.narrow(1, k::kStats * rows, InputAgreement::kRecordSize), shard.comm);
  return gathered.narrow(1, 0, k::kStats * rows).view({gathered.size(0), k::kStats, rows});
}

bool combines_with_kernel(const at::Tensor& all) { return all.device().is_cpu() && !aten_for_testing; }

at::Tensor combine_log_sum_exp(FusedCrossEntropy& ce, const at::Tensor& all) {
  const at::Tensor m = all.select(1, k::kMax), s = all.select(1, k::kSumExp);
  at::Tensor top = m.amax(0);
  // Rows whose max is -inf (all -inf) would give nan in m - top; shift them by 0. A +inf max
  // stays: exp(inf - inf) makes the row NaN, as ATen's exp(x - max) does.
  top = at::where(at::isneginf(top), at::zeros_like(top), top);
  ce.row_max = top.contiguous();
  const at::Tensor sum_exp = (s * scaled_difference(m - top, ce.temperature).exp()).sum(0);
  ce.log_sum = sum_exp.log();
  ce.lse = ce.row_max + ce.log_sum;
  return sum_exp;
}

at::Tensor fused_cross_entropy_combine(FusedCrossEntropy& ce, const at::Tensor& stats, const ClassShard& shard,
                                       const InputAgreement* agreement) {
  const int64_t rows = stats.size(1);
  const auto opts = stats.options();
  const double eps = ce.definition.label_smoothing;
  const double C = static_cast<double>(shard.total);
  const at::Tensor all = all_gather_stats(stats, shard, agreement);
  ce.unit_coefficients = Coefficients{};
  // The raw combine knows no temperature or entropy sum (the log-probabilities' statistics).
  if (combines_with_kernel(all) && ce.temperature == 1.0 && !ce.entropy_sum) return combine_with_kernel(ce, all, shard);
  combine_log_sum_exp(ce, all);
  const at::Tensor m = all.select(1, k::kMax);
  const at::Tensor top = ce.row_max;
  const at::Tensor v1 = all.select(1, k::kV1).sum(0), u = all.select(1, k::kU);
  // sum_c u_c (y_c - ref) over all classes, ref = the global max (running_logsumexp.h).
  const at::Tensor v2 = rebased_relative_sum(all.select(1, k::kV2), u, m, relative_sum_reference(top)).sum(0);
  const at::Tensor u_all = u.sum(0);

  const at::Tensor valid_b = ce.valid.to(at::kBool);
  at::Tensor ce_rows;
  if (ce.soft) {
    ce.row_weight = v1;  // A = sum_c w_c q'_c
    // -sum_c w_c q'_c log p_c = A log_sum - sum_c w_c q'_c (y_c - max)
    ce_rows = u_all * ce.log_sum - v2;
    ce.ce_denominator = at::scalar_tensor(static_cast<double>(rows), opts);
    ce.z_denominator = ce.ce_denominator;
  } else {
    // -log p_t = (M - y_t) + log_sum: M - y_t is exact near the max (v1: the target's y).
    ce_rows = (1 - eps) * ce.row_weight * ((ce.row_max - v1) + ce.log_sum);
    if (eps > 0) {
      // -sum_c w_c log p_c = W log_sum - sum_c w_c (y_c - max), W = sum_c w_c
      ce_rows = ce_rows + (eps / C) * (u_all * ce.log_sum - v2);
    }
    ce_rows = at::where(valid_b, ce_rows, at::zeros_like(ce_rows));
    ce.ce_denominator = ce.row_weight.sum();
    ce.z_denominator = ce.valid.sum();
  }
  at::Tensor z_rows;
  if (ce.definition.z_loss_weight != 0) {
    z_rows = at::where(valid_b, ce.definition.z_loss_weight * ce.lse * ce.lse, at::zeros_like(ce.lse));
  }
  if (ce.definition.reduction == at::Reduction::None) return z_rows.defined() ? ce_rows + z_rows : ce_rows;
  at::Tensor loss = ce_rows.sum();
  at::Tensor z = z_rows.defined() ? z_rows.sum() : at::Tensor();
  if (ce.definition.reduction == at::Reduction::Mean) {
    loss = loss / ce.ce_denominator;
    if (z.defined()) z = z / ce.z_denominator;
  }
  return z.defined() ? loss + z : loss;
}

FusedCrossEntropyCoefficients fused_cross_entropy_coefficients(const FusedCrossEntropy& ce, const at::Tensor& grad_loss,
                                                               const ClassShard& shard) {
  const int64_t rows = ce.lse.size(0);
  return coefficients(ce, per_row(grad_loss.to(ce.lse.scalar_type()), rows, ce.definition.reduction).contiguous(),
                      shard);
}

void fused_cross_entropy_block_gradient(const FusedCrossEntropy& ce, const Coefficients& co, const at::Tensor& x,
                                        const at::Tensor& out, int64_t r0, int64_t c0, const ClassShard& shard) {
  const int64_t n = x.size(0), nc = x.size(1);
  if (n == 0 || nc == 0) return;
  TORCH_CHECK(nc <= 1 || (x.stride(1) == 1 && out.stride(1) == 1),
              "fused cross-entropy: gradient blocks need a unit class stride");
  const BlockView v = block_view(ce, r0, n, c0, nc, shard);
  const Coefficients b{rows_of(co.a, r0, n), rows_of(co.b, r0, n), rows_of(co.c, r0, n), rows_of(co.t, r0, n),
                       rows_of(co.e, r0, n)};
  const at::Tensor row_max = ce.row_max.narrow(0, r0, n), log_sum = ce.log_sum.narrow(0, r0, n);
  if (!has_kernel(ce, x)) return backward_aten(ce, x, out, b, v, row_max, log_sum);
  k::BackwardArgs args;
  args.dtype = x.scalar_type();
  args.x = x.const_data_ptr();
  args.out = out.data_ptr();
  args.rows = n;
  args.cols = nc;
  args.ldx = row_stride(x);
  args.ldo = row_stride(out);
  args.logit_softcap = ce.definition.logit_softcap;
  args.inv_temperature = 1.0 / ce.temperature;
  args.row_max = row_max.const_data_ptr();
  args.log_sum = log_sum.const_data_ptr();
  args.a = b.a.const_data_ptr();
  args.b = ptr_or_null(b.b);
  args.e = ptr_or_null(b.e);
  args.c = ptr_or_null(b.c);
  args.t_coef = ptr_or_null(b.t);
  args.target_col = ce.soft ? nullptr : v.target_col.const_data_ptr<int64_t>();
  args.weight = ptr_or_null(v.w);
  if (ce.soft) {
    args.q = v.q.const_data_ptr();
    args.ldq = row_stride(v.q);
  }
#if defined(HP_CE_HAVE_CUDA)
  if (x.is_cuda()) return k::cuda_backward(args, x.device().index());
#endif
  k::backward(args);
}

at::Tensor fused_cross_entropy_forward(FusedCrossEntropy& ce, const ClassShard& shard, const InputAgreement* agreement,
                                       PendingCallAgreement* call) {
  const at::Tensor x = unit_class_stride(ce.x_rows);
  TORCH_CHECK(!ce.gradient_in_forward || x.is_same(ce.x_rows),
              "fused cross-entropy: gradient_in_forward needs logits rows with a unit class stride");
  const auto opts = x.options().dtype(compute_type(x.scalar_type()));
  const int64_t rows = x.size(0);
  fused_cross_entropy_prepare(ce, rows, shard, opts);
  // A rank that refused its inputs sends placeholder statistics: the agreement throws on
  // every rank before they are combined.
  const at::Tensor stats = agreement && agreement->refused() ? at::zeros({k::kStats, rows}, opts)
                                                             : fused_cross_entropy_block_stats(ce, x, 0, 0, shard);
  if (call) call->settle();
  const at::Tensor loss = fused_cross_entropy_combine(ce, stats, shard, agreement);
  if (ce.gradient_in_forward) {
    // d loss / d x for a unit incoming gradient, over the logits: backward only scales it.
    const Coefficients co = ce.unit_coefficients.a.defined()
                                ? ce.unit_coefficients
                                : coefficients(ce, per_row(at::ones({}, opts), rows, at::Reduction::Sum), shard);
    fused_cross_entropy_block_gradient(ce, co, x, x, 0, 0, shard);
    ce.grad_rows = x;
  }
  ce.unit_coefficients = Coefficients{};  // backward scales what forward wrote, or takes its own
  return loss;
}

at::Tensor fused_cross_entropy_backward(const FusedCrossEntropy& ce, const at::Tensor& grad_loss,
                                        const ClassShard& shard) {
  const at::ScalarType ct = compute_type(ce.x_rows.scalar_type());
  const int64_t rows = ce.x_rows.size(0);
  const at::Tensor g = per_row(grad_loss.to(ct), rows, ce.definition.reduction);
  if (ce.grad_rows.defined()) {
    at::Tensor grad = ce.grad_rows;
    // Usually the loss is the root (gradient 1): then nothing is left to do.
    if (ce.definition.reduction == at::Reduction::None) {
      if (!g.eq(1).all().item<bool>()) grad.mul_(g.unsqueeze(1));
    } else if (grad_loss.item<double>() != 1.0) {
      grad.mul_(grad_loss.to(ct).reshape({}));
    }
    return grad;
  }
  const at::Tensor x = unit_class_stride(ce.x_rows);
  at::Tensor out = x.device().is_cpu() ? reusable_gradient_buffer(rows, shard.local, x.scalar_type())
                                       : at::empty({rows, shard.local}, x.options());
  if (shard.local > 0 && rows > 0) {
    fused_cross_entropy_block_gradient(ce, coefficients(ce, g.contiguous(), shard), x, out, 0, 0, shard);
  }
  return out;
}

AtenStatisticsForTesting::AtenStatisticsForTesting() { aten_for_testing = true; }
AtenStatisticsForTesting::~AtenStatisticsForTesting() { aten_for_testing = false; }

void use_placeholder_inputs(FusedCrossEntropy& ce) {
  ce.soft = false;
  ce.weight = c10::nullopt;
  ce.target = at::full({ce.x_rows.size(0)}, ce.definition.ignore_index, ce.x_rows.options().dtype(at::kLong));
  ce.gradient_in_forward = false;
}

}  // namespace hyper_parallel
