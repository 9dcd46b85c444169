#include "dispatch/common_layout_fast_path.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>

namespace hyper_parallel {

namespace {

// What KeepsACommonLayout promises about: contiguous (the rules' outputs are), no
// Partial, no tensor dim sharded by two mesh dims. Written out rather than
// Layout::has_nested_shards(), which allocates: this runs on every qualifying call.
bool layout_qualifies(const at::Tensor& t, const Layout& layout) {
  if (!t.is_contiguous()) return false;
  const Placements& ps = layout.placements();
  for (size_t m = 0; m < ps.size(); ++m) {
    if (ps[m].is_partial()) return false;
    if (!ps[m].is_shard()) continue;
    for (size_t k = m + 1; k < ps.size(); ++k) {
      if (ps[k].is_shard(ps[m].dim())) return false;
    }
  }
  return true;
}

}  // namespace

bool CommonLayout::add(const at::Tensor& t) {
  const DTensorImpl* impl = dtensor_impl(t);
  if (!impl) return false;
  if (!first_) {
    if (!layout_qualifies(t, impl->layout())) return false;
    first_ = impl;
    return true;
  }
  return impl->layout() == first_->layout();
}

bool run_on_common_layout(const c10::OperatorHandle& op, const OpResolution& res, torch::jit::Stack* stack) {
  const size_t nargs = op.schema().arguments().size();
  c10::IValue* args = stack->data() + stack->size() - nargs;
  CommonLayout common;
  for (size_t i = 0; i < nargs; ++i) {
    const c10::IValue& v = args[i];
    if (v.isList()) return false;  // tensors inside lists: the general path
    if (v.isTensor() && v.toTensor().defined() && !common.add(v.toTensor())) return false;
  }
  if (!common.first()) return false;
  // Copied: once the arguments are replaced by their pieces, a boxed caller's stack may
  // have held the only reference to the DTensors.
  const Layout layout = common.first()->layout();
  const at::Tensor self = res.writes ? args[0].toTensor() : at::Tensor();
  for (size_t i = 0; i < nargs; ++i) {
    if (args[i].isTensor() && args[i].toTensor().defined()) args[i] = dtensor_impl(args[i].toTensor())->local();
  }
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.callBoxed(stack);
  }
  c10::IValue& result = stack->back();
  if (res.writes) {
    TORCH_CHECK(result.toTensor().is_same(local_of(self)), op.schema().name(),
                ": the local in-place op returned another tensor than self's piece");
    result = self;
  } else {
    result = make_dtensor(result.toTensor(), layout);
  }
  return true;
}

}  // namespace hyper_parallel
