// The model a job trains, before it is moved and parallelized: a Llama of [model]'s sizes,
// or, with model.hf_assets_path, the family's from_hf_config of that folder's config.json
// (model_registry.h), whose sizes then become [model]'s.
#pragma once

#include "hyper_parallel/llama.h"
#include "train/config/job_config.h"

namespace hyper_parallel::train {

// Sets `model`'s size fields from the Hugging Face config when model.hf_assets_path is set;
// a size field set to a value other than both its default and the config's is a
// std::invalid_argument naming both values (never silently one or the other). Every rank
// reads the same file, so every rank raises the same error.
Llama make_job_model(ModelConfig& model);

// The model arguments of a job's [model] section.
LlamaArgs llama_args(const ModelConfig& model);

}  // namespace hyper_parallel::train
