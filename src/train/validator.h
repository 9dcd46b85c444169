// Validator: the loss of fixed validation batches, computed as the train spec computes the
// training loss and counted as a training step counts it (training_step.h: the counted
// tokens, the sums over the data-parallel ranks, the loss per counted token).
#pragma once

#include <memory>
#include <optional>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel_train/data/batch.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/parallel/train_context.h"
#include "hyper_parallel_train/spec/train_spec.h"

namespace torch::nn {
class Module;
}

namespace hyper_parallel::train {

class Validator {
 public:
  // Batches 0 .. config.steps - 1 of `batches` (e.g. the synthetic stream's validation
  // split), their loss computed as `spec` computes the training loss.
  Validator(const TrainSpec& spec, const ValidationConfig& config, const TrainingConfig& training,
            std::shared_ptr<const BatchSource> batches, TrainContext validation_context);
  // The mean over config.steps fixed batches of each batch's loss (its token losses over
  // every replica's rows, divided by their count), without gradients.
  double validate(torch::nn::Module& model) const;
  // Each data-parallel rank holds its rows of the validation batches: the loss sums go
  // over every dim of dp_mesh.
  void set_data_parallel_mesh(const DeviceMesh& dp_mesh);

 private:
  const TrainSpec* spec_;
  ValidationConfig config_;
  std::shared_ptr<const BatchSource> batches_;
  bool fused_linear_loss_;  // training.fused_linear_loss: the same loss path as training
  TrainContext context_;
  std::optional<DeviceMesh> dp_mesh_;
};

}  // namespace hyper_parallel::train
