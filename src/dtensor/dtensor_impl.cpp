#include "dtensor/dtensor_impl.h"

#include <ATen/core/TensorBody.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <utility>

#include "core/redistribute.h"

namespace hyper_parallel {

namespace {
c10::DispatchKeySet dtensor_key_set() {
  return c10::DispatchKeySet({c10::DispatchKey::PrivateUse1, c10::DispatchKey::AutogradPrivateUse1});
}

// Keeps only data: the wrapper, not its piece, carries autograd history. (Taken by value
// and moved: a copy's two atomic reference-count updates showed in a small op's cost.)
at::Tensor plain_local(at::Tensor local) { return local.requires_grad() ? local.detach() : std::move(local); }
}  // namespace

DTensorImpl::DTensorImpl(at::Tensor local, Layout layout)
    : c10::TensorImpl(dtensor_key_set(), local.dtype(), local.device()),
      local_(plain_local(std::move(local))),
      layout_(std::move(layout)) {
  set_storage_access_should_throw();
  set_global_geometry();
}

void DTensorImpl::set_global_geometry() { set_sizes_and_strides(layout_.shape(), layout_.stride()); }

void DTensorImpl::set_layout_after_inplace_view(Layout layout) {
  TORCH_CHECK(local_.sizes() == c10::IntArrayRef(layout.local_shape()), "in-place view: the local piece has shape ",
              local_.sizes(), " but ", layout.str(), " gives this rank ", c10::IntArrayRef(layout.local_shape()));
  layout_ = std::move(layout);
  set_global_geometry();
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                                         bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<DTensorImpl>(local_, layout_);
  copy_tensor_metadata(this, impl.get(), version_counter, allow_tensor_metadata_change);
  impl->refresh_numel();
  impl->refresh_contiguous();
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                                         bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<DTensorImpl>(local_, layout_);
  copy_tensor_metadata(this, impl.get(), std::move(version_counter), allow_tensor_metadata_change);
  impl->refresh_numel();
  impl->refresh_contiguous();
  return impl;
}

void DTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<DTensorImpl*>(impl.get());
  TORCH_CHECK(other, "cannot set the data of a DTensor from a plain tensor; expected a DTensor");
  copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
  local_ = other->local_;
  layout_ = other->layout_;
  refresh_numel();
  refresh_contiguous();
}

namespace {
std::atomic<void (*)()> before_making_a_dtensor{nullptr};
}  // namespace

void set_before_making_a_dtensor(void (*hook)()) { before_making_a_dtensor.store(hook, std::memory_order_release); }

at::Tensor make_dtensor(const at::Tensor& local, const Layout& layout) {
  auto* before = before_making_a_dtensor.load(std::memory_order_acquire);
  TORCH_CHECK(before,
              "make_dtensor: the DTensor dispatch key is not connected to the dispatcher (the library's "
              "dispatch layer sets it at load)");
  before();
  TORCH_CHECK(local.defined(), "cannot make a DTensor from an undefined local tensor");
  TORCH_CHECK(!dtensor_impl(local), "the local piece of a DTensor must be a plain tensor");
  TORCH_CHECK(local.sizes() == c10::IntArrayRef(layout.local_shape()), "local tensor of shape ", local.sizes(),
              " does not match ", layout.str(), ", which gives rank ", layout.mesh().get_rank(), " a piece of shape ",
              c10::IntArrayRef(layout.local_shape()));
  return at::Tensor(c10::make_intrusive<DTensorImpl>(local, layout));
}

DTensorImpl* dtensor_impl(const at::Tensor& t) {
  if (!t.defined() || !t.key_set().has(c10::DispatchKey::PrivateUse1)) return nullptr;
  // The key is ours: the DTensor kernels are registered as PrivateUse1's fallback for the
  // whole process, so no other backend's tensors can use it alongside. (A dynamic_cast
  // here cost ~5 % of a small op: this runs several times per dispatched op.)
  return static_cast<DTensorImpl*>(t.unsafeGetTensorImpl());
}

const at::Tensor& local_of(const at::Tensor& dtensor) {
  auto* impl = dtensor_impl(dtensor);
  TORCH_CHECK(impl, "expected a DTensor, got a plain tensor of shape ", dtensor.sizes());
  return impl->local();
}

at::Tensor local_piece(const at::Tensor& t, const Layout& layout) {
  if (auto* impl = dtensor_impl(t)) return redistribute_local(impl->local(), impl->layout(), layout);
  return redistribute_local(t, layout.with_placements(Placements(layout.mesh().ndim(), Placement::replicate())),
                            layout);
}

at::Tensor full_value(const at::Tensor& t) {
  auto* impl = dtensor_impl(t);
  if (!impl) return t;
  const Layout& l = impl->layout();
  return redistribute_local(impl->local(), l, l.with_placements(Placements(l.mesh().ndim(), Placement::replicate())));
}

}  // namespace hyper_parallel
