#include "train/metrics/state_bytes.h"

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include "train/parallel/local_piece.h"
#include "hyper_parallel_train/spec/parallelized_model.h"

namespace hyper_parallel::train {

int64_t held_bytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  const at::Tensor local = local_or_plain(t);
  return local.storage().nbytes() == 0 ? 0 : local.numel() * static_cast<int64_t>(local.element_size());
}

StateBytes measure_state_bytes(const ParallelizedModel& model, const torch::optim::AdamW& optimizer) {
  StateBytes s;
  int64_t module_bytes = 0;
  for (const auto& p : model.module().parameters()) {
    module_bytes += held_bytes(p);
    s.model_parameters += p.numel();
  }
  for (const auto& p : model.stored_parameters()) {
    s.parameters += held_bytes(p);
    s.gradients += held_bytes(p.grad());
  }
  s.masters = s.parameters - module_bytes;  // the stored tensors that are not the module's own
  const auto& adamw = optimizer.state();
  for (const auto& p : model.trained_parameters()) {
    const auto it = adamw.find(p.unsafeGetTensorImpl());
    if (it == adamw.end()) continue;
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    s.optimizer += held_bytes(state.exp_avg()) + held_bytes(state.exp_avg_sq());
  }
  return s;
}

int64_t checkpoint_bytes(const StateBytes& state) {
  return (state.masters > 0 ? state.masters : state.parameters) + state.optimizer;
}

}  // namespace hyper_parallel::train
