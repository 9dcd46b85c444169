// parallelized_model.h — a module as its train spec's parallelize leaves it (what
// TorchTitan's parallelize_fn returns): tensor parallelism is in the module itself, and
// this object holds what data parallelism and bfloat16 training put around it — FSDP's
// sharded parameters (with replicas, HSDP), DDP's gradient reducer (replicas alone), or
// bfloat16's float32 master weights. The Trainer asks it what the optimizer updates and
// runs backward through it, and never asks which of these it holds.
//
//   std::unique_ptr<ParallelizedModel> m = spec.parallelize(module, dims, meshes, job, load_weights);
//   AdamW opt(m->trained_parameters(), ...);
//   opt.zero_grad();
//   for each micro-batch: m->backward(loss, /*last_micro_batch=*/...);
//   clip_grad_norm_(m->trained_parameters(), ...); opt.step();
//   m->copy_trained_to_model();
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hyper_parallel/core/export.h"
#include "hyper_parallel/nn/fully_shard.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/config/parallel_dims.h"
#include "hyper_parallel_train/spec/train_spec.h"

HP_PUBLIC_BEGIN

namespace torch::nn {
class Module;
}

namespace hyper_parallel::train {

class DataParallelReducer;
class MasterWeights;

class ParallelizedModel {
 public:
  // Wraps `module` (tensor parallelism applied, weights final: FSDP's shards and the masters
  // start from them) as `dims` and `job` say:
  // - dims.fsdp_enabled(): FSDP over meshes.world, in the groups `shard_groups` gives; its
  //   shards are float32 masters of a bfloat16 model, reduced in
  //   training.mixed_precision_reduce; with replicas it also sums over dp_replicate.
  // - otherwise, bfloat16: float32 master weights; and replicas (meshes.dp): DDP's bucketed
  //   gradient reducer over meshes.dp, whose sums go into the masters' .grad when there are.
  ParallelizedModel(std::shared_ptr<torch::nn::Module> module, const ParallelDims& dims,
                    const ParallelDims::Meshes& meshes, const JobConfig& job,
                    const std::function<std::vector<NamedParameters>(const torch::nn::Module&)>& shard_groups);
  ~ParallelizedModel();
  ParallelizedModel(const ParallelizedModel&) = delete;
  ParallelizedModel& operator=(const ParallelizedModel&) = delete;

  torch::nn::Module& module() const { return *module_; }

  // What the optimizer updates, clipping measures and checkpoints hold, in the module's
  // parameter order (AdamW's state is checkpointed by position, so a checkpoint resumes
  // with or without FSDP): FSDP's shards, the float32 masters, or the module's parameters.
  std::vector<at::Tensor> trained_parameters() const;
  NamedParameters named_trained_parameters() const;
  // Every parameter tensor this rank stores: the module's (FSDP's compute buffers, which
  // hold nothing between steps) and, when they are other tensors, the trained ones.
  std::vector<at::Tensor> stored_parameters() const;

  // loss.backward() for one micro-batch, with the gradient exchange around it: DDP's
  // buckets are sent while the step's last backward runs and their sums written into
  // .grad after it; FSDP reduce-scatters every micro-batch's gradients into its shards'
  // .grad; the masters sum every micro-batch's gradients in float32.
  void backward(const at::Tensor& loss, bool last_micro_batch);
  // The trained parameters' values into the module's own after they changed (an optimizer
  // step, a checkpoint load): the masters rounded to bfloat16. Nothing otherwise (FSDP's
  // forward gathers its shards).
  void copy_trained_to_model();
  // After a forward without backward (validation): frees what FSDP still holds gathered
  // (its root stays gathered after a forward).
  void after_forward_without_backward();

  // data_parallel_shard_degree > 1: the sharded parameters; null otherwise.
  FullyShardedParameters* fully_sharded() const { return fsdp_.get(); }
  // FSDP's collectives so far on this rank; none without FSDP.
  std::optional<FullyShardStats> sharding_stats() const;
  // The start-up line's layout: "DP 2 x FSDP 2 x TP 2", "DP 2 x TP 1 (3 gradient buckets)".
  std::string describe() const;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  ParallelDims dims_;
  std::shared_ptr<FullyShardedParameters> fsdp_;  // dp_shard > 1 (the module holds it as its block hooks)
  std::unique_ptr<MasterWeights> master_;         // bfloat16 without FSDP: the float32 weights AdamW updates
  std::unique_ptr<DataParallelReducer> reducer_;  // replicas without FSDP
};

}  // namespace hyper_parallel::train

HP_PUBLIC_END
