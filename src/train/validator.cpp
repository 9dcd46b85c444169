#include "train/validator.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <vector>

#include "train/training_step.h"

namespace hyper_parallel::train {

Validator::Validator(const TrainSpec& spec, const ValidationConfig& config, const TrainingConfig& training,
                     std::shared_ptr<const BatchSource> batches, TrainContext validation_context)
    : spec_(&spec),
      config_(config),
      batches_(std::move(batches)),
      fused_linear_loss_(training.fused_linear_loss),
      context_(validation_context) {}

void Validator::set_data_parallel_mesh(const DeviceMesh& dp_mesh) { dp_mesh_ = dp_mesh; }

double Validator::validate(torch::nn::Module& model) const {
  at::NoGradGuard no_grad;
  // Per batch: the sum of its token losses and their number, counted as a training step
  // counts them, then summed over every replica's rows in one all-reduce.
  std::vector<double> sums;
  for (int64_t i = 0; i < config_.steps; ++i) {
    auto guard = context_();
    const Batch batch = batches_->batch_at(i);
    sums.push_back(value_of(spec_->loss(model, batch, context_, LossCall{fused_linear_loss_, {}})));
    sums.push_back(counted_tokens(batch));
  }
  sums = sum_over_replicas(sums, dp_mesh_);
  double total = 0;
  for (int64_t i = 0; i < config_.steps; ++i) total += per_counted_token(sums[2 * i], sums[2 * i + 1]);
  return total / static_cast<double>(std::max<int64_t>(1, config_.steps));
}

}  // namespace hyper_parallel::train
