#include "train/training_job.h"

#include <ATen/ATen.h>

#include <optional>
#include <utility>

#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel/core/distributed.h"
#include "hyper_parallel/nn/parameters_on_meta.h"
#include "train/config/training_dtype.h"

namespace hyper_parallel::train {

TrainingJob::TrainingJob(JobConfig job_config, Weights job_weights)
    : config(std::move(job_config)), weights(job_weights), spec(&train_spec(config.model.name)) {
  {
    std::optional<ParametersOnMeta> on_meta;
    if (weights == Weights::ShapesOnly) on_meta.emplace(MetaScope::Everything);
    if (weights == Weights::ReadWhenParallelized) on_meta.emplace();
    // Before validate(): with model.hf_assets_path the sizes it checks come from config.json.
    model = spec->build(config.model);
  }
  validate(config);
  dims = ParallelDims::of(config.parallelism);
  dims.check_world_size(world_size_or_one());
  loss_parallel = dims.tp_enabled() && !config.parallelism.disable_loss_parallel;
  scope = std::make_unique<ParallelismScope>(config.parallelism);
  context = get_train_context(loss_parallel, spec->loss_terms(*model, config.training));
  device = world_device();
  TORCH_CHECK(device.type() == (config.training.device == "cuda" ? at::kCUDA : at::kCPU),
              "hp-train: training.device = ", config.training.device, " but the process group was initialised for ",
              device, "; initialise it with InitOptions{.device_type = \"", config.training.device, "\"}");
  const at::ScalarType dtype = training_dtype(config.training.dtype);
  if (weights == Weights::Initialised) {
    as_causal_lm(*model).init_weights(static_cast<uint64_t>(config.training.seed));
    model->to(device, dtype);
  } else {
    model->to(dtype);  // meta parameters get their device when materialised, or never
  }
  meshes = dims.build_meshes(config.training.device);
}

void TrainingJob::parallelize(const std::function<void()>& load_weights) {
  TORCH_CHECK(!parallelized, "TrainingJob::parallelize: the job is parallelized already");
  parallelized = spec->parallelize(model, dims, meshes, config, load_weights);
  optimizer = make_optimizer(*parallelized, config.training);
}

TrainingStepParts TrainingJob::step_parts() {
  TORCH_CHECK(parallelized, "TrainingJob::step_parts: parallelize the job first");
  return {config.training, *spec, *model, *parallelized, *optimizer, context, meshes.dp};
}

}  // namespace hyper_parallel::train
