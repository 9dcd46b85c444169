// train_spec.h — what hp-train needs of a model family to train it: TorchTitan's TrainSpec,
// and the one door to the family. The spec carries its registry entry (TrainSpec::family,
// model_registry.h), so the Trainer, the Validator, the checkpoints, the dry run and the
// export tools hold a module and its spec, name no model, and load, save and export a
// family's Hugging Face checkpoints through the one adapter and config.json its entry gives.
//
// Every registered family has a spec, made from its registry entry and its module's
// CausalLanguageModel interface (causal_lm.h): adding a family to the registry is all it
// takes to train it. A family may register a spec of its own instead (register_train_spec),
// e.g. the default one with its loss, FSDP groups or description replaced; what it says of
// Hugging Face checkpoints stays its registry entry's.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hyper_parallel/core/export.h"
#include "hyper_parallel/models/hf_checkpoint.h"
#include "hyper_parallel/models/model_registry.h"
#include "hyper_parallel_train/data/batch.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/config/parallel_dims.h"
#include "hyper_parallel_train/parallel/train_context.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel::train {
class ParallelizedModel;  // parallelized_model.h (it includes this header)
}

namespace torch::nn {
class Module;
}

namespace hyper_parallel::train {

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

// cross_entropy's default ignore_index: targets equal to it are not predicted and do not count.
constexpr int64_t kIgnoreIndex = -100;

// How one loss call runs.
struct LossCall {
  // training.fused_linear_loss: the head's matmul and the loss in one, no logits tensor.
  bool fused_linear = false;
  // Runs when the model's forward is done (at the final norm when fused), for phase timing.
  std::function<void()> after_forward;
};

struct TrainSpec {
  std::string name;  // model.name
  // The registry entry of family `name` (model_registry.h; valid for the life of the process):
  // its hf_adapter is what checkpoint.initial_load_in_hf reads through, its to_hf_config and
  // adapter what checkpoint.last_save_in_hf and hp-hf-export write, its
  // block_activation_bytes what hp-dry-run estimates. default_train_spec sets it;
  // register_train_spec sets it when null and refuses another family's.
  const ModelFamily* family = nullptr;
  // The module of a job's [model]: the family's from_hf_config of model.hf_assets_path's
  // config.json, whose sizes are then written into `model` (a size set to another value is a
  // std::invalid_argument naming both), or, without hf_assets_path, from [model]'s sizes for
  // a family that can be built from them.
  std::function<std::shared_ptr<torch::nn::Module>(ModelConfig& model)> build;
  // The module a checkpoint recorded: from the text of its config.json when it has one
  // (not empty), else from the recorded [model] sizes.
  std::function<std::shared_ptr<torch::nn::Module>(const ModelConfig& model, const std::string& hf_config_json)>
      rebuild;
  // Everything parallel about the module (TorchTitan's parallelize_fn), so the Trainer wires
  // none of it: tensor (and sequence) parallelism over meshes.tp when dims.tp_enabled(),
  // each rank sharding its own copy of the weights; [activation_checkpoint]'s blocks; then
  // `load_weights` (materialising
  // meta parameters, reading a checkpoint into the TP pieces: FSDP's shards and the
  // masters copy what it leaves); then FSDP or DDP and bfloat16's float32 master weights
  // (parallelized_model.h).
  std::function<std::unique_ptr<ParallelizedModel>(std::shared_ptr<torch::nn::Module> model, const ParallelDims& dims,
                                                   const ParallelDims::Meshes& meshes, const JobConfig& job,
                                                   const std::function<void()>& load_weights)>
      parallelize;
  // Sharded data parallelism's groups: the root's parameters (embeddings, final norm, head)
  // first, then one group per block, in the order the forward reads them.
  std::function<std::vector<NamedParameters>(const torch::nn::Module& model)> shard_groups;
  // The sum (not the mean) of `batch`'s token losses, in the context, on the model's device:
  // the caller divides by the global count of targets that count (cross_entropy's
  // ignore_index -100 does not).
  std::function<at::Tensor(torch::nn::Module& model, const Batch& batch, const TrainContext& context,
                           const LossCall& call)>
      loss;
  // The terms the loss adds to cross-entropy: [training]'s z-loss, and the soft-capping the
  // model asks for (Gemma 2's final_logit_softcapping) or training.logit_softcap; both set
  // and different is a std::invalid_argument.
  std::function<LossTerms(const torch::nn::Module& model, const TrainingConfig& training)> loss_terms;
  // The FLOPs of training on one token of a training.seq_len sequence (the family's count,
  // CausalLanguageModel::flops_per_token): MFU's numerator.
  std::function<int64_t(const torch::nn::Module& model, int64_t seq_len)> flops_per_token;
  // One line for logs: the family and its sizes.
  std::function<std::string(const torch::nn::Module& model)> describe;
};

// [activation_checkpoint]: which of the model's blocks recompute their activations in
// backward (activation_checkpoint.h). Applied after TP and before FSDP, as TorchTitan's
// parallelize does.
void apply_activation_checkpointing(torch::nn::Module& model, const ActivationCheckpointJobConfig& config);

// The spec of model.name `name`: the registered one, else the default one; an unknown name is
// a std::invalid_argument listing the known ones. The reference stays valid for the life of
// the process.
const TrainSpec& train_spec(const std::string& name);

// A Hugging Face checkpoint folder's weights into `model` through the spec's family's adapter
// (load_hf_checkpoint, hf_checkpoint.h): checkpoint.initial_load_in_hf.
void load_hf_checkpoint(torch::nn::Module& model, const TrainSpec& spec, const std::string& folder);
// `model` as a Hugging Face checkpoint folder through the spec's family (its adapter and
// config.json): checkpoint.last_save_in_hf and hp-hf-export. A family without to_hf_config is
// a std::invalid_argument naming it.
HfExportResult export_hf_checkpoint(const torch::nn::Module& model, const TrainSpec& spec, const std::string& folder,
                                    const HfExportOptions& options = {});

// The spec the library makes of family `name`'s registry entry: a starting point for a
// family's own.
TrainSpec default_train_spec(const std::string& name);

// Makes `spec` the one train_spec(spec.name) returns, from any thread; spec.family is set to
// the registry entry of spec.name when null. Refused (std::invalid_argument naming the field
// or the name): a name no registered family has, a family pointing at another entry, a
// field left empty, or a family whose spec is set already (registered, or taken by a job:
// register before the first job that names it).
void register_train_spec(TrainSpec spec);

}  // namespace hyper_parallel::train

HP_PUBLIC_END
