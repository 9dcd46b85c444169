#include "loss/cross_entropy_kernels.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <c10/util/Exception.h>

#include <limits>

namespace hyper_parallel {

namespace {

at::Tensor max_over_classes(const at::Tensor& x_rows, const ClassShard& shard) {
  at::Tensor m;
  if (shard.local == 0) {
    // An empty piece (more ranks than classes) contributes -inf to the max.
    m = at::full({x_rows.size(0)}, -std::numeric_limits<double>::infinity(),
                 x_rows.options().dtype(compute_type(x_rows.scalar_type())));
  } else {
    m = x_rows.amax(1).to(compute_type(x_rows.scalar_type()));
  }
  shard.comm->all_reduce_(m, ReduceOp::Max);
  return m;
}

// Owned targets: mask, local column (0 where not owned), and validity (not ignored).
struct Targets {
  at::Tensor valid, owned, local_col;
};

Targets split_targets(const at::Tensor& target, int64_t ignore_index, const ClassShard& shard) {
  Targets t;
  t.valid = target.ne(ignore_index);
  t.owned = t.valid.logical_and(target.ge(shard.offset)).logical_and(target.lt(shard.offset + shard.local));
  t.local_col = at::where(t.owned, target - shard.offset, at::zeros_like(target));
  return t;
}

// w[t] for valid targets, 0 for ignored ones, in `dtype`.
at::Tensor target_weights(const at::Tensor& target, const at::Tensor& valid,
                          const c10::optional<at::Tensor>& weight, int64_t num_classes,
                          at::ScalarType dtype) {
  if (!weight) return valid.to(dtype);
  at::Tensor idx = at::where(valid, target, at::zeros_like(target)).clamp(0, num_classes - 1);
  return weight->to(dtype).index_select(0, idx) * valid.to(dtype);
}

// x[i, local_col_i] for owned rows, 0 elsewhere.
at::Tensor picked(const at::Tensor& rows, const Targets& t, at::ScalarType dtype) {
  if (rows.size(1) == 0) return at::zeros({rows.size(0)}, rows.options().dtype(dtype));
  at::Tensor v = rows.gather(1, t.local_col.unsqueeze(1)).squeeze(1).to(dtype);
  return at::where(t.owned, v, at::zeros_like(v));
}

// Rows per block so that a block's temporaries stay around 1M elements: the passes
// over the logits then reuse a small, cache-resident buffer instead of allocating (and
// page-faulting) logits-sized temporaries.
int64_t rows_per_block(int64_t classes) { return std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, classes)); }

template <typename Fn>
void for_row_blocks(int64_t rows, int64_t classes, Fn&& fn) {
  const int64_t step = rows_per_block(classes);
  for (int64_t r0 = 0; r0 < rows; r0 += step) fn(r0, std::min(step, rows - r0));
}

}  // namespace

at::ScalarType compute_type(at::ScalarType t) {
  return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
}

at::Tensor to_rows(const at::Tensor& x, int64_t class_dim) {
  if (x.dim() == 1) return x.unsqueeze(0);
  at::Tensor moved = class_dim == x.dim() - 1 ? x : x.movedim(class_dim, -1);
  return moved.reshape({-1, x.size(class_dim)});
}

at::Tensor from_rows(const at::Tensor& rows, c10::IntArrayRef shape, int64_t class_dim) {
  if (shape.size() == 1) return rows.reshape(shape);
  std::vector<int64_t> moved(shape.begin(), shape.end());
  moved.erase(moved.begin() + class_dim);
  moved.push_back(shape[class_dim]);
  at::Tensor out = rows.reshape(moved);
  return class_dim == static_cast<int64_t>(shape.size()) - 1 ? out : out.movedim(-1, class_dim).contiguous();
}

