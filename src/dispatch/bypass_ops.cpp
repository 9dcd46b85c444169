#include "dispatch/bypass_ops.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

#include <unordered_map>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"

namespace hyper_parallel {

namespace {

// Same layout, op applied to the local piece (detach, alias, lift_fresh).
void same_layout(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  at::Tensor self = (*stack)[stack->size() - n].toTensor();
  const Layout& layout = layout_of(self);
  torch::jit::Stack local(stack->end() - n, stack->end());
  local[0] = local_of(self);
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.callBoxed(&local);
  }
  torch::jit::drop(*stack, n);
  stack->push_back(make_dtensor(local[0].toTensor(), layout));
}

// item(): the replicated value.
void local_scalar(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::Tensor self = torch::jit::pop(*stack).toTensor();
  torch::jit::Stack local{full_value(self)};
  op.callBoxed(&local);
  stack->push_back(local[0]);
}

// equal(a, b): compares full values; every rank gets the same answer.
void equal(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::Tensor b = torch::jit::pop(*stack).toTensor();
  at::Tensor a = torch::jit::pop(*stack).toTensor();
  torch::jit::Stack local{full_value(a), full_value(b)};
  op.callBoxed(&local);
  stack->push_back(local[0]);
}

// copy_(self, src, non_blocking): src is brought to self's layout (a plain src is
// taken as replicated); a plain self receives src's full value.
void copy_(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::IValue non_blocking = torch::jit::pop(*stack);
  at::Tensor src = torch::jit::pop(*stack).toTensor();
  at::Tensor self = torch::jit::pop(*stack).toTensor();
  at::Tensor dst_local, src_local;
  if (auto* dst = dtensor_impl(self)) {
    const Layout& to = dst->layout();
    dst_local = dst->local();
    if (auto* s = dtensor_impl(src)) {
      TORCH_CHECK(s->layout().shape() == to.shape() || src.dim() == 0 || s->layout().is_replicated(),
                  "copy_: cannot copy a DTensor of shape ", src.sizes(), " into one of shape ", self.sizes());
      src_local = s->layout().shape() == to.shape() ? local_piece(src, to) : full_value(src);
    } else {
      src_local = src;
    }
    if (src_local.dim() > 0 && src_local.sizes() != dst_local.sizes() && src_local.sizes() == self.sizes()) {
      // A full plain source: take this rank's piece of it.
      src_local = local_piece(src_local, to);
    }
  } else {
    dst_local = self;
    src_local = full_value(src);
  }
  torch::jit::Stack local{dst_local, src_local, non_blocking};
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.callBoxed(&local);
  }
  stack->push_back(self);
}

const std::unordered_map<std::string, BypassHandler>& handlers() {
  static const auto* table = new std::unordered_map<std::string, BypassHandler>{
      {"detach", same_layout},
      {"alias", same_layout},
      {"lift_fresh", same_layout},
      {"_local_scalar_dense", local_scalar},
      {"equal", equal},
      {"copy_", copy_},
  };
  return *table;
}

}  // namespace

BypassHandler find_bypass_op(const std::string& name) {
  auto it = handlers().find(name);
  return it == handlers().end() ? nullptr : it->second;
}

}  // namespace hyper_parallel
