// Unboxed DTensor kernels for the ops small-tensor code calls most (internal).
//
// LibTorch's boxed fallback boxes every call twice: the arguments into a stack for the
// fallback, and again for the local op; the general path adds an OpCall, a cache key and
// copies of the stack. For a small op that is most of its cost, so these ops get an
// unboxed kernel at the DTensor key that calls the local op directly when it can:
// - pointwise ops (UnboxedKernel): DTensors of one layout the rule keeps, the conditions
//   of the common-layout fast path (common_layout_fast_path.h) checked on typed arguments;
// - reductions and views of one DTensor (MemoisedKernel): the output layout memoised per
//   input layout and static arguments (local_call_layout.h), decided once by the general
//   path; a view's local piece remade from the geometry its op made before
//   (local_view_geometry.h).
// Any call that does not qualify is boxed and sent to OpDispatcher::dispatch, exactly as
// the fallback would send it.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addcdiv.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/div.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/lerp.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/permute.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/squeeze.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/t.h>
#include <ATen/ops/transpose.h>
#include <ATen/ops/unsqueeze.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "dispatch/common_layout_fast_path.h"
#include "dispatch/layout_cache.h"
#include "dispatch/local_call_layout.h"
#include "dispatch/local_view_geometry.h"
#include "dispatch/op_resolution.h"
#include "dispatch/dispatch_key_registration.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dispatch/dispatch.h"

namespace hyper_parallel {

namespace {

// One typed argument: tensors join the common-layout search, anything else is static.
inline bool joins(CommonLayout& common, const at::Tensor& t) { return common.add(t); }
template <class T>
bool joins(CommonLayout&, const T&) {
  return true;
}

// A typed argument as the local op takes it: a DTensor's piece, anything else unchanged.
template <class A>
struct Local {
  static A of(A a) { return a; }
};
template <>
struct Local<const at::Tensor&> {
  static const at::Tensor& of(const at::Tensor& t) { return dtensor_impl(t)->local(); }
};
template <>
struct Local<at::Tensor&> {
  // The handle is not changed, only the values it points at (in-place ops).
  static at::Tensor& of(at::Tensor& t) { return const_cast<at::Tensor&>(dtensor_impl(t)->local()); }
};

template <class First, class... Rest>
First first_of(First first, Rest&&...) {
  return first;
}

template <class Op>
const c10::OperatorHandle& op_handle() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
  return op;
}

// Boxes the call and sends it to the general path, as LibTorch's fallback would.
template <class Ret, class... Args>
Ret dispatch_boxed(const c10::OperatorHandle& op, Args... args) {
  torch::jit::Stack stack;
  stack.reserve(sizeof...(Args));
  (stack.emplace_back(args), ...);
  OpDispatcher::dispatch(op, &stack);
  if constexpr (std::is_same_v<Ret, at::Tensor&>) {
    return first_of<Ret>(args...);  // the dispatcher wrote into self and handed it back
  } else {
    return std::move(stack.back()).toTensor();
  }
}

template <template <class, class> class Kernel, class Op>
void register_kernel(torch::Library& lib) {
  std::string name = std::string(Op::name).substr(std::string(Op::name).find("::") + 2);
  if (*Op::overload_name) name += std::string(".") + Op::overload_name;
  lib.impl(name.c_str(), TORCH_FN((Kernel<Op, typename Op::schema>::call)));
}

template <class Op, class Schema = typename Op::schema>
struct UnboxedKernel;

// Ret is at::Tensor (a new result) or at::Tensor& (in place into self, the first argument).
template <class Op, class Ret, class... Args>
struct UnboxedKernel<Op, Ret(Args...)> {
  static constexpr bool in_place = std::is_same_v<Ret, at::Tensor&>;

  // takes_common_layout_fast_path(op), memoised per operator for every thread until the
  // registry changes: the thread-local table's lookup was a tenth of a small add's cost.
  static bool fast_path_allowed(const c10::OperatorHandle& op) {
    static std::atomic<uint64_t> memo{0};  // generation << 1 | allowed; generations start at 1
    const uint64_t generation = op_resolution_generation();
    const uint64_t m = memo.load(std::memory_order_relaxed);
    if (m >> 1 == generation) return m & 1;
    const bool allowed = takes_common_layout_fast_path(op);
    memo.store(generation << 1 | uint64_t{allowed}, std::memory_order_relaxed);
    return allowed;
  }