at::Tensor distributed_logsumexp(const at::Tensor& x_rows, const ClassShard& shard) {
  const at::ScalarType ct = compute_type(x_rows.scalar_type());
  at::Tensor m = max_over_classes(x_rows, shard);
  // Rows whose max is -inf (all -inf) would give nan in x - m; shift them by 0.
  at::Tensor shift = at::where(at::isinf(m), at::zeros_like(m), m);
  at::Tensor s = at::zeros_like(m);
  if (shard.local > 0) {
    for_row_blocks(x_rows.size(0), shard.local, [&](int64_t r0, int64_t n) {
      s.narrow(0, r0, n).copy_((x_rows.narrow(0, r0, n).to(ct) - shift.narrow(0, r0, n).unsqueeze(1)).exp_().sum(1));
    });
  }
  shard.comm->all_reduce_(s, ReduceOp::Sum);
  return s.log_().add_(shift);
}

at::Tensor distributed_log_softmax(const at::Tensor& x_rows, const ClassShard& shard) {
  at::Tensor lse = distributed_logsumexp(x_rows, shard);
  return x_rows.to(lse.scalar_type()) - lse.unsqueeze(1);
}

at::Tensor distributed_log_softmax_backward(const at::Tensor& grad_rows, const at::Tensor& out_rows,
                                            const ClassShard& shard) {
  const at::ScalarType ct = compute_type(grad_rows.scalar_type());
  at::Tensor g = grad_rows.to(ct);
  at::Tensor sum = shard.local == 0 ? at::zeros({g.size(0)}, g.options()) : g.sum(1);
  shard.comm->all_reduce_(sum, ReduceOp::Sum);
  return g - out_rows.to(ct).exp() * sum.unsqueeze(1);
}

void check_targets(const at::Tensor& target, int64_t num_classes, int64_t ignore_index) {
  at::Tensor bad = target.ne(ignore_index).logical_and(target.lt(0).logical_or(target.ge(num_classes)));
  if (bad.any().item<bool>()) {
    const int64_t value = target.masked_select(bad).view({-1})[0].item<int64_t>();
    TORCH_CHECK_INDEX(false, "Target ", value, " is out of bounds: expected a class in [0, ",
                      num_classes, ") or ignore_index (", ignore_index, ")");
  }
}

std::pair<at::Tensor, at::Tensor> distributed_nll_forward(const at::Tensor& logp_rows,
                                                          const at::Tensor& target,
                                                          const c10::optional<at::Tensor>& weight,
                                                          int64_t reduction, int64_t ignore_index,
                                                          const ClassShard& shard) {
  const at::ScalarType ct = compute_type(logp_rows.scalar_type());
  check_targets(target, shard.total, ignore_index);
  Targets t = split_targets(target, ignore_index, shard);
  at::Tensor w_t = target_weights(target, t.valid, weight, shard.total, ct);
  at::Tensor loss = -(picked(logp_rows, t, ct) * w_t);
  at::Tensor total_weight = w_t.sum();
  if (reduction == at::Reduction::None) {
    shard.comm->all_reduce_(loss, ReduceOp::Sum);
    return {loss.to(logp_rows.scalar_type()), at::zeros({}, total_weight.options()).to(logp_rows.scalar_type())};
  }
  at::Tensor sum = loss.sum();
  shard.comm->all_reduce_(sum, ReduceOp::Sum);
  if (reduction == at::Reduction::Mean) sum = sum / total_weight;
  return {sum.to(logp_rows.scalar_type()), total_weight.to(logp_rows.scalar_type())};
}

