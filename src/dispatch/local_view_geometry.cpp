#include "dispatch/local_view_geometry.h"

#include <ATen/core/alias_info.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <typeinfo>

#include "compat/strided_view.h"

namespace hyper_parallel {

namespace {

// The local call, made below autograd, would reach the CPU or CUDA kernel with nothing in
// front of it: the keys the dispatcher would compute for it, with this thread's included and
// excluded keys, start at the backend. (A dispatch mode, autocast, a conjugate or negative
// bit, functionalization or a non-strided layout each put a key in front.) BackendSelect is
// always included and only ever picks a backend for factory functions.
bool goes_straight_to_the_kernel(const at::Tensor& t) {
  const c10::impl::LocalDispatchKeySet tls = c10::impl::tls_local_dispatch_key_set();
  const c10::DispatchKeySet keys =
      ((t.key_set() | tls.included_) - tls.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView)
          .remove(c10::DispatchKey::BackendSelect);
  const c10::DispatchKey top = keys.highestPriorityTypeId();
  if (top != c10::DispatchKey::CPU && top != c10::DispatchKey::CUDA) return false;
  return !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

template <class Geometry>
bool set_geometry(Geometry& g, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  if (sizes.size() > g.sizes.size()) return false;
  g.dim = sizes.size();
  std::copy(sizes.begin(), sizes.end(), g.sizes.begin());
  std::copy(strides.begin(), strides.end(), g.strides.begin());
  return true;
}

}  // namespace

bool returns_view_of_self(const c10::FunctionSchema& schema) {
  if (schema.arguments().empty() || schema.returns().size() != 1) return false;
  const c10::AliasInfo* in = schema.arguments()[0].alias_info();
  const c10::AliasInfo* out = schema.returns()[0].alias_info();
  return in && out && !in->isWrite() && !out->isWrite() && in->beforeSets() == out->beforeSets();
}

at::Tensor LocalViewGeometry::remake(const at::Tensor& local) const {
  if (!recorded_) return {};
  const c10::IntArrayRef sizes = local.sizes(), strides = local.strides();
  if (sizes.size() != input_.dim || !std::equal(sizes.begin(), sizes.end(), input_.sizes.begin()) ||
      !std::equal(strides.begin(), strides.end(), input_.strides.begin()) || !goes_straight_to_the_kernel(local)) {
    return {};
  }
  return compat::strided_view(local, {output_.sizes.data(), output_.dim}, {output_.strides.data(), output_.dim},
                              local.storage_offset() + offset_shift_);
}

void LocalViewGeometry::record(const at::Tensor& local, const at::Tensor& view) {
  recorded_ = false;
  if (!goes_straight_to_the_kernel(local) || !view.defined()) return;
  // A plain view on the same storage with the input's keys: what as_strided makes.
  const c10::TensorImpl* impl = view.unsafeGetTensorImpl();
  if (typeid(*impl) != typeid(c10::TensorImpl) || view.key_set() != local.key_set() || view.dtype() != local.dtype() ||
      impl->has_symbolic_sizes_strides() || !view.storage().is_alias_of(local.storage())) {
    return;
  }
  if (!set_geometry(input_, local.sizes(), local.strides()) || !set_geometry(output_, view.sizes(), view.strides())) {
    return;
  }
  offset_shift_ = view.storage_offset() - local.storage_offset();
  recorded_ = true;
}

}  // namespace hyper_parallel
