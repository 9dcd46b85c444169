// The loss_parallel context: thread-local state (the C++ ContextVar), re-entrant.
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>

#include "dispatch/layout_cache.h"
#include "hyper_parallel/dispatch/dispatch.h"
#include "hyper_parallel/loss/loss_parallel.h"
#include "hyper_parallel/loss/parallelism_config.h"

namespace hyper_parallel {

namespace {

// Part of every layout-cache key while the context is active (docs/design.md, "Routing").
constexpr uint64_t kLossParallelToken = 0x4c6f737350617231ULL;  // "LossPar1"

struct ContextState {
  int64_t depth = 0;
  LossParallelOptions options;
  uint64_t previous_token = 0;
};
thread_local ContextState tls_state;

std::mutex config_mutex;
ParallelismConfig global_config;

bool same_options(const LossParallelOptions& a, const LossParallelOptions& b) {
  const bool mesh_ok = a.mesh.has_value() == b.mesh.has_value() && (!a.mesh || *a.mesh == *b.mesh);
  return mesh_ok && a.strict == b.strict && a.z_loss_weight == b.z_loss_weight && a.logit_softcap == b.logit_softcap &&
         a.gradient_in_forward == b.gradient_in_forward;
}

std::string describe(const LossParallelOptions& o) {
  return std::string("{mesh = ") + (o.mesh ? o.mesh->str() : "none") +
         ", strict = " + (o.strict ? (*o.strict ? "true" : "false") : "unset") +
         ", z_loss_weight = " + std::to_string(o.z_loss_weight) +
         ", logit_softcap = " + std::to_string(o.logit_softcap) +
         ", gradient_in_forward = " + (o.gradient_in_forward ? "true" : "false") + "}";
}

}  // namespace

ParallelismConfig parallelism_config() {
  std::lock_guard<std::mutex> lock(config_mutex);
  return global_config;
}

void set_parallelism_config(const ParallelismConfig& config) {
  {
    std::lock_guard<std::mutex> lock(config_mutex);
    global_config = config;
  }
  // Rules read the config (nll_loss's fallback): decisions cached under the old one go.
  clear_layout_cache();
}

LossParallelGuard::LossParallelGuard(const LossParallelOptions& options) {
  if (parallelism_config().disable_loss_parallel) {
    static std::once_flag warned;
    std::call_once(warned, [] {
      TORCH_WARN(
          "loss_parallel(): ParallelismConfig::disable_loss_parallel is set, so the "
          "guard activates nothing (the config takes precedence)");
    });
    return;
  }
  ContextState& s = tls_state;
  if (s.depth > 0) {
    // An inner guard may repeat the outer options or give none; it may not change them.
    const bool no_options = same_options(options, LossParallelOptions{});
    if (!no_options && !same_options(options, s.options)) {
      throw LossParallelLayoutError("loss_parallel(): a nested guard with options " + describe(options) +
                                    " contradicts the enclosing guard's " + describe(s.options) +
                                    "; expected no options or the same ones");
    }
  } else {
    s.options = options;
    s.previous_token = exchange_layout_cache_context_token(kLossParallelToken);
  }
  ++s.depth;
  engaged_ = true;
}

LossParallelGuard::LossParallelGuard(LossParallelGuard&& other) noexcept : engaged_(other.engaged_) {
  other.engaged_ = false;
}

LossParallelGuard::~LossParallelGuard() {
  if (!engaged_) return;
  ContextState& s = tls_state;
  if (--s.depth == 0) {
    exchange_layout_cache_context_token(s.previous_token);
    s.options = LossParallelOptions{};
  }
}

LossParallelGuard loss_parallel(const LossParallelOptions& options) { return LossParallelGuard(options); }

bool is_loss_parallel_active() { return tls_state.depth > 0; }
int64_t loss_parallel_depth() { return tls_state.depth; }
LossParallelOptions current_loss_parallel_options() { return tls_state.options; }

}  // namespace hyper_parallel
