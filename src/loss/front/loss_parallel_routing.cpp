// Loss-parallel routing (docs/design.md, "Routing"): the loss_parallel context route in OpDispatcher, the
// op-name table, the per-op kernels (K1/K2 and the backward kernels), and the
// cross_entropy_loss entry that sends the whole loss to the fused kernel.
#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <ATen/ops/cross_entropy_loss_compositeimplicitautograd_dispatch.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "dispatch/op_registry.h"
#include "dispatch/dispatch_key_registration.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dispatch/dispatch.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/loss/parallelism_config.h"
#include "loss/call/call_agreement.h"
#include "loss/call/class_sharding.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/call/input_agreement.h"
#include "loss/call/loss_input_checks.h"
#include "loss/front/loss_parallel_dispatch.h"

namespace hyper_parallel {

namespace {

using Kernel = std::function<bool(const c10::OperatorHandle&, torch::jit::Stack*)>;

// The fused entry: cross_entropy_loss is registered with LibTorch (below), not routed.
constexpr const char* kCrossEntropyLoss = "cross_entropy_loss";

// Names registered at run time (register_loss_parallel_op_names); the ops the specs bind
// to a loss_parallel kernel (ops/*.yaml, `loss_parallel: <kernel>`) are the built-in ones.
struct ExtraNames {
  std::mutex mutex;
  std::set<std::string> names;
};
ExtraNames& extra_names() {
  static ExtraNames* t = new ExtraNames();
  return *t;
}

bool in_table(const std::string& name) {
  if (!route_kernel_of("loss_parallel", name).empty()) return true;
  std::lock_guard<std::mutex> lock(extra_names().mutex);
  return extra_names().names.count(name) > 0;
}

// A backward input: the sharding its forward had (no option checks: forward did them).
ClassSharding sharding_for_backward(const at::Tensor& t, int64_t class_dim, const std::string& op) {
  at::Tensor copy = t;
  LossParallelOptions lenient;
  lenient.strict = false;
  return resolve_class_sharding(&copy, class_dim, op, lenient, /*differentiable=*/false);
}

at::Tensor replicated_dtensor(const at::Tensor& local, const DeviceMesh& mesh) {
  return make_dtensor(local, Layout(mesh, Placements(mesh.ndim(), Placement::replicate()), local.sizes().vec()));
}

// The record agree_on_call compares for a routed op on class-sharded `local` (with the
// guard's cross-entropy-only options, so that a guard that differs between ranks is named
// rather than refused on some ranks only).
LossCallRecord routed_call(const std::string& op, const at::Tensor& local, int64_t class_dim, const ClassSharding& cs) {
  LossCallRecord call;
  call.op = op;
  record_logits(call, local, class_dim);
  call.vocab_size = cs.shard.total;
  call.local_classes = cs.shard.local;
  record_context(call);
  record_guard_cross_entropy_options(call);
  return call;
}

// For a loss on class-sharded `logits` outside loss_parallel(): the call's record, as the ranks
// inside it would make it but for the context, over the group sharding the classes.
void agree_outside_context(const at::Tensor& logits, int64_t class_dim, const std::string& op) {
  const auto* impl = dtensor_impl(logits);
  const Layout& layout = impl->layout();
  const auto dims = layout.mesh_dims_sharding(class_dim);
  LossCallRecord call;
  call.op = op;
  record_logits(call, impl->local(), class_dim);
  record_context(call);  // outside
  call.vocab_size = layout.shape()[class_dim];
  agree_on_call(call, &layout.mesh().comm(dims.back()), impl->local().device());
}

// What nll_loss's 'mean' divides this rank's rows by (as ATen's total weight): the class
// weights of the counted targets, or their count without weights; in compute type `ct`.
at::Tensor nll_mean_denominator(const at::Tensor& target, const c10::optional<at::Tensor>& weight, int64_t ignore_index,
                                at::ScalarType ct) {
  const at::Tensor t = target.reshape({-1}).to(at::kLong);
  const at::Tensor counted = t.ne(ignore_index);
  if (!weight) return counted.sum().to(ct);
  const at::Tensor w = weight->to(ct).index_select(0, at::where(counted, t, at::zeros_like(t)));
  return at::where(counted, w, at::zeros_like(w)).sum();
}

c10::optional<at::Tensor> optional_tensor(const c10::IValue& v) {
  if (v.isNone()) return c10::nullopt;
  const at::Tensor& t = v.toTensor();
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// _log_softmax(self, dim, half_to_float): K1.
bool log_softmax_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 3);
  at::Tensor self = args[0].toTensor();
  const int64_t dim = c10::maybe_wrap_dim(args[1].toInt(), self.dim());
  const bool half_to_float = args[2].toBool();
  if (!is_class_sharded(self, dim)) return false;
  ClassSharding cs = resolve_class_sharding(&self, dim, "log_softmax", current_loss_parallel_options(),
                                            /*differentiable=*/false);
  const at::Tensor& local = local_of(self);
  // The call's record before the all-reduces sized by rows (one all-gather more).
  agree_on_call(routed_call("log_softmax", local, dim, cs), cs.shard.comm, local.device());
  at::Tensor rows = distributed_log_softmax(to_rows(local, dim), cs.shard);
  const at::ScalarType out_type = half_to_float ? at::kFloat : local.scalar_type();
  at::Tensor out = from_rows(rows.to(out_type), local.sizes(), dim);
  torch::jit::drop(*stack, 3);
  stack->push_back(make_dtensor(out, cs.layout));
  return true;
}

// _log_softmax_backward_data(grad_output, output, dim, input_dtype): one all-reduce.
bool log_softmax_backward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 4);
  at::Tensor grad = args[0].toTensor();
  at::Tensor output = args[1].toTensor();
  const int64_t dim = c10::maybe_wrap_dim(args[2].toInt(), output.dim());
  const auto input_dtype = args[3].toScalarType();
  if (!is_class_sharded(output, dim)) return false;
  ClassSharding cs = sharding_for_backward(output, dim, "log_softmax backward");
  const at::Tensor& out_local = local_of(output);
  at::Tensor g = local_piece(grad, cs.layout);
  at::Tensor rows = distributed_log_softmax_backward(to_rows(g, dim), to_rows(out_local, dim), cs.shard);
  torch::jit::drop(*stack, 4);
  stack->push_back(make_dtensor(from_rows(rows.to(input_dtype), out_local.sizes(), dim), cs.layout));
  return true;
}

