// memory_formula.h — what one rank of a job holds, in closed form: its state after a step
// (parameters, masters, gradients, AdamW's moments: the StateBytes hp-train logs; its
// checkpoint follows, checkpoint_bytes in metrics/state_bytes.h) for any family, and the
// activations one micro-batch keeps for backward, with or without activation checkpointing,
// from its family's per-block count. hp-dry-run prints these beside what the
// job, built on meta tensors, holds (dry_run.h); docs/training.md ("Dry run") gives the formulas and what they leave
// out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "hyper_parallel/nn/activation_checkpoint.h"
#include "hyper_parallel/models/block_activations.h"
#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/config/parallel_dims.h"
#include "hyper_parallel_train/parallel/train_context.h"
#include "train/metrics/state_bytes.h"

namespace hyper_parallel::train {

// A parameter as the state formula takes it: its global shape and the dim tensor
// parallelism shards (-1: whole on every TP rank).
struct ParameterShape {
  std::vector<int64_t> shape;
  int64_t tp_dim = -1;
};

// The parameters of a module parallelized for training, read off the module itself (the TP
// plan's DTensors name their shard dim on the "tp" mesh dim; any other parameter is whole):
// the formula needs no family's parameter list.
std::vector<ParameterShape> parameter_shapes_of(const torch::nn::Module& model);

// The state of rank `rank`: every parameter's piece (torch.chunk over tp along its TP dim,
// then over dp_shard along dim 0 under FSDP) times the bytes of what holds it.
StateBytes state_bytes_formula(const std::vector<ParameterShape>& parameters, const JobConfig& job,
                               const ParallelDims& dims, int64_t rank);

struct ActivationBytes {
  int64_t per_block = 0;           // one transformer block without checkpointing
  int64_t checkpointed_block = 0;  // what a checkpointed block keeps: its input
  int64_t checkpointed_blocks = 0;
  int64_t outside_blocks = 0;  // embeddings, final norm, head input, the loss's logits
  // Held when a micro-batch's forward and loss return; the backward of a checkpointed
  // block adds one block's recomputed activations (per_block) while it runs.
  int64_t held_after_forward = 0;
};

// One micro-batch (training.batch_size / dp ranks / grad_accum_steps rows of seq_len) on one
// rank, in training.dtype, as its blocks see it: what a family's
// ModelFamily::block_activation_bytes takes.
BlockActivationShape block_activation_shape(const JobConfig& job, const ParallelDims& dims);

// That micro-batch's activations for the model's eager attention: `per_block` is its family's
// count for one block (block_activation_bytes); `ac` says which blocks recompute theirs in
// backward ([activation_checkpoint], block_checkpointing()) and keep only their input. Outside
// the blocks: the token ids, the final norm, the head's input, the logits the loss keeps and,
// where the loss soft-caps plain logits (no loss parallel, no fused linear loss), their
// capped copy (terms: the job's loss terms, the model's soft-cap included).
ActivationBytes activation_bytes_formula(int64_t per_block, const DecoderSizes& sizes, const LossTerms& terms,
                                         const JobConfig& job, const ParallelDims& dims, const BlockCheckpointing& ac);

}  // namespace hyper_parallel::train
