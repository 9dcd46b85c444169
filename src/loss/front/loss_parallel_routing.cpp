// Loss-parallel routing (docs/design.md, "Routing"): the loss_parallel context route in OpDispatcher, the
// op-name table, and the cross_entropy_loss entry that sends the whole loss to the fused kernel
// (the per-op kernels it routes to: routed_loss_kernels.h).
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
#include "loss/call/loss_call_plan.h"
#include "loss/call/loss_input_checks.h"
#include "loss/front/loss_parallel_dispatch.h"
#include "loss/front/routed_loss_kernels.h"

namespace hyper_parallel {

namespace {

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

// The kernel the specs bind `name` to; nullptr for a name registered without one.
const LossKernel* kernel_of(const std::string& name) {
  const std::string kernel = route_kernel_of("loss_parallel", name);
  return kernel.empty() ? nullptr : &routed_loss_kernels().at(kernel);
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
  for (const auto& kv : routed_loss_kernels()) names.push_back(kv.first);
  declare_route_kernels("loss_parallel", names);
  return true;
}();
}  // namespace

}  // namespace hyper_parallel
