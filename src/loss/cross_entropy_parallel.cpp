// The fused cross_entropy of loss_parallel, and its custom autograd node (K3).
#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "compat/autograd_compat.h"
#include "core/redistribute.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor.h"
#include "loss/class_sharding.h"
#include "loss/cross_entropy_kernels.h"
#include "loss/loss_parallel_dispatch.h"

namespace hyper_parallel {

namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

// The gradient of the cross entropy with respect to the class-sharded logits. Holds the
// logits' rows, the per-row log-sum-exp and weights: everything backward needs, so it
// runs without a collective and without the loss_parallel context.
struct CrossEntropyParallelBackward : Node {
  FusedCrossEntropy ce;
  ClassSharding sharding;
  std::vector<int64_t> local_shape;  // of the local logits
  // The logits whose rows `ce` keeps, saved so that an in-place change between forward and
  // backward raises LibTorch's usual error instead of giving the gradient of other logits.
  torch::autograd::SavedVariable saved_logits;

  variable_list apply(variable_list&& grads) override {
    saved_logits.unpack();  // throws when the logits were modified in place, or released
    if (!grads[0].defined()) return {at::Tensor()};
    const at::Tensor g = full_value(grads[0]);
    const ClassShard shard{sharding.comm, sharding.offset, sharding.local_classes, sharding.num_classes};
    at::Tensor rows = fused_cross_entropy_backward(ce, g, shard);
    return {make_dtensor(from_rows(rows, local_shape, sharding.class_dim), sharding.layout)};
  }
  std::string name() const override { return "hyper_parallel::CrossEntropyParallelBackward"; }
  void release_variables() override {
    saved_logits.reset_data();
    ce = FusedCrossEntropy{};
  }
};

// Probability targets: this rank's class slice, as rows.
at::Tensor soft_target_rows(const at::Tensor& target, const ClassSharding& cs, const std::string& op) {
  at::Tensor local;
  if (auto* impl = dtensor_impl(target)) {
    const Layout& l = impl->layout();
    if (l.placements() == cs.layout.placements()) {
      local = impl->local();
    } else if (l.is_replicated()) {
      local = impl->local().narrow(cs.class_dim, cs.offset, cs.local_classes);
    } else {
      throw LossParallelLayoutError(op + " under loss_parallel: expected probability targets "
                                    "replicated or laid out like the logits (" +
                                    to_string(cs.layout.placements()) + "), got " + to_string(l.placements()));
    }
  } else {
    TORCH_CHECK(target.sizes() == c10::IntArrayRef(cs.layout.shape()), op,
                ": probability targets must have the logits' shape ", c10::IntArrayRef(cs.layout.shape()),
                ", got ", target.sizes());
    local = target.narrow(cs.class_dim, cs.offset, cs.local_classes);
  }
  return to_rows(local, cs.class_dim);
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

// FNV-1a of a tensor's bytes: equal on every rank iff the values are (for the check below).
uint64_t bytes_hash(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU).contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

bool check_replicated_enabled() {
  const char* v = std::getenv("HYPER_PARALLEL_CHECK_REPLICATED");
  return v && std::string(v) == "1";
}

// Runs the input checks on every rank of the class-sharding group and agrees on the outcome
// (one small all_reduce of n * 512 bytes), so that inputs which differ between ranks give the same error on
// every rank instead of an error on one and a hang in the loss's collectives on the others.
// With HYPER_PARALLEL_CHECK_REPLICATED=1 it also compares the target across ranks.
void check_inputs_on_every_rank(const ClassSharding& cs, const at::Tensor& target, const std::string& op,
                                const std::function<void()>& checks) {
  std::exception_ptr own;
  std::string message;
  try {
    checks();
  } catch (const c10::Error& e) {
    own = std::current_exception();
    message = e.what_without_backtrace();
  } catch (const std::exception& e) {
    own = std::current_exception();
    message = e.what();
  }
  if (!cs.comm || cs.comm->size() == 1) {
    if (own) std::rethrow_exception(own);
    return;
  }
  // Per rank: [failed, target hash (8 bytes), message (truncated)].
  constexpr int64_t kRecord = 512;
  const bool compare = check_replicated_enabled();
  std::vector<uint8_t> record(kRecord, 0);
  record[0] = own ? 1 : 0;
  // A target laid out like the logits (soft, sharded) legitimately differs: compare only
  // plain and replicated targets.
  const auto* target_impl = dtensor_impl(target);
  const bool comparable = !target_impl || target_impl->layout().is_replicated();
  const uint64_t hash =
      compare && comparable && !own ? bytes_hash(target_impl ? target_impl->local() : target) : 0;
  std::memcpy(record.data() + 1, &hash, sizeof hash);
  std::memcpy(record.data() + 9, message.data(), std::min<size_t>(message.size(), kRecord - 10));
  // One all_reduce (a sum in which each rank fills only its own slot) gathers the records.
  const int64_t n = cs.comm->size();
  at::Tensor slots = at::zeros({n * kRecord}, at::kByte);
  slots.narrow(0, cs.comm->rank() * kRecord, kRecord).copy_(at::from_blob(record.data(), {kRecord}, at::kByte));
  slots = slots.to(cs.layout.mesh().device());
  cs.comm->all_reduce_(slots, ReduceOp::Sum);
  const at::Tensor all = slots.cpu();
  const auto* bytes = all.data_ptr<uint8_t>();
  std::string failed, first_message;
  bool same_messages = true;
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* rec = bytes + r * kRecord;
    if (!rec[0]) continue;
    const std::string m(reinterpret_cast<const char*>(rec + 9));
    if (failed.empty()) first_message = m;
    same_messages = same_messages && m == first_message;
    failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!failed.empty()) {
    const bool all_failed = static_cast<int64_t>(std::count(failed.begin(), failed.end(), ',')) + 1 == n;
    // Inputs equal on every rank fail equally everywhere: keep the error's own type then.
    if (own && all_failed && same_messages) std::rethrow_exception(own);
    TORCH_CHECK(false, op, " under loss_parallel: the inputs were refused on rank(s) ", failed,
                " of the loss's group (an input that should be replicated differs between ranks?); on rank ",
                failed.substr(0, failed.find(',')), ": ", first_message);
  }
  if (!compare) return;
  std::string differ;
  for (int64_t r = 1; r < n; ++r) {
    if (std::memcmp(bytes + r * kRecord + 1, bytes + 1, sizeof hash) != 0) {
      differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  TORCH_CHECK(differ.empty(), op, " under loss_parallel (HYPER_PARALLEL_CHECK_REPLICATED=1): the target differs "
              "between ranks: rank(s) ", differ, " of the loss's group hold a different target than rank 0; "
              "a replicated target must be identical on every rank");
}

}  // namespace

at::Tensor cross_entropy_parallel(const at::Tensor& logits_in, const at::Tensor& target,
                                  const c10::optional<at::Tensor>& weight, int64_t reduction,
                                  int64_t ignore_index, double label_smoothing) {
  const std::string op = "cross_entropy";
  at::Tensor logits = logits_in;
  const int64_t class_dim = class_dim_of(logits.dim());
  ClassSharding cs = resolve_class_sharding(&logits, class_dim, op, current_loss_parallel_options(),
                                            /*differentiable=*/true);
  if (target.requires_grad() || (weight && weight->defined() && weight->requires_grad())) {
    throw LossParallelUnsupportedError(op + " under loss_parallel: gradients with respect to the "
                                       "target or the class weights are not supported");
  }
  const at::Tensor& local_logits = local_of(logits);
  const at::ScalarType ct = compute_type(local_logits.scalar_type());
  FusedCrossEntropy ce;
  ce.x_rows = to_rows(local_logits, class_dim);
  ce.reduction = reduction;
  ce.ignore_index = ignore_index;
  ce.label_smoothing = label_smoothing;
  std::vector<int64_t> loss_shape;
  ce.soft = target.is_floating_point();
  check_inputs_on_every_rank(cs, target, op, [&] {
    TORCH_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
                ": label_smoothing must be in [0, 1], got ", label_smoothing);
    check_on_logits_mesh(target, cs, "target", op);
    if (weight && weight->defined()) {
      check_on_logits_mesh(*weight, cs, "class weight", op);
      at::Tensor w = replicated_value(*weight, "class weight", op);
      TORCH_CHECK(w.dim() == 1 && w.size(0) == cs.num_classes, op, ": expected a class weight of shape [",
                  cs.num_classes, "], got ", w.sizes());
      ce.weight = w.to(ct);
    }
    if (ce.soft) {
      ce.target = soft_target_rows(target, cs, op);
      loss_shape = cs.layout.shape();
      loss_shape.erase(loss_shape.begin() + class_dim);
    } else {
      at::Tensor t = replicated_value(target, "target", op);
      // As PyTorch's nll_loss: class indices are int64 (or uint8).
      TORCH_CHECK(t.scalar_type() == at::kLong || t.scalar_type() == at::kByte, op,
                  ": expected target dtype to be Long or Byte, but got ", t.scalar_type());
      std::vector<int64_t> expect = cs.layout.shape();
      expect.erase(expect.begin() + class_dim);
      TORCH_CHECK(t.sizes() == c10::IntArrayRef(expect), op, ": expected a target of shape ",
                  c10::IntArrayRef(expect), " for logits of shape ", c10::IntArrayRef(cs.layout.shape()),
                  ", got ", t.sizes());
      check_targets(t, cs.num_classes, ignore_index);
      ce.target = t.reshape({-1}).to(at::kLong);
      loss_shape = expect;
    }
  });
  const ClassShard shard{cs.comm, cs.offset, cs.local_classes, cs.num_classes};
  at::Tensor loss = fused_cross_entropy_forward(ce, shard).to(local_logits.scalar_type());
  if (reduction == at::Reduction::None) {
    loss = loss.reshape(loss_shape);
  } else {
    loss_shape.clear();
  }
  const DeviceMesh& mesh = cs.layout.mesh();
  at::Tensor out = make_dtensor(loss, Layout(mesh, Placements(mesh.ndim(), Placement::replicate()), loss_shape));
  if (torch::autograd::GradMode::is_enabled() && logits.requires_grad()) {
    compat::NodePtr owner = compat::make_node<CrossEntropyParallelBackward>();
    auto* node = static_cast<CrossEntropyParallelBackward*>(owner.get());
    node->ce = std::move(ce);
    node->sharding = cs;
    node->local_shape = local_logits.sizes().vec();
    node->saved_logits = torch::autograd::SavedVariable(logits, /*is_output=*/false);
    node->set_next_edges(torch::autograd::collect_next_edges(logits));
    torch::autograd::create_gradient_edge(out, std::move(owner));
  }
  return out;
}

}  // namespace hyper_parallel
