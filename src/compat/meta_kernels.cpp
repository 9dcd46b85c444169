#include "compat/meta_kernels.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

#include <memory>
#include <mutex>

namespace hyper_parallel::compat {

namespace {

at::TensorOptions meta(const at::Tensor& like, at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).device(at::kMeta);
}

at::Tensor where_self(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  const auto shape = at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  return at::empty(shape, meta(self, at::result_type(self, other)));
}

at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  std::vector<int64_t> shape = self.sizes().vec();
  if (!shape.empty()) shape[c10::maybe_wrap_dim(dim, self.dim())] = index.numel();
  return at::empty(shape, meta(self, self.scalar_type()));
}

at::Tensor embedding_dense_backward(const at::Tensor& grad, const at::Tensor& /*indices*/, c10::SymInt num_weights,
                                    c10::SymInt /*padding_idx*/, bool /*scale_grad_by_freq*/) {
  return at::empty({num_weights.expect_int(), grad.size(-1)}, meta(grad, grad.scalar_type()));
}

at::Tensor abs(const at::Tensor& self) { return at::empty(self.sizes(), meta(self, self.scalar_type())); }

at::Tensor logical_binary(const at::Tensor& a, const at::Tensor& b) {
  return at::empty(at::infer_size(a.sizes(), b.sizes()), meta(a, at::kBool));
}

at::Tensor logical_not(const at::Tensor& self) { return at::empty(self.sizes(), meta(self, at::kBool)); }

at::Tensor dot(const at::Tensor& a, const at::Tensor& /*b*/) { return at::empty({}, meta(a, a.scalar_type())); }

// c10d's collective ops have kernels for CPU and CUDA tensors. On a fake group a meta
// tensor's collective goes to the CPU kernel, which only hands the tensors to the group's
// backend (the fake one never reads them); any other group refuses meta tensors.
void collective_on_fake_group(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static const auto process_group = c10::getCustomClassType<c10::intrusive_ptr<c10d::ProcessGroup>>();
  for (const c10::IValue& v : *stack) {
    if (!v.isCustomClass() || *v.type() != *process_group) continue;  // the ReduceOp is one too
    const auto pg = v.toCustomClass<c10d::ProcessGroup>();
    TORCH_CHECK(pg->hasBackends() && pg->getBackend(c10::DeviceType::Meta)->getBackendName() == "fake",
                op.schema().name(), ": meta tensors take part only in collectives of a fake process group");
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

// A call's dispatch key comes from the highest backend among its tensors, and Meta ranks
// above PrivateUse1, the backend of a DTensor: a DTensor holding meta tensors met by a
// plain meta tensor (cross_entropy's target) would go to the meta kernels, which take the
// DTensor for a plain tensor of its global shape. Such a call goes to the DTensor's
// kernels instead; any other goes to the kernel AutogradMeta had before this one was
// registered over it (the same Autograd or CompositeImplicitAutograd kernel AutogradOther
// has).
void dtensor_before_meta_tensor(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  bool dtensor = false;
  for (const c10::IValue& v : torch::jit::last(*stack, op.schema().arguments().size())) {
    if (v.isTensor()) dtensor |= v.toTensor().key_set().has_backend(c10::BackendComponent::PrivateUse1Bit);
  }
  if (dtensor) return op.redispatchBoxed(keys.remove_backend(c10::BackendComponent::MetaBit), stack);
  op.redispatchBoxed(keys.remove(c10::DispatchKey::AutogradFunctionality).add(c10::DispatchKey::AutogradOther), stack);
}

// The same for a meta device argument, which BackendSelect adds to the tensors' keys: a
// DTensor converted with to(options) (as _to_copy's backward converts a gradient) goes to
// the DTensor's kernels, which convert its local tensor. Any other call is dispatched as
// LibTorch's BackendSelect kernel does: by the tensors and the dtype, layout and device.
void dtensor_before_meta_device(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema().arguments();
  const auto args = torch::jit::last(*stack, schema.size());
  c10::DispatchKeySet tensors;
  std::optional<at::ScalarType> dtype;
  std::optional<at::Layout> layout;
  std::optional<at::Device> device;
  for (size_t i = 0; i < schema.size(); ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) tensors = tensors | v.toTensor().key_set();
    if (v.isNone()) continue;
    if (schema[i].name() == "dtype") dtype = v.toScalarType();
    if (schema[i].name() == "layout") layout = v.toLayout();
    if (schema[i].name() == "device") device = v.toDevice();
  }
  if (!tensors.has_backend(c10::BackendComponent::PrivateUse1Bit)) {
    tensors = tensors | c10::DispatchKeySet(c10::computeDispatchKey(dtype, layout, device));
  }
  op.redispatchBoxed(tensors & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect),
                     stack);
}

// The override of _to_copy's BackendSelect kernel is meant: its warning is dropped, any
// other warning passes to the handler that was installed.
class OverrideWarningFilter : public c10::WarningHandler {
 public:
  explicit OverrideWarningFilter(c10::WarningHandler* next) : next_(next) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") == std::string::npos) next_->process(warning);
  }

 private:
  c10::WarningHandler* next_;
};

bool has_meta_kernel(const char* name, const char* overload) {
  const auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(op, "register_missing_meta_kernels: LibTorch has no operator ", name, ".", overload);
  return op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

}  // namespace

void register_missing_meta_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Kept for the life of the process: the registrations last as long as these objects.
    static auto aten =
        std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
    static auto c10d =
        std::make_unique<torch::Library>(torch::Library::IMPL, "c10d", c10::DispatchKey::Meta, __FILE__, __LINE__);
    if (!has_meta_kernel("aten::where", "self")) aten->impl("where.self", TORCH_FN(where_self));
    if (!has_meta_kernel("aten::index_select", "")) aten->impl("index_select", TORCH_FN(index_select));
    if (!has_meta_kernel("aten::embedding_dense_backward", ""))
      aten->impl("embedding_dense_backward", TORCH_FN(embedding_dense_backward));
    if (!has_meta_kernel("aten::abs", "")) aten->impl("abs", TORCH_FN(abs));
    if (!has_meta_kernel("aten::logical_and", "")) aten->impl("logical_and", TORCH_FN(logical_binary));
    if (!has_meta_kernel("aten::logical_or", "")) aten->impl("logical_or", TORCH_FN(logical_binary));
    if (!has_meta_kernel("aten::logical_not", "")) aten->impl("logical_not", TORCH_FN(logical_not));
    if (!has_meta_kernel("aten::dot", "")) aten->impl("dot", TORCH_FN(dot));
    static auto autograd_meta = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                                 c10::DispatchKey::AutogradMeta, __FILE__, __LINE__);
    autograd_meta->impl("cross_entropy_loss", torch::CppFunction::makeFromBoxedFunction<&dtensor_before_meta_tensor>());
    static auto backend_select = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                                  c10::DispatchKey::BackendSelect, __FILE__, __LINE__);
    {
      OverrideWarningFilter filter(c10::WarningUtils::get_warning_handler());
      c10::WarningUtils::WarningHandlerGuard guard(&filter);
      backend_select->impl("_to_copy", torch::CppFunction::makeFromBoxedFunction<&dtensor_before_meta_device>());
    }
    for (const char* name : {"allreduce_", "allgather_", "reduce_scatter_", "broadcast_", "scatter_"}) {
      if (!has_meta_kernel((std::string("c10d::") + name).c_str(), ""))
        c10d->impl(name, torch::CppFunction::makeFromBoxedFunction<&collective_on_fake_group>());
    }
  });
}

}  // namespace hyper_parallel::compat