at::Tensor nll_backward_rows(const at::Tensor& grad_output, int64_t rows, const at::Tensor& target,
                             const c10::optional<at::Tensor>& weight, int64_t reduction,
                             int64_t ignore_index, const at::Tensor& total_weight,
                             at::ScalarType dtype, const ClassShard& shard) {
  const at::ScalarType ct = compute_type(dtype);
  Targets t = split_targets(target, ignore_index, shard);
  at::Tensor scale = target_weights(target, t.valid, weight, shard.total, ct);
  at::Tensor g = grad_output.to(ct);
  if (reduction == at::Reduction::None) {
    scale = scale * g.reshape({-1});
  } else {
    scale = scale * g;
    if (reduction == at::Reduction::Mean) scale = scale / total_weight.to(ct);
  }
  // Rows this rank does not own, and ignored rows, get exactly 0 (as ATen: even when
  // every target is ignored and the mean divided by a total weight of 0).
  scale = at::where(t.owned, scale, at::zeros_like(scale));
  at::Tensor out = at::zeros({rows, shard.local}, g.options());
  if (shard.local > 0) out.scatter_(1, t.local_col.unsqueeze(1), (-scale).unsqueeze(1));
  // scatter_ wrote 0 for rows not owned (scale is 0 there): nothing else to clear.
  return out.to(dtype);
}

at::Tensor fused_cross_entropy_forward(FusedCrossEntropy& ce, const ClassShard& shard) {
  const at::ScalarType ct = compute_type(ce.x_rows.scalar_type());
  const int64_t rows = ce.x_rows.size(0);
  const double eps = ce.label_smoothing;
  const double C = static_cast<double>(shard.total);
  ce.lse = distributed_logsumexp(ce.x_rows, shard);
  at::Tensor w_local;
  if (ce.weight) w_local = ce.weight->narrow(0, shard.offset, shard.local);
  const at::Tensor& x = ce.x_rows;  // converted to ct block by block where needed
  at::Tensor partial;  // this rank's share of every row's loss
  at::Tensor reduced;  // after the all-reduce
  if (!ce.soft) {
    Targets t = split_targets(ce.target, ce.ignore_index, shard);
    ce.row_weight = target_weights(ce.target, t.valid, ce.weight, shard.total, ct);
    // -log p_t = lse - x_t, counted on the rank that owns t.
    at::Tensor nll = (picked(x, t, ct).neg() + ce.lse * t.owned.to(ct)) * ce.row_weight;
    partial = (1 - eps) * nll;
    if (eps > 0) {
      // -sum_c w_c log p_c = W * lse - sum_c w_c x_c; lse counted once (on the first rank).
      at::Tensor wx = at::zeros({rows}, ce.lse.options());
      for_row_blocks(rows, shard.local, [&](int64_t r0, int64_t n) {
        at::Tensor xb = x.narrow(0, r0, n).to(ct);
        wx.narrow(0, r0, n).copy_(ce.weight ? (xb * w_local.unsqueeze(0)).sum(1) : xb.sum(1));
      });
      at::Tensor smooth = -wx;
      if (shard.comm->rank() == 0) {
        const at::Tensor W = ce.weight ? ce.weight->sum() : at::scalar_tensor(C, ce.lse.options());
        smooth = smooth + W * ce.lse;
      }
      partial = partial + (eps / C) * smooth * t.valid.to(ct);
    }
    if (ce.reduction == at::Reduction::Mean) ce.denominator = ce.row_weight.sum();
  } else {
    // q' = (1 - eps) q + eps / C; loss = -sum_c w_c q'_c log p_c = A lse - sum_c w_c q'_c x_c.
    at::Tensor q = ce.target.to(ct);
    if (eps > 0) q = q * (1 - eps) + eps / C;
    at::Tensor wq = ce.weight ? q * w_local.unsqueeze(0) : q;
    at::Tensor a_part = wq.sum(1);
    at::Tensor loss_part = a_part * ce.lse - (wq * x.to(ct)).sum(1);
    at::Tensor both = at::stack({loss_part, a_part});
    shard.comm->all_reduce_(both, ReduceOp::Sum);
    ce.row_weight = both[1];
    reduced = both[0];
    if (ce.reduction == at::Reduction::Mean) ce.denominator = at::scalar_tensor(static_cast<double>(rows), ce.lse.options());
  }
  if (!reduced.defined()) {
    if (ce.reduction == at::Reduction::None) {
      reduced = partial;
      shard.comm->all_reduce_(reduced, ReduceOp::Sum);
    } else {
      reduced = partial.sum();
      shard.comm->all_reduce_(reduced, ReduceOp::Sum);
    }
  }
  if (ce.reduction == at::Reduction::None) return reduced;
  at::Tensor total = reduced.dim() == 0 ? reduced : reduced.sum();
  return ce.reduction == at::Reduction::Mean ? total / ce.denominator : total;
}

