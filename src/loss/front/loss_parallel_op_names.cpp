// The loss_parallel op-name table (loss_parallel.h's loss_parallel_op_names): the names the
// op specs bind to a loss_parallel kernel (ops/*.yaml), cross_entropy_loss (registered with
// LibTorch, not routed), and names registered at run time. The route claims exactly these.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dispatch/dispatch_key_registration.h"
#include "dispatch/op_registry.h"
#include "hyper_parallel/dispatch/dispatch.h"
#include "hyper_parallel/loss/loss_parallel.h"
#include "loss/front/loss_parallel_dispatch.h"

namespace hyper_parallel {

namespace {

// The fused entry: cross_entropy_loss is registered with LibTorch (cross_entropy_route.cpp),
// not routed.
constexpr const char* kCrossEntropyLoss = "cross_entropy_loss";

// Names registered at run time (register_loss_parallel_op_names); the ops the specs bind
// to a loss_parallel kernel (ops/*.yaml, `loss_parallel: <kernel>`) are the built-in ones.
struct ExtraNames {
  std::mutex mutex;
  std::set<std::string> names;
};
ExtraNames& extra_names() {
  static ExtraNames* t = new ExtraNames();
  return *t;
}

}  // namespace

bool is_loss_parallel_op_name(const std::string& name) {
  if (!route_kernel_of("loss_parallel", name).empty()) return true;
  std::lock_guard<std::mutex> lock(extra_names().mutex);
  return extra_names().names.count(name) > 0;
}

std::vector<std::string> loss_parallel_op_names() {
  ensure_dtensor_dispatch_registered();  // the specs that bind the built-in names are loaded
  std::set<std::string> names = {kCrossEntropyLoss};
  for (const auto& kv : route_kernel_bindings("loss_parallel")) names.insert(kv.first);
  {
    std::lock_guard<std::mutex> lock(extra_names().mutex);
    names.insert(extra_names().names.begin(), extra_names().names.end());
  }
  return {names.begin(), names.end()};
}

void register_loss_parallel_op_names(const std::vector<std::string>& names) {
  {
    std::lock_guard<std::mutex> lock(extra_names().mutex);
    for (const auto& n : names) extra_names().names.insert(n);
  }
  clear_layout_cache();
}

void unregister_loss_parallel_op_names(const std::vector<std::string>& names) {
  ensure_dtensor_dispatch_registered();
  const auto built_in = route_kernel_bindings("loss_parallel");
  for (const auto& n : names) {
    TORCH_CHECK_VALUE(!built_in.count(n) && n != kCrossEntropyLoss, "unregister_loss_parallel_op_names: '", n,
                      "' is a built-in loss_parallel op name (bound to a kernel in ops/*.yaml) and cannot be removed");
  }
  {
    std::lock_guard<std::mutex> lock(extra_names().mutex);
    for (const auto& n : names) extra_names().names.erase(n);
  }
  clear_layout_cache();
}

}  // namespace hyper_parallel
