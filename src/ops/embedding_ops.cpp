#include "ops/embedding_ops.h"

#include <ATen/ops/ge.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "dispatch/op_param_choice.h"

namespace hyper_parallel {

namespace {
constexpr int64_t kVocabParallel = 1;
constexpr int64_t kVocabParallelBackward = 2;

// The ids this rank owns under a vocabulary-sharded weight, and their local rows.
struct OwnedIds {
  at::Tensor mask, local_ids;
};

OwnedIds own(const at::Tensor& ids, int64_t offset, int64_t rows) {
  at::Tensor mask = at::logical_and(at::ge(ids, offset), at::lt(ids, offset + rows));
  return {mask, at::where(mask, at::sub(ids, offset), at::zeros_like(ids))};
}
}  // namespace

std::string EmbeddingOp::rule() const {
  return "weight Shard(0) + ids Replicate -> Partial(sum) (masked lookup); weight Shard(1) -> "
         "Shard(-1); weight Replicate -> the ids' shards. Backward with replicated gradient and "
         "ids -> Shard(0) (each rank scatters into its own rows)";
}

ShardingDecision EmbeddingOp::infer_layout(const OpCall& call) const {
  const auto& tensors = call.tensors();
  const int64_t nm = call.mesh().ndim();
  auto cur = [&](const TensorArg& t, int64_t m) { return t.layout ? t.layout->placement(m) : Placement::replicate(); };
  ShardingDecision d;
  d.input_placements.assign(tensors.size(), std::nullopt);
  // Shapes by hand, not infer_output_shapes(): they are plain arithmetic here, and a meta
  // run costs a boxed call (a CPU run for an op without a C++ meta kernel).
  if (!backward_) {
    const TensorArg& weight = tensors.at(0);
    const TensorArg& ids = tensors.at(1);
    const int64_t id_ndim = ids.shape.size();
    Placements want_w(nm, Placement::replicate()), want_ids = want_w, out = want_w;
    for (int64_t m = 0; m < nm; ++m) {
      const Placement w = cur(weight, m), i = cur(ids, m);
      if (w.is_shard(0)) {  // vocabulary-parallel
        want_w[m] = w;
        want_ids[m] = Placement::replicate();
        out[m] = Placement::partial();
        d.expand_tag = kVocabParallel;
      } else if (w.is_shard(1)) {  // column-parallel
        want_w[m] = w;
        want_ids[m] = Placement::replicate();
        out[m] = Placement::shard(id_ndim);
      } else {
        want_w[m] = Placement::replicate();
        want_ids[m] = i.is_shard() ? i : Placement::replicate();
        out[m] = want_ids[m];
      }
    }
    d.input_placements[0] = want_w;
    d.input_placements[1] = want_ids;
    std::vector<int64_t> shape = ids.shape.vec();
    shape.push_back(weight.shape.at(1));
    d.output_layouts.push_back({Layout(call.mesh(), out, shape)});
    return d;
  }
  // embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
  const TensorArg& grad = tensors.at(0);
  const TensorArg& ids = tensors.at(1);
  const int64_t grad_ndim = grad.shape.size();
  Placements want_g(nm, Placement::replicate()), want_ids = want_g, out = want_g;
  for (int64_t m = 0; m < nm; ++m) {
    const Placement g = cur(grad, m), i = cur(ids, m);
    if (g.is_shard(grad_ndim - 1)) {  // column-parallel weight
      want_g[m] = g;
      want_ids[m] = Placement::replicate();
      out[m] = Placement::shard(1);
    } else if (i.is_shard() && i.dim() < grad_ndim - 1 && (g == Placement::shard(i.dim()) || g.is_replicate())) {
      // Ids sharded over the batch: each rank scatters its tokens; the sum is the grad.
      want_g[m] = Placement::shard(i.dim());
      want_ids[m] = i;
      out[m] = Placement::partial();
    } else if (g.is_partial() && i.is_replicate()) {
      want_g[m] = g;
      want_ids[m] = i;
      out[m] = Placement::partial();
    } else if (!g.is_shard() && !i.is_shard() && !call.arg("scale_grad_by_freq").toBool()) {
      // Every rank has every token's gradient: each scatters only into the rows it would
      // hold under Shard(0), the vocabulary-parallel weight's layout, so no rank ever holds
      // the V x D gradient. (A replicated weight gets it all-gathered by its gradient hook.
      // scale_grad_by_freq counts ids over the whole vocabulary: replicated below.)
      want_g[m] = want_ids[m] = Placement::replicate();
      out[m] = Placement::shard(0);
      d.expand_tag = kVocabParallelBackward;
    } else {
      want_g[m] = want_ids[m] = out[m] = Placement::replicate();
    }
  }
  d.input_placements[0] = want_g;
  d.input_placements[1] = want_ids;
  const std::vector<int64_t> shape = {call.arg("num_weights").toInt(), grad.shape.back()};
  d.output_layouts.push_back({Layout(call.mesh(), out, shape)});
  return d;
}

void EmbeddingOp::expand(const OpCall& call, const ShardingDecision& d, torch::jit::Stack& local) const {
  if (d.expand_tag == kVocabParallelBackward) {
    // embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    // on this rank's rows: other rows' ids point at local row 0 with a zero gradient.
    const Layout& out = d.output_layouts.at(0).at(0);
    const int64_t offset = out.local_offset()[0], rows = out.local_shape()[0];
    const OwnedIds owned = own(local[1].toTensor(), offset, rows);
    const at::Tensor grad = local[0].toTensor();
    local[0] = grad.masked_fill(owned.mask.logical_not().unsqueeze(-1), 0);
    local[1] = owned.local_ids;
    // A rank with no rows (more ranks than vocabulary) scatters its zeros into one scratch
    // row, which finalize drops: ATen cannot scatter into a table of no rows.
    local[2] = std::max<int64_t>(rows, 1);
    const int64_t padding = local[3].toInt();
    local[3] = padding >= offset && padding < offset + rows ? padding - offset : int64_t{-1};
    return;
  }
  if (d.expand_tag != kVocabParallel) return;
  const Layout& weight = *call.tensors().at(0).layout;
  local[1] = own(local[1].toTensor(), weight.local_offset()[0], weight.local_shape()[0]).local_ids;
  // A rank with no rows looks its ids up in one zero row (finalize zeroes the result anyway):
  // ATen cannot index a table of no rows.
  const at::Tensor table = local[0].toTensor();
  if (table.size(0) == 0) local[0] = at::zeros({1, table.size(1)}, table.options());
}

void EmbeddingOp::finalize(const OpCall& call, const ShardingDecision& d, const torch::jit::Stack& local_args,
                           torch::jit::Stack& results) const {
  if (d.expand_tag == kVocabParallelBackward) {
    const int64_t rows = d.output_layouts.at(0).at(0).local_shape()[0];
    if (rows == 0) results[0] = results[0].toTensor().narrow(0, 0, 0);  // the scratch row dropped
    return;
  }
  if (d.expand_tag != kVocabParallel) return;
  const Layout& weight = *call.tensors().at(0).layout;
  const OwnedIds owned = own(local_args[1].toTensor(), weight.local_offset()[0], weight.local_shape()[0]);
  // Rows of ids another rank owns must contribute nothing to the Partial sum.
  at::Tensor out = results[0].toTensor();
  results[0] = out.masked_fill(owned.mask.logical_not().unsqueeze(-1), 0);
}

HP_REGISTER_OP_CLASS(EmbeddingOp, [](const OpParams& p) {
  return std::make_shared<EmbeddingOp>(param_choice(p, "EmbeddingOp", "direction", {"forward", "backward"}) == 1);
});

}  // namespace hyper_parallel
