#include "ops/matrix_ops.h"

#include <c10/util/Exception.h>

#include "dispatch/op_param_choice.h"
#include "hyper_parallel/dispatch/sharding_strategy.h"

namespace hyper_parallel {

namespace {

// Placement of addmm's bias (broadcast against [m, n]) for an output placement.
Placement bias_placement(const TensorArg& bias, const Placement& out, int64_t out_ndim) {
  if (out.is_partial()) return Placement::partial(ReduceOp::Sum);
  if (!out.is_shard()) return Placement::replicate();
  const int64_t nb = bias.shape.size();
  const int64_t bd = out.dim() - (out_ndim - nb);
  if (bd >= 0 && bias.shape[bd] != 1) return Placement::shard(bd);
  return Placement::replicate();
}

}  // namespace

std::string MatmulOp::rule() const {
  return "per mesh dim the cheapest of (S(m),R)->S(m), (R,S(n))->S(n), (S(k),S(k))->P, "
         "(P,R)/(R,P)->P, (R,R)->R [bmm: (S(b),S(b))->S(b)]; addmm bias follows the output";
}

ShardingDecision MatmulOp::infer_layout(const OpCall& call) const {
  const bool has_bias = form_ == Form::Addmm;
  const auto& tensors = call.tensors();
  TORCH_CHECK(tensors.size() == (has_bias ? 3u : 2u), call.name(), ": expected ", has_bias ? 3 : 2,
              " tensor arguments");
  const bool batched = form_ == Form::Bmm;
  const int64_t o = batched ? 1 : 0;
  const int64_t out_ndim = 2 + o;
  // Candidates per mesh dim for (a, b) -> out; the shared selector charges each the bytes
  // its redistributions move and keeps the cheapest (earlier ones win ties).
  std::vector<DimStrategy> strategies = {
      {{Placement::shard(o), Placement::replicate()}, Placement::shard(o)},          // rows
      {{Placement::replicate(), Placement::shard(o + 1)}, Placement::shard(o + 1)},  // columns
      {{Placement::shard(o + 1), Placement::shard(o)}, Placement::partial()},        // contraction
      {{Placement::partial(), Placement::replicate()}, Placement::partial()},
      {{Placement::replicate(), Placement::partial()}, Placement::partial()},
      {{Placement::replicate(), Placement::replicate()}, Placement::replicate()},
  };
  if (batched) strategies.insert(strategies.begin(), {{Placement::shard(0), Placement::shard(0)}, Placement::shard(0)});
  const size_t ia = has_bias ? 1 : 0, ib = has_bias ? 2 : 1;
  const SelectedStrategy chosen = select_strategy(call, {ia, ib}, strategies);
  const int64_t nm = call.mesh().ndim();
  const Placements& out = chosen.output;
  ShardingDecision d;
  d.input_placements.assign(tensors.size(), std::nullopt);
  d.input_placements[ia] = chosen.inputs[0];
  d.input_placements[ib] = chosen.inputs[1];
  if (has_bias) {
    Placements want_bias(nm, Placement::replicate());
    for (int64_t m = 0; m < nm; ++m) want_bias[m] = bias_placement(tensors[0], out[m], out_ndim);
    d.input_placements[0] = want_bias;
  }
  const auto shapes = infer_output_shapes(call);
  d.output_layouts.push_back({Layout(call.mesh(), out, shapes.at(0).at(0))});
  return d;
}

HP_REGISTER_OP_CLASS(MatmulOp, [](const OpParams& p) {
  return std::make_shared<MatmulOp>(
      static_cast<MatmulOp::Form>(param_choice(p, "MatmulOp", "form", {"mm", "bmm", "addmm"})));
});

}  // namespace hyper_parallel
