// How a loss's errors name the call (internal): the agreements and the checks share it, so it
// lives below both of them.
#pragma once

#include <string>

namespace hyper_parallel {

// "<op> under loss_parallel" for the DTensor route's ops, the bare name for the functions on
// local pieces (vocab_parallel_*), which no context surrounds.
inline std::string loss_call_site(const std::string& op) {
  return op.rfind("vocab_parallel_", 0) == 0 ? op : op + " under loss_parallel";
}

}  // namespace hyper_parallel