// nll_loss_forward / nll_loss2d_forward(self, target, weight, reduction, ignore_index): K2.
bool nll_forward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 5);
  at::Tensor self = args[0].toTensor();
  const int64_t class_dim = class_dim_of(self.dim());
  if (!is_class_sharded(self, class_dim)) return false;
  const std::string op = "nll_loss";
  ClassSharding cs = resolve_class_sharding(&self, class_dim, op, current_loss_parallel_options(),
                                            /*differentiable=*/false);
  const int64_t reduction = args[3].toInt();
  const int64_t ignore_index = args[4].toInt();
  const bool strict = effective_strict(current_loss_parallel_options());
  // 'mean' over rows other mesh dims shard (strict = false): the kernel sums, the sum is
  // divided by the global total weight (one small all-reduce per such mesh dim).
  const bool global_mean = reduction == at::Reduction::Mean && !cs.row_mesh_dims().empty();
  const Layout row_layout = cs.row_layout();
  const at::Tensor& local = local_of(self);
  at::Tensor target;
  c10::optional<at::Tensor> weight = optional_tensor(args[2]);
  LossCallRecord call = routed_call(op, local, class_dim, cs);
  record_target(call, args[1].toTensor(), class_dim);
  call.definition.reduction = reduction;
  call.definition.ignore_index = ignore_index;
  // The checks settle in the call's record (one all-gather more): a refusal on one rank is
  // the same error on every rank, and every rank stays in step.
  const InputAgreement agreement(op, args[1].toTensor(), [&] {
    // Among the checks: a rank whose strictness refuses alone is named in the record.
    check_mean_on_mesh(cs, reduction, op, strict);
    target = laid_out_local(args[1].toTensor(), row_layout.placements(), row_layout.shape(), "target", op, cs, strict);
    if (weight) weight = replicated_value(*weight, "class weight", op);
    // This rank's rows: the local log-probs' shape (the global one where no other mesh dim shards them).
    check_nll_inputs(local.sizes(), local.scalar_type(), class_dim, target, weight, cs.shard.total, reduction,
                     ignore_index, op);
  });
  if (weight && !agreement.refused()) call.class_weight = *weight;
  std::pair<at::Tensor, at::Tensor> result;
  std::exception_ptr refused_here;  // the global mean tells the other row groups before raising it
  try {
    agree_on_call(call, cs.shard.comm, local.device(), &agreement);
    result = distributed_nll_forward(to_rows(local, class_dim), target.reshape({-1}), weight,
                                     global_mean ? int64_t{at::Reduction::Sum} : reduction, ignore_index, cs.shard);
  } catch (...) {
    if (!global_mean) throw;
    refused_here = std::current_exception();
  }
  const DeviceMesh& mesh = cs.layout.mesh();
  at::Tensor out, total_weight;
  if (reduction == at::Reduction::None) {
    out = make_dtensor(result.first.reshape(target.sizes()), row_layout);
    total_weight = replicated_dtensor(result.second, mesh);
  } else if (global_mean) {
    // The total weight handed to backward is the global one: its mean gradient divides by it.
    const at::ScalarType ct = compute_type(local.scalar_type());
    const at::Tensor total =
        global_mean_denominator(refused_here ? at::Tensor() : nll_mean_denominator(target, weight, ignore_index, ct),
                                local.options().dtype(ct), cs, refused_here, op);
    out = make_dtensor((result.first.to(ct) / total).to(local.scalar_type()), Layout(mesh, cs.sum_placements(), {}));
    total_weight = replicated_dtensor(total.to(local.scalar_type()), mesh);
  } else {
    // As PyTorch 2.15: each rank reduced its rows, Partial(sum) over the mesh dims sharding them.
    out = make_dtensor(result.first, Layout(mesh, cs.sum_placements(), {}));
    total_weight = make_dtensor(result.second, Layout(mesh, cs.sum_placements(), {}));
  }
  torch::jit::drop(*stack, 5);
  stack->push_back(out);
  stack->push_back(total_weight);
  return true;
}

// nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight, reduction,
// ignore_index, total_weight): local, no collective.
bool nll_backward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 7);
  at::Tensor self = args[1].toTensor();
  const int64_t class_dim = class_dim_of(self.dim());
  if (!is_class_sharded(self, class_dim)) return false;
  const std::string op = "nll_loss backward";
  ClassSharding cs = sharding_for_backward(self, class_dim, op);
  const int64_t reduction = args[4].toInt();
  const Layout row_layout = cs.row_layout();
  // A per-row loss's gradient is laid out as its rows (this rank's piece); a reduced loss's is
  // its value (Replicate, as PyTorch's gradient of a Partial(sum)).
  at::Tensor grad =
      reduction == at::Reduction::None ? local_piece(args[0].toTensor(), row_layout) : full_value(args[0].toTensor());
  at::Tensor target = laid_out_local(args[2].toTensor(), row_layout.placements(), row_layout.shape(), "target", op, cs,
                                     /*strict=*/false);
  c10::optional<at::Tensor> weight = optional_tensor(args[3]);
  if (weight) weight = replicated_value(*weight, "class weight", op);
  const at::Tensor& local = local_of(self);
  const int64_t rows = to_rows(local, class_dim).size(0);
  // The total weight only 'mean' reads: the forward's, replicated (the global one for the
  // global mean), so this rank's copy, without a collective.
  const at::Tensor& tw = args[6].toTensor();
  at::Tensor g = nll_backward_rows(grad, rows, target.reshape({-1}), weight, reduction, args[5].toInt(),
                                   dtensor_impl(tw) ? local_of(tw) : tw, local.scalar_type(), cs.shard);
  torch::jit::drop(*stack, 7);
  stack->push_back(make_dtensor(from_rows(g, local.sizes(), class_dim), cs.layout));
  return true;
}

struct LossKernel {
  Kernel run;
  // Backward kernels are picked by the layout of their inputs, not by the context: only a
  // forward under loss_parallel produces class-sharded log-probs for them, and autograd
  // may run them on another thread or after the guard is gone.
  bool backward;
};

// By kernel name: the names ops/*.yaml binds ops to.
const std::map<std::string, LossKernel>& kernels() {
  static const auto* k = new std::map<std::string, LossKernel>{
      {"log_softmax", {log_softmax_kernel, false}},
      {"log_softmax_backward", {log_softmax_backward_kernel, true}},
      {"nll_forward", {nll_forward_kernel, false}},
      {"nll_backward", {nll_backward_kernel, true}},
  };
  return *k;
}

// The kernel the specs bind `name` to; nullptr for a name registered without one.
const LossKernel* kernel_of(const std::string& name) {
  const std::string kernel = route_kernel_of("loss_parallel", name);
  return kernel.empty() ? nullptr : &kernels().at(kernel);
}

