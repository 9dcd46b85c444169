// Connects the PrivateUse1 dispatch key (carried by every DTensor) to OpDispatcher.
//
// A backend fallback alone is not enough: CompositeExplicitAutograd kernels
// (_log_softmax, ones_like ...) are registered for every backend key and win over a
// fallback. So the boxed kernel is also registered by name for each such op.
// CompositeImplicitAutograd ops are left alone: they must decompose above us so that
// autograd sees their parts.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "dispatch/dispatch_key_registration.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dispatch/dispatch.h"

namespace hyper_parallel {

namespace {

void dtensor_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) { OpDispatcher::dispatch(op, stack); }

bool needs_explicit_kernel(const c10::OperatorHandle& op) {
  using K = c10::DispatchKey;
  if (op.hasKernelForDispatchKey(K::CompositeImplicitAutograd)) return false;
  return op.hasKernelForDispatchKey(K::CompositeExplicitAutograd) ||
         op.hasKernelForDispatchKey(K::CompositeExplicitAutogradNonFunctional);
}

struct Initializers {
  std::mutex mutex;
  std::vector<void (*)()> pending;
  bool kernels_installed = false;
};
Initializers& initializers() {
  static auto* i = new Initializers();
  return *i;
}

void run_initializers() {
  std::vector<void (*)()> todo;
  {
    std::lock_guard<std::mutex> lock(initializers().mutex);
    initializers().kernels_installed = true;
    todo.swap(initializers().pending);
  }
  for (auto* init : todo) init();
}

}  // namespace

void add_dtensor_dispatch_initializer(void (*init)()) {
  {
    std::lock_guard<std::mutex> lock(initializers().mutex);
    if (!initializers().kernels_installed) {
      initializers().pending.push_back(init);
      return;
    }
  }
  init();
}

void ensure_dtensor_dispatch_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Kept alive for the whole process: dropping a Library deregisters its kernels.
    static auto* fallback =
        new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&dtensor_kernel>());
    // First, so that kernels the initializers register for single ops (the dispatcher's
    // unboxed fast kernels) are not overridden by the generic one below.
    run_initializers();
    static auto* by_namespace = new std::map<std::string, std::unique_ptr<torch::Library>>();
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const auto& name : dispatcher.getAllOpNames()) {
      auto handle = dispatcher.findOp(name);
      if (!handle || !needs_explicit_kernel(*handle)) continue;
      if (handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;  // an initializer's
      const std::string& full = name.name;
      const auto sep = full.find("::");
      if (sep == std::string::npos) continue;
      const std::string ns = full.substr(0, sep);
      auto& lib = (*by_namespace)[ns];
      if (!lib) {
        lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__,
                                               __LINE__);
      }
      std::string qualified = full.substr(sep + 2);
      if (!name.overload_name.empty()) qualified += "." + name.overload_name;
      lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&dtensor_kernel>());
    }
  });
  // Separate from the kernels: if a spec fails to load, every later use reports it
  // again instead of half-registering the kernels twice.
  static std::once_flag ops_once;
  std::call_once(ops_once, reload_distributed_ops);
}

namespace {
const bool hp_before_making_a_dtensor = (set_before_making_a_dtensor(&ensure_dtensor_dispatch_registered), true);
}  // namespace

}  // namespace hyper_parallel
