#include "train/training_step.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "hyper_parallel/core/distributed.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "train/data/batches.h"
#include "train/optim/optim_utils.h"
#include "train/parallel/mesh_sum.h"

namespace hyper_parallel::train {

double counted_tokens(const Batch& batch) {
  if (batch.target.is_meta()) return 0;
  return static_cast<double>(batch.target.ne(kIgnoreIndex).sum().item<int64_t>());
}

double value_of(const at::Tensor& loss) {
  if (loss.is_meta()) return 0;
  return (is_dtensor(loss) ? full_tensor(loss) : loss).detach().to(at::kDouble).item<double>();
}

std::vector<double> sum_over_replicas(std::vector<double> values, const std::optional<DeviceMesh>& dp_mesh) {
  if (!dp_mesh || values.empty()) return values;
  at::Tensor sums = at::tensor(values, at::kDouble).to(world_device());
  sum_over_mesh(sums, dp_mesh);
  sums = sums.cpu();
  return {sums.data_ptr<double>(), sums.data_ptr<double>() + sums.numel()};
}

double per_counted_token(double loss_sum, double counted) { return loss_sum / std::max(1.0, counted); }

at::Device world_device() { return is_initialized() ? current_world().device : at::Device(at::kCPU); }

int64_t world_size_or_one() { return is_initialized() ? get_world_size() : 1; }

std::unique_ptr<torch::optim::AdamW> make_optimizer(const ParallelizedModel& parallelized, const TrainingConfig& t) {
  return std::make_unique<torch::optim::AdamW>(
      parallelized.trained_parameters(),
      torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).eps(t.eps).weight_decay(t.weight_decay));
}

double forward_backward(const TrainingStepParts& parts, const Batch& batch, PhaseClock& clock) {
  const int64_t micro_batches = parts.training.grad_accum_steps;
  // The count on the world's device (the module's, but a real tensor on a dry run).
  const double global_tokens = sum_over_replicas({counted_tokens(batch)}, parts.dp_mesh).front();
  clock.mark(kLoss);
  const double scale = per_counted_token(1.0, global_tokens);
  double local_sum = 0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    // The loss and its backward inside the train context (a loss_parallel guard when enabled).
    auto guard = parts.context();
    const Batch part = micro_batch(batch, m, micro_batches);
    at::Tensor loss_sum = parts.spec.loss(parts.model, part, parts.context,
                                          LossCall{parts.training.fused_linear_loss, [&] { clock.mark(kForward); }});
    local_sum += value_of(loss_sum);
    at::Tensor loss = loss_sum * scale;
    clock.mark(kLoss);
    // The data-parallel gradient exchange goes with it (the last micro-batch's: DDP's sums).
    parts.parallelized.backward(loss, m + 1 == micro_batches);
    clock.mark(kBackward);
  }
  if (parts.dp_mesh) {
    local_sum = sum_over_replicas({local_sum}, parts.dp_mesh).front();
    clock.mark(kBackward);
  }
  return local_sum * scale;
}

void clip_and_update(const TrainingStepParts& parts, StepResult& r, PhaseClock& clock) {
  clock.restart();
  r.grad_norm = clip_grad_norm_(parts.parallelized.trained_parameters(), parts.training.max_norm);
  clock.mark(kClip);
  // A NaN or infinite update would poison every weight it touches (and AdamW's moments for good).
  r.non_finite = !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
  if (!r.non_finite) {
    parts.optimizer.step();
    parts.parallelized.copy_trained_to_model();
  }
  clock.mark(kOptimizer);
}

}  // namespace hyper_parallel::train