// Only the ops in the table reach it (the route claims them, see ensure_loss_parallel_registered).
// A forward the context would own, on class-sharded input, called outside it: the record the
// ranks inside the context send first, so that a context entered on some ranks only is named
// on every rank rather than met by the ordinary rule's gather of the classes (one small
// all-gather beside that gather, or beside nll_loss's refusal).
void agree_outside_context_for(const c10::OperatorHandle& op, const std::string& kernel, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  const c10::IValue& first = torch::jit::peek(*stack, 0, n);
  if (!first.isTensor()) return;
  const at::Tensor& self = first.toTensor();
  if (kernel == "log_softmax") {
    const int64_t dim = c10::maybe_wrap_dim(torch::jit::peek(*stack, 1, n).toInt(), self.dim());
    if (is_class_sharded(self, dim)) agree_outside_context(self, dim, "log_softmax");
  } else if (kernel == "nll_forward") {
    const int64_t class_dim = class_dim_of(self.dim());
    if (is_class_sharded(self, class_dim)) agree_outside_context(self, class_dim, "nll_loss");
  }
}

bool loss_parallel_route(const c10::OperatorHandle& op, const std::string& name, torch::jit::Stack* stack) {
  if (!is_loss_parallel_active()) {
    const LossKernel* k = kernel_of(name);
    if (k && !k->backward) agree_outside_context_for(op, route_kernel_of("loss_parallel", name), stack);
    if (!k || !k->backward) return false;
  }
  return dispatch_loss_parallel(op, name, stack);
}

// cross_entropy_loss(self, target, weight, reduction, ignore_index, label_smoothing),
// registered for AutogradPrivateUse1: the whole loss reaches us before it decomposes.
void cross_entropy_loss_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 6);
  at::Tensor self = args[0].toTensor();
  at::Tensor target = args[1].toTensor();
  c10::optional<at::Tensor> weight = optional_tensor(args[2]);
  const int64_t reduction = args[3].toInt();
  const int64_t ignore_index = args[4].toInt();
  const double label_smoothing = args[5].toDouble();
  const int64_t class_dim = class_dim_of(self.dim());
  at::Tensor result;
  const bool sharded = is_class_sharded(self, class_dim);
  if (is_loss_parallel_active() && (sharded || effective_strict(current_loss_parallel_options()))) {
    result = cross_entropy_parallel(self, target, weight, reduction, ignore_index, label_smoothing);
  } else {
    if (sharded) {
      // First the record the ranks inside loss_parallel() send first: a context entered on
      // some ranks only is then the same named error on every rank (one small all-gather,
      // on this error or fallback path only).
      agree_outside_context(self, class_dim, "cross_entropy");
      if (!parallelism_config().loss_parallel_fallback_on_layout_error) {
        throw LossParallelLayoutError(
            "cross_entropy on logits sharded along the class dim (" + to_string(placements_of(self)) + " on " +
            mesh_of(self).str() +
            ") outside loss_parallel(): enter hyper_parallel::loss_parallel() "
            "(or the Trainer's train_context) around the loss and its backward, or set "
            "ParallelismConfig::loss_parallel_fallback_on_layout_error to all-gather the logits (slow)");
      }
      TORCH_WARN("cross_entropy outside loss_parallel(): all-gathering logits of shape ", self.sizes(), " sharded as ",
                 to_string(placements_of(self)), " (loss_parallel_fallback_on_layout_error is set)");
      self = redistribute(self, Placements(mesh_of(self).ndim(), Placement::replicate()));
    } else if (is_loss_parallel_active()) {
      TORCH_WARN_ONCE("loss_parallel (strict = false): logits are not sharded along the class dim (",
                      is_dtensor(self) ? to_string(placements_of(self)) : std::string("plain tensor"),
                      "); computing cross_entropy the ordinary way");
    }
    result = at::compositeimplicitautograd::cross_entropy_loss(self, target, weight, reduction, ignore_index,
                                                               label_smoothing);
  }
  torch::jit::drop(*stack, 6);
  stack->push_back(std::move(result));
}

}  // namespace

