// NllLossOp: the ordinary (outside loss_parallel) rule for nll_loss and its backward.
#include <ATen/core/Reduction.h>
#include <c10/util/Exception.h>

#include "dispatch/op_param_choice.h"

#include "hyper_parallel/dispatch/distributed_op.h"
#include "hyper_parallel/loss/loss_parallel.h"
#include "hyper_parallel/loss/parallelism_config.h"

namespace hyper_parallel {

namespace {

class NllLossOp : public DistributedOp {
 public:
  // backward: nll_loss*_backward(grad_output, self, ...), whose log-probs come second.
  explicit NllLossOp(bool backward) : backward_(backward) {}
  std::string class_name() const override { return "NllLossOp"; }
  std::string rule() const override {
    return "class-sharded input: LossParallelLayoutError (use loss_parallel()); otherwise all "
           "inputs replicated, outputs Replicate";
  }

  ShardingDecision infer_layout(const OpCall& call) const override {
    const bool backward = backward_;
    const TensorArg& self = call.tensors().at(backward ? 1 : 0);
    const int64_t class_dim = self.shape.size() == 1 ? 0 : 1;
    if (self.layout && !self.layout->mesh_dims_sharding(class_dim).empty() &&
        !parallelism_config().loss_parallel_fallback_on_layout_error) {
      throw LossParallelLayoutError(
          call.name() + " on log-probs sharded along the class dim (" + to_string(self.layout->placements()) +
          ") outside loss_parallel(): enter hyper_parallel::loss_parallel() around the loss and its "
          "backward, or set ParallelismConfig::loss_parallel_fallback_on_layout_error to gather them (slow)");
    }
    const Placements rep(call.mesh().ndim(), Placement::replicate());
    ShardingDecision d;
    d.input_placements = replicate_dtensor_inputs(call);
    if (backward) {
      d.output_layouts.push_back({Layout(call.mesh(), rep, self.shape.vec())});
    } else {
      const bool none = call.arg("reduction").toInt() == at::Reduction::None;
      const std::vector<int64_t> out = none ? call.tensors().at(1).shape.vec() : std::vector<int64_t>{};
      d.output_layouts.push_back({Layout(call.mesh(), rep, out)});
      d.output_layouts.push_back({Layout(call.mesh(), rep, {})});
    }
    return d;
  }

 private:
  bool backward_;
};

}  // namespace

HP_REGISTER_OP_CLASS(NllLossOp, [](const OpParams& p) {
  return std::make_shared<NllLossOp>(param_choice(p, "NllLossOp", "direction", {"forward", "backward"}) == 1);
});

}  // namespace hyper_parallel
