#include "hyper_parallel_train/spec/parallelized_model.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <sstream>

#include "hyper_parallel/models/causal_lm.h"
#include "train/optim/master_weights.h"
#include "train/parallel/data_parallel_reducer.h"

namespace hyper_parallel::train {

ParallelizedModel::ParallelizedModel(
    std::shared_ptr<torch::nn::Module> module, const ParallelDims& dims, const ParallelDims::Meshes& meshes,
    const JobConfig& job, const std::function<std::vector<NamedParameters>(const torch::nn::Module&)>& shard_groups)
    : module_(std::move(module)), dims_(dims) {
  const auto& t = job.training;
  const bool bf16 = t.dtype == "bfloat16";
  if (dims.fsdp_enabled()) {
    // FSDP: the shards are the float32 masters (bfloat16 is the gathered compute copy).
    FullyShardOptions options;
    options.reshard_after_forward = job.parallelism.fsdp_reshard_after_forward;
    if (bf16) options.reduce_dtype = t.mixed_precision_reduce == "bfloat16" ? at::kBFloat16 : at::kFloat;
    fsdp_ = std::make_shared<FullyShardedParameters>(shard_groups(*module_), *meshes.world, options);
    as_causal_lm(*module_).set_block_hooks(fsdp_);
    return;
  }
  // bfloat16 parameters train through float32 master copies (master_weights.h).
  if (bf16) master_ = std::make_unique<MasterWeights>(module_->named_parameters());
  if (meshes.dp) {
    // bfloat16: the sums go straight into the float32 masters' .grad.
    reducer_ = std::make_unique<DataParallelReducer>(module_->named_parameters(), *meshes.dp,
                                                     job.parallelism.dp_bucket_mb * (int64_t{1} << 20),
                                                     master_ ? master_->parameters() : std::vector<at::Tensor>{});
  }
}

ParallelizedModel::~ParallelizedModel() = default;

std::vector<at::Tensor> ParallelizedModel::trained_parameters() const {
  if (fsdp_) {
    std::vector<at::Tensor> out;
    for (auto& [name, shard] : named_trained_parameters()) out.push_back(shard);
    return out;
  }
  return master_ ? master_->parameters() : module_->parameters();
}

NamedParameters ParallelizedModel::named_trained_parameters() const {
  NamedParameters out;
  if (fsdp_) {
    // FSDP holds its shards root group first: put them in the module's order.
    std::map<std::string, at::Tensor> by_name;
    for (size_t i = 0; i < fsdp_->shards().size(); ++i) by_name.emplace(fsdp_->names()[i], fsdp_->shards()[i]);
    for (const auto& p : module_->named_parameters()) out.emplace_back(p.key(), by_name.at(p.key()));
  } else if (master_) {
    for (size_t i = 0; i < master_->parameters().size(); ++i)
      out.emplace_back(master_->names()[i], master_->parameters()[i]);
  } else {
    for (const auto& p : module_->named_parameters()) out.emplace_back(p.key(), p.value());
  }
  return out;
}

std::vector<at::Tensor> ParallelizedModel::stored_parameters() const {
  std::vector<at::Tensor> out = module_->parameters();
  if (fsdp_ || master_) {
    for (const auto& p : trained_parameters()) out.push_back(p);
  }
  return out;
}

void ParallelizedModel::backward(const at::Tensor& loss, bool last_micro_batch) {
  // The last backward sends the gradient buckets as they fill (overlapped with it).
  const bool reduced = reducer_ && last_micro_batch;
  if (reduced) reducer_->arm();
  loss.backward();
  // FSDP: the micro-batch's gradients, reduce-scattered, added to the shards' .grad.
  if (fsdp_) fsdp_->finish_backward();
  // bfloat16: every micro-batch's gradient is summed in float32 on the masters (the
  // reducer adds the last one, with the other replicas').
  if (master_ && !reduced) master_->accumulate_gradients();
  if (reduced) reducer_->finish();
}

void ParallelizedModel::copy_trained_to_model() {
  if (master_) master_->master_to_model();
}

void ParallelizedModel::after_forward_without_backward() {
  if (fsdp_) fsdp_->reshard();
}

std::optional<FullyShardStats> ParallelizedModel::sharding_stats() const {
  if (!fsdp_) return std::nullopt;
  return fsdp_->stats();
}

std::string ParallelizedModel::describe() const {
  std::ostringstream os;
  os << "DP " << dims_.dp_replicate();
  if (fsdp_) os << " x FSDP " << dims_.dp_shard();
  os << " x TP " << dims_.tp();
  if (reducer_) os << " (" << reducer_->bucket_count() << " gradient buckets)";
  return os.str();
}

}  // namespace hyper_parallel::train