  static Ret call(Args... args) {
    const c10::OperatorHandle& op = op_handle<Op>();
    if (fast_path_allowed(op)) {
      CommonLayout common;
      if ((joins(common, args) && ...) && common.first()) {
        if constexpr (in_place) {
          at::AutoDispatchBelowADInplaceOrView below_autograd;
          Op::call(Local<Args>::of(args)...);
          return first_of<Ret>(args...);
        } else {
          // The caller holds the arguments until this returns, so their layout lives too.
          const Layout& layout = common.first()->layout();
          at::Tensor local;
          {
            at::AutoDispatchBelowADInplaceOrView below_autograd;
            local = Op::call(Local<Args>::of(args)...);
          }
          // Registered and checked already: the pieces share one shape, and so does the result.
          return at::Tensor(c10::make_intrusive<DTensorImpl>(std::move(local), layout));
        }
      }
    }
    return dispatch_boxed<Ret, Args...>(op, args...);
  }
};

// A static argument as memo words; the op fixes the arguments' types and order.
inline void push_words(LayoutMemoArgs& a, int64_t v) { a.push(static_cast<uint64_t>(v)); }
inline void push_words(LayoutMemoArgs& a, bool v) { a.push(v); }
inline void push_words(LayoutMemoArgs& a, std::optional<at::ScalarType> v) {
  a.push(v ? static_cast<uint64_t>(*v) + 1 : 0);
}
inline void push_words(LayoutMemoArgs& a, at::IntArrayRef v) {
  a.push(v.size());
  for (int64_t x : v) a.push(static_cast<uint64_t>(x));
}
inline void push_words(LayoutMemoArgs& a, at::OptionalIntArrayRef v) {
  a.push(v.has_value());
  if (v) push_words(a, *v);
}

template <class Op, class Schema = typename Op::schema>
struct MemoisedKernel;

// One DTensor (self) and static arguments, one new tensor returned.
template <class Op, class... Static>
struct MemoisedKernel<Op, at::Tensor(const at::Tensor&, Static...)> {
  static at::Tensor call(const at::Tensor& self, Static... args) {
    const c10::OperatorHandle& op = op_handle<Op>();
    if (const DTensorImpl* impl = dtensor_impl(self)) {
      LayoutMemoArgs words;
      (push_words(words, args), ...);
      if (words.fits) {
        const c10::FunctionSchema* key = &op.schema();
        const Layout& input = impl->layout();
        LayoutMemoEntry* entry = layout_memo_find(key, input, words);
        std::optional<Layout> inserted;
        if (!entry) {
          torch::jit::Stack stack;
          stack.reserve(1 + sizeof...(Static));
          stack.emplace_back(self);
          (stack.emplace_back(args), ...);
          inserted = local_call_output_layout(op, stack);
          entry = layout_memo_insert(key, input, words, inserted);
        }
        const std::optional<Layout>& output = entry ? entry->output : inserted;
        if (output) {
          static const bool view = returns_view_of_self(op.schema());
          at::Tensor local;
          if (view && entry) local = entry->view.remake(impl->local());
          if (!local.defined()) {
            at::AutoDispatchBelowADInplaceOrView below_autograd;
            local = Op::call(impl->local(), args...);
            if (view && entry) entry->view.record(impl->local(), local);
          }
          TORCH_CHECK(local.sizes() == c10::IntArrayRef(output->local_shape()), op.schema().name(),
                      ": the local result has shape ", local.sizes(), " but the memoised output ", output->str(),
                      " gives this rank ", c10::IntArrayRef(output->local_shape()));
          return at::Tensor(c10::make_intrusive<DTensorImpl>(std::move(local), *output));
        }
      }
    }
    return dispatch_boxed<at::Tensor, const at::Tensor&, Static...>(op, self, args...);
  }
};

// Registered before the generic kernels, which then leave these ops alone.
void register_unboxed_kernels() {
  static auto* lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  namespace ops = at::_ops;
  register_kernel<UnboxedKernel, ops::add_Tensor>(*lib);
  register_kernel<UnboxedKernel, ops::sub_Tensor>(*lib);
  register_kernel<UnboxedKernel, ops::mul_Tensor>(*lib);
  register_kernel<UnboxedKernel, ops::div_Tensor>(*lib);
  register_kernel<UnboxedKernel, ops::add__Tensor>(*lib);
  register_kernel<UnboxedKernel, ops::sub__Tensor>(*lib);
  register_kernel<UnboxedKernel, ops::mul__Tensor>(*lib);
  register_kernel<UnboxedKernel, ops::div__Tensor>(*lib);
  register_kernel<UnboxedKernel, ops::mul_Scalar>(*lib);
  register_kernel<UnboxedKernel, ops::mul__Scalar>(*lib);
  register_kernel<UnboxedKernel, ops::add_Scalar>(*lib);
  register_kernel<UnboxedKernel, ops::add__Scalar>(*lib);
  register_kernel<UnboxedKernel, ops::div_Scalar>(*lib);
  register_kernel<UnboxedKernel, ops::div__Scalar>(*lib);
  // The optimizers' updates and the activations' simplest parts.
  register_kernel<UnboxedKernel, ops::addcmul_>(*lib);
  register_kernel<UnboxedKernel, ops::addcdiv_>(*lib);
  register_kernel<UnboxedKernel, ops::lerp__Scalar>(*lib);
  register_kernel<UnboxedKernel, ops::sqrt>(*lib);
  register_kernel<UnboxedKernel, ops::exp>(*lib);
  register_kernel<UnboxedKernel, ops::neg>(*lib);
  // Reductions and views of one DTensor.
  register_kernel<MemoisedKernel, ops::sum>(*lib);
  register_kernel<MemoisedKernel, ops::sum_dim_IntList>(*lib);
  register_kernel<MemoisedKernel, ops::mean>(*lib);
  register_kernel<MemoisedKernel, ops::mean_dim>(*lib);
  register_kernel<MemoisedKernel, ops::amax>(*lib);
  register_kernel<MemoisedKernel, ops::amin>(*lib);
  register_kernel<MemoisedKernel, ops::transpose_int>(*lib);
  register_kernel<MemoisedKernel, ops::t>(*lib);
  register_kernel<MemoisedKernel, ops::permute>(*lib);
  register_kernel<MemoisedKernel, ops::unsqueeze>(*lib);
  register_kernel<MemoisedKernel, ops::squeeze_dim>(*lib);
}

}  // namespace

HP_DTENSOR_DISPATCH_INITIALIZER(register_unboxed_kernels);

}  // namespace hyper_parallel
