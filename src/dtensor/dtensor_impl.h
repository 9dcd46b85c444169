// DTensorImpl: the TensorImpl behind every DTensor (internal).
//
// It owns no storage: it holds the local piece and the Layout, reports the global
// sizes/strides and the local dtype/device, and carries the PrivateUse1 dispatch keys
// so that every ATen op on it reaches OpDispatcher::dispatch.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include "hyper_parallel/core/layout.h"

namespace hyper_parallel {

class DTensorImpl : public c10::TensorImpl {
 public:
  DTensorImpl(at::Tensor local, Layout layout);

  const at::Tensor& local() const { return local_; }
  const Layout& layout() const { return layout_; }
  // After an in-place view op (transpose_, unsqueeze_ ...) changed the local piece's
  // geometry: the DTensor takes the layout the view gives it.
  void set_layout_after_inplace_view(Layout layout);

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  const char* tensorimpl_type_name() const override { return "DTensorImpl"; }
  void set_global_geometry();

  at::Tensor local_;
  Layout layout_;
};

// Wraps without autograd (the result carries no history); `local` must match the
// layout's local shape on this rank.
at::Tensor make_dtensor(const at::Tensor& local, const Layout& layout);
// nullptr for plain tensors.
DTensorImpl* dtensor_impl(const at::Tensor& t);
// The local piece of a DTensor, as stored (no autograd).
const at::Tensor& local_of(const at::Tensor& dtensor);

// An op's tensor argument, DTensor or plain, as a plain tensor (no autograd).
// This rank's piece of `t` under `layout`: a DTensor is redistributed from its own
// layout, a plain tensor is taken as the replicated full value.
at::Tensor local_piece(const at::Tensor& t, const Layout& layout);
// The full value: a DTensor's pieces gathered and reduced, a plain tensor as it is.
at::Tensor full_value(const at::Tensor& t);

// Run before a DTensor is made: the dispatch layer's set-up of the DTensor dispatch key
// (src/dispatch/dispatch_key_registration.h), which it sets at library load. This layer
// is below the dispatcher, so it calls it through this hook rather than by name.
void set_before_making_a_dtensor(void (*hook)());

}  // namespace hyper_parallel
