#include "ops/softmax_ops.h"

#include <c10/util/Exception.h>

namespace hyper_parallel {

ShardingDecision SoftmaxOp::infer_layout(const OpCall& call) const {
  TORCH_CHECK(!call.dtensor_indices().empty(), call.name(), ": no DTensor input");
  // Forward: self. Backward: grad_output and output share one layout.
  const Layout& first = call.first_layout();
  const int64_t ndim = first.ndim();
  int64_t dim = call.arg("dim").toInt();
  dim = dim < 0 ? dim + ndim : dim;
  Placements want = first.placements();
  for (auto& p : want) {
    if (p.is_partial() || p.is_shard(dim)) p = Placement::replicate();
  }
  ShardingDecision d;
  d.input_placements.assign(call.tensors().size(), want);
  d.output_layouts.push_back({Layout(call.mesh(), want, first.shape())});
  return d;
}

HP_REGISTER_OP_CLASS(SoftmaxOp, [](const OpParams&) { return std::make_shared<SoftmaxOp>(); });

}  // namespace hyper_parallel