at::Tensor fused_cross_entropy_backward(const FusedCrossEntropy& ce, const at::Tensor& grad_loss,
                                        const ClassShard& shard) {
  const at::ScalarType ct = compute_type(ce.x_rows.scalar_type());
  const double eps = ce.label_smoothing;
  const double C = static_cast<double>(shard.total);
  at::Tensor g = grad_loss.to(ct);
  // Per-row scale of the loss gradient.
  at::Tensor s = ce.reduction == at::Reduction::None ? g.reshape({-1}) : g.expand({ce.x_rows.size(0)});
  if (ce.reduction == at::Reduction::Mean) s = s / ce.denominator;
  if (!ce.soft) {
    // Ignored rows get exactly 0, even when the mean divided by a total weight of 0.
    at::Tensor valid = ce.target.ne(ce.ignore_index);
    s = at::where(valid, s, at::zeros_like(s));
  }
  at::Tensor w_local;
  if (ce.weight) w_local = ce.weight->narrow(0, shard.offset, shard.local);
  const int64_t rows = ce.x_rows.size(0);
  const at::ScalarType out_type = ce.x_rows.scalar_type();
  at::Tensor grad = at::empty({rows, shard.local}, ce.x_rows.options());
  if (shard.local == 0) return grad;
  // Per row: grad = p * row_coef - sub_j (index: eps/C w_j; soft: w_j q'_j), times s;
  // then the target column of owned rows gets -(1-eps) s w_t. Written block by block
  // straight into the result.
  at::Tensor row_coef;
  Targets t;
  if (!ce.soft) {
    t = split_targets(ce.target, ce.ignore_index, shard);
    row_coef = (1 - eps) * ce.row_weight;
    if (eps > 0) {
      const at::Tensor W = ce.weight ? ce.weight->sum() : at::scalar_tensor(C, s.options());
      row_coef = row_coef + (eps / C) * W * t.valid.to(ct);
    }
  } else {
    row_coef = ce.row_weight;  // A = sum_c w_c q'_c
  }
  row_coef = row_coef * s;
  at::Tensor wj;
  if (!ce.soft && eps > 0) wj = (ce.weight ? w_local : at::ones({shard.local}, s.options())) * (eps / C);
  for_row_blocks(rows, shard.local, [&](int64_t r0, int64_t n) {
    at::Tensor gb = (ce.x_rows.narrow(0, r0, n).to(ct) - ce.lse.narrow(0, r0, n).unsqueeze(1)).exp_();
    gb.mul_(row_coef.narrow(0, r0, n).unsqueeze(1));
    const at::Tensor sb = s.narrow(0, r0, n).unsqueeze(1);
    if (ce.soft) {
      at::Tensor q = ce.target.narrow(0, r0, n).to(ct);
      if (eps > 0) q = q * (1 - eps) + eps / C;
      gb.sub_((ce.weight ? q * w_local.unsqueeze(0) : q) * sb);
    } else if (wj.defined()) {
      gb.sub_(sb * wj.unsqueeze(0));
    }
    grad.narrow(0, r0, n).copy_(gb);
  });
  if (!ce.soft) {
    at::Tensor hit = ((1 - eps) * s * ce.row_weight * t.owned.to(ct)).to(out_type).unsqueeze(1);
    grad.scatter_add_(1, t.local_col.unsqueeze(1), -hit);
  }
  return grad;
}

}  // namespace hyper_parallel
