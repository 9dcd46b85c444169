#include "ops/reduction_ops.h"

#include <ATen/ops/mul.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace hyper_parallel {

std::vector<int64_t> reduced_dims(const OpCall& call, int64_t ndim) {
  std::vector<int64_t> dims;
  if (call.has_arg("dim")) {
    const c10::IValue& v = call.arg("dim");
    if (v.isInt())
      dims.push_back(v.toInt());
    else if (v.isIntList())
      dims = v.toIntVector();
  }
  if (dims.empty() && !(call.has_arg("dim") && call.arg("dim").isInt())) {
    for (int64_t d = 0; d < ndim; ++d) dims.push_back(d);
  }
  for (auto& d : dims) d = d < 0 ? d + ndim : d;
  std::sort(dims.begin(), dims.end());
  return dims;
}

bool keeps_dims(const OpCall& call) { return call.has_arg("keepdim") && call.arg("keepdim").toBool(); }

std::string ReductionOp::rule() const {
  std::string r = partial_op_ ? std::string("reducing a sharded dim -> Partial(") + reduce_op_name(*partial_op_) + ")"
                              : "a sharded reduced dim is gathered first";
  return r + (linear_ ? "; Partial(sum) passes through" : "; Partial inputs are reduced first");
}

ShardingDecision ReductionOp::infer_layout(const OpCall& call) const {
  const TensorArg& self = call.tensors().at(0);
  TORCH_CHECK(self.layout, call.name(), ": expected self to be a DTensor");
  const int64_t ndim = static_cast<int64_t>(self.shape.size());
  const auto dims = reduced_dims(call, ndim);
  const bool keepdim = keeps_dims(call);
  auto is_reduced = [&](int64_t d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); };
  auto out_dim = [&](int64_t d) {
    if (keepdim) return d;
    return d - static_cast<int64_t>(std::count_if(dims.begin(), dims.end(), [d](int64_t r) { return r < d; }));
  };
  const Placements& in = self.layout->placements();
  Placements want = in, out = in;
  bool scaled_mean = false;
  for (size_t m = 0; m < in.size(); ++m) {
    const Placement& p = in[m];
    if (p.is_shard()) {
      if (!is_reduced(p.dim())) {
        out[m] = Placement::shard(out_dim(p.dim()));
      } else if (partial_op_) {
        out[m] = Placement::partial(*partial_op_);
      } else if (is_mean_) {
        out[m] = Placement::partial(ReduceOp::Sum);
        scaled_mean = true;
      } else {
        want[m] = out[m] = Placement::replicate();
      }
    } else if (p.is_partial()) {
      if (!(linear_ && p.reduce_op() == ReduceOp::Sum)) want[m] = out[m] = Placement::replicate();
    }
  }
  ShardingDecision d;
  d.expand_tag = scaled_mean ? 1 : 0;
  d.input_placements.assign(call.tensors().size(), std::nullopt);
  d.input_placements[0] = want;
  for (const auto& shapes : infer_output_shapes(call)) {
    std::vector<Layout> ls;
    for (const auto& s : shapes) ls.emplace_back(call.mesh(), out, s);
    d.output_layouts.push_back(std::move(ls));
  }
  return d;
}

void ReductionOp::finalize(const OpCall& call, const ShardingDecision& d, const torch::jit::Stack& local_args,
                           torch::jit::Stack& results) const {
  if (d.expand_tag != 1) return;
  // The local mean covers local_count of the global_count elements reduced.
  const TensorArg& self = call.tensors().at(0);
  const at::Tensor& local = local_args[0].toTensor();
  double local_count = 1, global_count = 1;
  for (int64_t dim : reduced_dims(call, self.shape.size())) {
    local_count *= static_cast<double>(local.size(dim));
    global_count *= static_cast<double>(self.shape[dim]);
  }
  at::Tensor r = results[0].toTensor();
  results[0] = local_count == 0 ? r.new_zeros(r.sizes()) : r.mul(local_count / global_count);
}

HP_REGISTER_OP_CLASS(ReductionOp, [](const OpParams& p) {
  const std::string partial = p.get("partial", "none");
  std::optional<ReduceOp> op;
  if (partial == "sum")
    op = ReduceOp::Sum;
  else if (partial == "max")
    op = ReduceOp::Max;
  else if (partial == "min")
    op = ReduceOp::Min;
  else
    TORCH_CHECK(partial == "none", p.source(), ": partial must be sum, max, min or none, got '", partial, "'");
  return std::make_shared<ReductionOp>(op, p.get_bool("linear", false), p.get_bool("mean", false));
});

}  // namespace hyper_parallel
