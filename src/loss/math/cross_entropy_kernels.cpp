#include "loss/math/cross_entropy_kernels.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <limits>
#include <string>

#include "hyper_parallel/loss/loss_parallel.h"
#include "loss/call/loss_input_checks.h"

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
at::Tensor target_weights(const at::Tensor& target, const at::Tensor& valid, const c10::optional<at::Tensor>& weight,
                          int64_t num_classes, at::ScalarType dtype) {
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
int64_t rows_per_block(int64_t classes) {
  return std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, classes));
}

template <typename Fn>
void for_row_blocks(int64_t rows, int64_t classes, Fn&& fn) {
  const int64_t step = rows_per_block(classes);
  for (int64_t r0 = 0; r0 < rows; r0 += step) fn(r0, std::min(step, rows - r0));
}

// z-loss and soft-capping are options of the fused cross_entropy only: the decomposed
// routes (log_softmax, nll_loss) would silently compute something else.
void reject_cross_entropy_only_options(const char* op) {
  if (!is_loss_parallel_active()) return;
  const LossParallelOptions o = current_loss_parallel_options();
  if (o.z_loss_weight != 0 || o.logit_softcap != 0) {
    throw LossParallelUnsupportedError(std::string(op) +
                                       " under loss_parallel with z_loss_weight or logit_softcap "
                                       "set: these options apply to cross_entropy only; call cross_entropy, or "
                                       "open a guard without them");
  }
}

}  // namespace

at::ScalarType compute_type(at::ScalarType t) { return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t; }

at::Tensor to_rows(const at::Tensor& x, int64_t class_dim) {
  if (x.dim() == 1) return x.unsqueeze(0);
  at::Tensor moved = class_dim == x.dim() - 1 ? x : x.movedim(class_dim, -1);
  // The row count spelt out: a rank whose piece of the classes is empty has 0 elements, and
  // reshape cannot infer -1 from them.
  const int64_t rows = c10::multiply_integers(moved.sizes().slice(0, x.dim() - 1));
  return moved.reshape({rows, x.size(class_dim)});
}

at::Tensor from_rows(const at::Tensor& rows, c10::IntArrayRef shape, int64_t class_dim) {
  if (shape.size() == 1) return rows.reshape(shape);
  std::vector<int64_t> moved(shape.begin(), shape.end());
  moved.erase(moved.begin() + class_dim);
  moved.push_back(shape[class_dim]);
  at::Tensor out = rows.reshape(moved);
  return class_dim == static_cast<int64_t>(shape.size()) - 1 ? out : out.movedim(-1, class_dim).contiguous();
}

LogSumExp distributed_logsumexp(const at::Tensor& x_rows, const ClassShard& shard) {
  const at::ScalarType ct = compute_type(x_rows.scalar_type());
  at::Tensor m = max_over_classes(x_rows, shard);
  // Rows whose max is -inf (all -inf) would give nan in x - m; shift them by 0. A +inf max
  // keeps its nan (inf - inf), as ATen's log_softmax gives it for the whole row.
  at::Tensor shift = at::where(at::isneginf(m), at::zeros_like(m), m);
  at::Tensor s = at::zeros_like(m);
  if (shard.local > 0) {
    for_row_blocks(x_rows.size(0), shard.local, [&](int64_t r0, int64_t n) {
      s.narrow(0, r0, n).copy_((x_rows.narrow(0, r0, n).to(ct) - shift.narrow(0, r0, n).unsqueeze(1)).exp_().sum(1));
    });
  }
  shard.comm->all_reduce_(s, ReduceOp::Sum);
  return {shift, s.log_()};
}

at::Tensor distributed_log_softmax(const at::Tensor& x_rows, const ClassShard& shard) {
  reject_cross_entropy_only_options("log_softmax");
  const LogSumExp lse = distributed_logsumexp(x_rows, shard);
  return (x_rows.to(lse.max.scalar_type()) - lse.max.unsqueeze(1)).sub_(lse.log_sum.unsqueeze(1));
}

at::Tensor distributed_log_softmax_backward(const at::Tensor& grad_rows, const at::Tensor& out_rows,
                                            const ClassShard& shard) {
  const at::ScalarType ct = compute_type(grad_rows.scalar_type());
  at::Tensor g = grad_rows.to(ct);
  at::Tensor sum = shard.local == 0 ? at::zeros({g.size(0)}, g.options()) : g.sum(1);
  shard.comm->all_reduce_(sum, ReduceOp::Sum);
  return g - out_rows.to(ct).exp() * sum.unsqueeze(1);
}

std::pair<at::Tensor, at::Tensor> distributed_nll_forward(const at::Tensor& logp_rows, const at::Tensor& target,
                                                          const c10::optional<at::Tensor>& weight, int64_t reduction,
                                                          int64_t ignore_index, const ClassShard& shard) {
  reject_cross_entropy_only_options("nll_loss");
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
                             const c10::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                             const at::Tensor& total_weight, at::ScalarType dtype, const ClassShard& shard) {
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

}  // namespace hyper_parallel