namespace {

// result into an out= argument, as ATen's out= writes: resized when it is a plain tensor
// (it receives the full value, as one process computes it); a DTensor keeps its layout
// and must already have the result's shape.
void write_out(const at::Tensor& out, const at::Tensor& result, const std::string& op, const std::string& arg) {
  if (is_dtensor(out)) {
    TORCH_CHECK_VALUE(out.sizes() == result.sizes(), op, ": the out= argument '", arg, "' has shape ", out.sizes(),
                      " but the result has shape ", result.sizes(), "; expected a DTensor of the result's shape");
    at::Tensor(out).copy_(result);
    return;
  }
  const at::Tensor value = is_dtensor(result) ? full_tensor(result).detach() : result;
  if (out.sizes() != value.sizes()) at::Tensor(out).resize_(value.sizes());
  at::Tensor(out).copy_(value);
}

}  // namespace

bool dispatch_loss_parallel(const c10::OperatorHandle& op, const std::string& name, torch::jit::Stack* stack) {
  const LossKernel* kernel = kernel_of(name);
  if (!kernel) {
    throw LossParallelUnsupportedError("loss_parallel: op '" + name +
                                       "' is in the loss_parallel op names but has no loss_parallel kernel "
                                       "(ops/*.yaml binds an op to one with `loss_parallel: <kernel>`)");
  }
  // An out= overload (nll_loss_forward.output, _log_softmax.out, ...): its out arguments
  // trail the functional ones. The kernel runs on the functional arguments; its results
  // are then written into the outs, which the op returns.
  const auto& args = op.schema().arguments();
  size_t n_out = 0;
  while (n_out < args.size() && args[args.size() - 1 - n_out].is_out()) ++n_out;
  if (n_out == 0) return kernel->run(op, stack);
  std::vector<c10::IValue> outs(stack->end() - static_cast<std::ptrdiff_t>(n_out), stack->end());
  torch::jit::drop(*stack, n_out);
  if (!kernel->run(op, stack)) {
    for (auto& v : outs) stack->push_back(std::move(v));
    return false;
  }
  std::vector<c10::IValue> results(stack->end() - static_cast<std::ptrdiff_t>(n_out), stack->end());
  torch::jit::drop(*stack, n_out);
  for (size_t i = 0; i < n_out; ++i) {
    write_out(outs[i].toTensor(), results[i].toTensor(), name, args[args.size() - n_out + i].name());
    stack->push_back(std::move(outs[i]));
  }
  return true;
}

std::vector<std::string> loss_parallel_op_names() {
  ensure_dtensor_dispatch_registered();  // the specs that bind the built-in names are loaded
  std::set<std::string> names = {kCrossEntropyLoss};
  for (const auto& kv : route_kernel_bindings("loss_parallel")) names.insert(kv.first);
  {
    std::lock_guard<std::mutex> lock(extra_names().mutex);
    names.insert(extra_names().names.begin(), extra_names().names.end());
  }
  return {names.begin(), names.end()};
}

void register_loss_parallel_op_names(const std::vector<std::string>& names) {
  {
    std::lock_guard<std::mutex> lock(extra_names().mutex);
    for (const auto& n : names) extra_names().names.insert(n);
  }
  clear_layout_cache();
}

void unregister_loss_parallel_op_names(const std::vector<std::string>& names) {
  ensure_dtensor_dispatch_registered();
  const auto built_in = route_kernel_bindings("loss_parallel");
  for (const auto& n : names) {
    TORCH_CHECK_VALUE(!built_in.count(n) && n != kCrossEntropyLoss, "unregister_loss_parallel_op_names: '", n,
                      "' is a built-in loss_parallel op name (bound to a kernel in ops/*.yaml) and cannot be removed");
  }
  {
    std::lock_guard<std::mutex> lock(extra_names().mutex);
    for (const auto& n : names) extra_names().names.erase(n);
  }
  clear_layout_cache();
}

void ensure_loss_parallel_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    OpDispatcher::add_context_route("loss_parallel", loss_parallel_route, in_table);
    static auto* lib =
        new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
    lib->impl("cross_entropy_loss", torch::CppFunction::makeFromBoxedFunction<&cross_entropy_loss_kernel>());
  });
}

// The DTensor kernels know nothing of loss_parallel: it plugs itself in when they are installed.
HP_DTENSOR_DISPATCH_INITIALIZER(ensure_loss_parallel_registered);

namespace {
// The kernel names the op specs may bind ops to, known from library load on: the specs can
// be (re)loaded before any DTensor exists (reload_distributed_ops).
const bool kernels_declared = [] {
  std::vector<std::string> names;
  for (const auto& kv : kernels()) names.push_back(kv.first);
  declare_route_kernels("loss_parallel", names);
  return true;
}();
}  // namespace

}  // namespace hyper_parallel
