// cross_entropy_parallel_inputs.h: the fused cross_entropy's input checks under loss_parallel.
#include "loss/front/cross_entropy_parallel_inputs.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/loss_input_checks.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/logits_device.h"

namespace hyper_parallel {

namespace {

// Probability targets, laid out as the logits (or replicated: cut here): this rank's piece, as rows.
at::Tensor probability_target_rows(const at::Tensor& target, const ClassSharding& cs, const std::string& op,
                                   bool strict) {
  return to_rows(
      laid_out_local(target, cs.layout.placements(), cs.layout.shape(), "probability target", op, cs, strict),
      cs.class_dim);
}

// A replicated target or weight must live on the logits' mesh (or be a plain tensor).
void check_on_logits_mesh(const at::Tensor& t, const ClassSharding& cs, const std::string& what,
                          const std::string& op) {
  if (auto* impl = dtensor_impl(t)) {
    TORCH_CHECK(impl->layout().mesh() == cs.layout.mesh(), op, " under loss_parallel: expected the ", what,
                " on the logits' mesh ", cs.layout.mesh().str(), " (or a plain tensor), got one on ",
                impl->layout().mesh().str());
  }
}

// The device of a plain tensor, or of a DTensor's local piece.
c10::Device local_device(const at::Tensor& t) {
  auto* impl = dtensor_impl(t);
  return impl ? impl->local().device() : t.device();
}

}  // namespace

void check_cross_entropy_parallel_inputs(const CrossEntropyParallelCall& call, const ClassShard& shard,
                                         FusedCrossEntropy& ce) {
  const std::string op = "cross_entropy";
  const ClassSharding& cs = call.cs;
  const at::Tensor& local_logits = call.local_logits;
  const at::Tensor& target = call.target;
  const c10::optional<at::Tensor>& weight = call.weight;
  const at::ScalarType ct = compute_type(local_logits.scalar_type());
  // The rows' shape: the logits' without the class dim, global and this rank's.
  const std::vector<int64_t>& rows_shape = call.row_layout.shape();
  const std::vector<int64_t> loss_shape = call.row_layout.local_shape();
  // What strictness and the options refuse, among the checks: a rank that refuses alone
  // (its strictness or z-loss differ) is named in the record, not left raising while the
  // others wait in a collective.
  check_mean_on_mesh(cs, call.reduction, op, call.strict);
  if (call.global_mean && call.z_loss_weight != 0) {
    throw LossParallelUnsupportedError(
        op + " under loss_parallel(z_loss_weight = " + std::to_string(call.z_loss_weight) +
        "): reduction 'mean' on a mesh whose other dims shard the rows (" + to_string(cs.layout.placements()) + " on " +
        cs.layout.mesh().str() +
        ") is not supported: the z-loss divides by another count than the cross-entropy. Use reduction 'sum' or "
        "'none'");
  }
  // PyTorch's cross_entropy raises RuntimeError for a bad option: so does this route.
  check_cross_entropy_definition(ce.definition, op, OptionErrorKind::runtime_error);
  check_on_logits_mesh(target, cs, "target", op);
  check_on_logits_device(local_logits.device(), local_device(target), ce.soft ? "probability target" : "target", op);
  if (weight && weight->defined()) {
    check_on_logits_mesh(*weight, cs, "class weight", op);
    check_on_logits_device(local_logits.device(), local_device(*weight), "class weight", op);
    at::Tensor w = replicated_value(*weight, "class weight", op);
    check_class_weight(w, shard.total, local_logits.scalar_type(), "logits", op, OptionErrorKind::runtime_error);
    ce.weight = w.to(ct);
  }
  if (ce.soft) {
    check_probability_target_ignore_index(ce.definition.ignore_index, op);
    ce.target = probability_target_rows(call.target, cs, op, call.strict);
  } else {
    at::Tensor t = laid_out_local(call.target, cs.row_placements(), rows_shape, "target", op, cs, call.strict);
    check_index_target_dtype(t, op, OptionErrorKind::runtime_error);
    // This rank's rows (the whole target where no other mesh dim shards them).
    TORCH_CHECK(t.sizes() == c10::IntArrayRef(loss_shape), op, ": expected a target of shape ",
                c10::IntArrayRef(rows_shape), " for logits of shape ", c10::IntArrayRef(cs.layout.shape()), ", got ",
                t.sizes());
    check_targets(t, shard.total, ce.definition.ignore_index);
    ce.target = t.reshape({-1}).to(at::kLong);
  }
}

}  // namespace hyper_parallel
