// Loss-parallel routing (docs/design.md, "Routing"): the loss_parallel context route in
// OpDispatcher (which ops it claims: loss_parallel_op_names.cpp), the dispatch of a routed op to
// its kernel (routed_loss_kernels.h) with out= overloads written once here, and the
// registration of the cross_entropy_loss entry (cross_entropy_route.cpp).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <mutex>
#include <string>
#include <vector>

#include "dispatch/dispatch_key_registration.h"
#include "dispatch/op_registry.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dispatch/dispatch.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/class_sharding.h"
#include "loss/front/loss_parallel_dispatch.h"
#include "loss/front/routed_loss_kernels.h"

namespace hyper_parallel {

namespace {

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

void ensure_loss_parallel_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    OpDispatcher::add_context_route("loss_parallel", loss_parallel_route, is_loss_parallel_op_name);
    static auto* lib =
        new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
    lib->impl("cross_entropy_loss", torch::CppFunction::makeFromBoxedFunction<&routed_cross_entropy_loss>());
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
