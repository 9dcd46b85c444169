#include "ops/index_ops.h"

#include <ATen/ops/ge.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

namespace hyper_parallel {

namespace {
constexpr int64_t kMaskedGather = 1;

int64_t gather_dim(const OpCall& call) {
  const int64_t nd = call.tensors().at(0).shape.size();
  const int64_t d = call.arg("dim").toInt();
  return d < 0 ? d + nd : d;
}

at::Tensor owned(const at::Tensor& index, int64_t offset, int64_t rows) {
  return at::logical_and(at::ge(index, offset), at::lt(index, offset + rows));
}
}  // namespace

ShardingDecision GatherOp::infer_layout(const OpCall& call) const {
  const TensorArg& self = call.tensors().at(0);
  const TensorArg& index = call.tensors().at(1);
  TORCH_CHECK(self.layout, call.name(), ": expected self to be a DTensor");
  const int64_t dim = gather_dim(call);
  const int64_t nm = call.mesh().ndim();
  Placements want_self(nm, Placement::replicate()), want_index = want_self, out = want_self;
  ShardingDecision d;
  for (int64_t m = 0; m < nm; ++m) {
    const Placement p = self.layout->placement(m);
    if (p.is_shard(dim) && !self.layout->has_nested_shards()) {
      want_self[m] = p;
      out[m] = Placement::partial();
      d.expand_tag = kMaskedGather;
    } else if (p.is_shard() && !p.is_shard(dim) && index.shape == self.shape) {
      // Same shape: index and self split alike off the gathered dim (never along it: the
      // indices are global positions in that dim).
      want_self[m] = want_index[m] = out[m] = p;
    }
  }
  d.input_placements.assign(call.tensors().size(), std::nullopt);
  d.input_placements[0] = want_self;
  d.input_placements[1] = want_index;
  d.output_layouts.push_back({Layout(call.mesh(), out, index.shape.vec())});
  return d;
}

void GatherOp::expand(const OpCall& call, const ShardingDecision& d, torch::jit::Stack& local) const {
  if (d.expand_tag != kMaskedGather) return;
  const Layout& self = *call.tensors().at(0).layout;
  const int64_t dim = gather_dim(call);
  const int64_t offset = self.local_offset()[dim], rows = self.local_shape()[dim];
  const at::Tensor& index = local[2].toTensor();
  local[2] = at::where(owned(index, offset, rows), at::sub(index, offset), at::zeros_like(index));
  if (rows == 0) {
    // An empty piece (more ranks than entries): gather from one zero row; finalize masks it.
    std::vector<int64_t> one = local[0].toTensor().sizes().vec();
    one[dim] = 1;
    local[0] = local[0].toTensor().new_zeros(one);
  }
}

void GatherOp::finalize(const OpCall& call, const ShardingDecision& d, const torch::jit::Stack& local_args,
                        torch::jit::Stack& results) const {
  if (d.expand_tag != kMaskedGather) return;
  const Layout& self = *call.tensors().at(0).layout;
  const int64_t dim = gather_dim(call);
  at::Tensor mask = owned(local_args[2].toTensor(), self.local_offset()[dim], self.local_shape()[dim]);
  results[0] = results[0].toTensor().masked_fill(mask.logical_not(), 0);
}

ShardingDecision ReplicatedOp::infer_layout(const OpCall& call) const {
  const Placements rep(call.mesh().ndim(), Placement::replicate());
  ShardingDecision d;
  d.input_placements = replicate_dtensor_inputs(call);
  for (const auto& shapes : infer_output_shapes(call)) {
    std::vector<Layout> ls;
    for (const auto& s : shapes) ls.emplace_back(call.mesh(), rep, s);
    d.output_layouts.push_back(std::move(ls));
  }
  return d;
}

HP_REGISTER_OP_CLASS(GatherOp, [](const OpParams&) { return std::make_shared<GatherOp>(); });
HP_REGISTER_OP_CLASS(ReplicatedOp, [](const OpParams&) { return std::make_shared<ReplicatedOp>(); });

}  // namespace hyper_parallel
