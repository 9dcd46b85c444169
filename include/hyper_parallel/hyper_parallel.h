// HyperParallel C++: tensor parallelism for LibTorch. One include for the DTensor runtime:
// meshes, placements, DTensors and their dispatcher, parallel styles, loss_parallel and the
// per-token log-probabilities (vocab_logprobs.h).
// The rest is included on its own where it is used: FSDP (fully_shard.h, block_hooks.h),
// the models and their Hugging Face I/O (llama.h, qwen3.h, model_registry.h,
// hf_checkpoint.h, parameters_on_meta.h), the vocabulary-parallel kernels
// (vocab_parallel.h), CPU memory (cpu_allocator.h, gradient_buffers.h), collectives left
// running (pending_collective.h) and their tally (collective_stats.h), and failure
// reporting (fatal_error.h, rank_error_file.h, run_then_agree.h). export.h says what the
// library exports; the training library's headers are in include/hyper_parallel_train/.
#pragma once

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/dispatch/dispatch.h"
#include "hyper_parallel/core/distributed.h"
#include "hyper_parallel/dispatch/distributed_op.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/loss/fused_linear_loss.h"
#include "hyper_parallel/core/layout.h"
#include "hyper_parallel/loss/loss_parallel.h"
#include "hyper_parallel/loss/plain_cross_entropy.h"
#include "hyper_parallel/nn/module_utils.h"
#include "hyper_parallel/nn/parallel_style.h"
#include "hyper_parallel/loss/parallelism_config.h"
#include "hyper_parallel/core/placement.h"
#include "hyper_parallel/dispatch/sharding_strategy.h"
#include "hyper_parallel/loss/vocab_logprobs.h"

namespace hp = hyper_parallel;
