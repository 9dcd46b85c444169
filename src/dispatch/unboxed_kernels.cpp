// Unboxed DTensor kernels for the pointwise ops small-tensor code calls most (internal).
//
// The common-layout fast path (common_layout_fast_path.h) run from LibTorch's boxed
// fallback still boxes every call twice: the arguments into a stack for the fallback,
// and again for the local op. For binary arithmetic and an optimizer's in-place updates
// that is a large part of a small op's cost, so these ops get an unboxed kernel at the
// DTensor key: it checks the same conditions on its typed arguments and calls the local
// op directly. Any call that does not qualify is boxed and sent to OpDispatcher::dispatch,
// exactly as the fallback would send it.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addcdiv.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/div.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/lerp.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/sub.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "dispatch/common_layout_fast_path.h"
#include "dispatch/op_resolution.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dispatch.h"

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

template <class Op, class Schema = typename Op::schema>
struct UnboxedKernel;

// Ret is at::Tensor (a new result) or at::Tensor& (in place into self, the first argument).
template <class Op, class Ret, class... Args>
struct UnboxedKernel<Op, Ret(Args...)> {
  static constexpr bool in_place = std::is_same_v<Ret, at::Tensor&>;

  static const c10::OperatorHandle& handle() {
    static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    return op;
  }

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
    const c10::OperatorHandle& op = handle();
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
    torch::jit::Stack stack;
    stack.reserve(sizeof...(Args));
    (stack.emplace_back(args), ...);
    OpDispatcher::dispatch(op, &stack);
    if constexpr (in_place) {
      return first_of<Ret>(args...);  // the dispatcher wrote into self and handed it back
    } else {
      return std::move(stack.back()).toTensor();
    }
  }

  static void register_at(torch::Library& lib) {
    std::string name = std::string(Op::name).substr(std::string(Op::name).find("::") + 2);
    if (*Op::overload_name) name += std::string(".") + Op::overload_name;
    lib.impl(name.c_str(), TORCH_FN(call));
  }
};

// Registered before the generic kernels, which then leave these ops alone.
void register_unboxed_kernels() {
  static auto* lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  namespace ops = at::_ops;
  UnboxedKernel<ops::add_Tensor>::register_at(*lib);
  UnboxedKernel<ops::sub_Tensor>::register_at(*lib);
  UnboxedKernel<ops::mul_Tensor>::register_at(*lib);
  UnboxedKernel<ops::div_Tensor>::register_at(*lib);
  UnboxedKernel<ops::add__Tensor>::register_at(*lib);
  UnboxedKernel<ops::sub__Tensor>::register_at(*lib);
  UnboxedKernel<ops::mul__Tensor>::register_at(*lib);
  UnboxedKernel<ops::div__Tensor>::register_at(*lib);
  UnboxedKernel<ops::mul_Scalar>::register_at(*lib);
  UnboxedKernel<ops::mul__Scalar>::register_at(*lib);
  UnboxedKernel<ops::add_Scalar>::register_at(*lib);
  UnboxedKernel<ops::add__Scalar>::register_at(*lib);
  UnboxedKernel<ops::div_Scalar>::register_at(*lib);
  UnboxedKernel<ops::div__Scalar>::register_at(*lib);
  // The optimizers' updates and the activations' simplest parts.
  UnboxedKernel<ops::addcmul_>::register_at(*lib);
  UnboxedKernel<ops::addcdiv_>::register_at(*lib);
  UnboxedKernel<ops::lerp__Scalar>::register_at(*lib);
  UnboxedKernel<ops::sqrt>::register_at(*lib);
  UnboxedKernel<ops::exp>::register_at(*lib);
  UnboxedKernel<ops::neg>::register_at(*lib);
}

}  // namespace

HP_DTENSOR_DISPATCH_INITIALIZER(register_unboxed_kernels);

}  // namespace hyper_parallel
