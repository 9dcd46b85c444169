// dispatch_key_registration.h — the PrivateUse1 dispatch key every DTensor carries,
// connected to OpDispatcher (dispatch_key_registration.cpp says how).
#pragma once

namespace hyper_parallel {

// Installs the dispatch-key kernels (once per process); run before the first DTensor is
// made (dtensor_impl.h's hook) and by features that need the kernels before that.
void ensure_dtensor_dispatch_registered();
// Features built on the dispatcher (loss_parallel, the unboxed fast kernels) hook
// themselves up here instead of being called by name from the generic code: `init` runs
// once, right after the fallback is installed and before the generic kernel is registered
// for single ops, which it leaves alone where an initializer registered a kernel (or at
// once, if the kernels are installed already).
void add_dtensor_dispatch_initializer(void (*init)());
// Registers an initializer at library load: HP_DTENSOR_DISPATCH_INITIALIZER(fn).
#define HP_DTENSOR_DISPATCH_INITIALIZER(FN) \
  static const bool hp_dispatch_initializer_##FN = (::hyper_parallel::add_dtensor_dispatch_initializer(&FN), true)

}  // namespace hyper_parallel
