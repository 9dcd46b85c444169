// dry_run.h — a job of any size built in one process, without its weights: hp-dry-run
// (TorchTitan's COMM_MODE=fake_backend). One rank r of a world of W ranks is played on a
// fake process group (compat/fake_backend.h: collectives complete at once and move no
// data) with every weight, gradient, activation and optimizer moment on the meta device.
// The job is built by the code hp-train runs (the family's TrainSpec, ParallelDims'
// meshes, the TP plan, FSDP or master weights, AdamW), and one optimizer step is run
// through it by the Trainer's own step (training_step.h): every micro-batch's forward,
// loss and backward, the gradient exchange, clipping and the AdamW update. What that step holds and issues is then read
// as hp-train reads it: the state with measure_state_bytes, the collectives with the runtime's own tally, as they are
// issued.
//
// measure_activations runs the same job for real (an initialised world, real weights) to
// check the activation formula against what LibTorch allocates.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/config/parallel_dims.h"
#include "train/memory_formula.h"
#include "train/metrics/state_bytes.h"

namespace hyper_parallel::train {

struct CollectiveUse {
  std::string kind;  // all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, barrier, scatter
  int64_t count = 0;
  int64_t bytes = 0;  // what this rank sends (the runtime's tally: all_gather its piece, reduce_scatter its input)
};

struct DryRunRank {
  int64_t rank = 0;
  DecoderSizes sizes;    // the model's
  LossTerms loss_terms;  // the job's (the model's soft-cap included)
  // One block's activations by its family (ModelFamily::block_activation_bytes) for this
  // job's micro-batch; -1 with the reason in no_block_activations when the family gives none.
  int64_t block_activation_bytes = -1;
  std::string no_block_activations;
  std::string model;  // its TrainSpec's one-line description
  // After one optimizer step: what hp-train's metrics would log as state_bytes.
  StateBytes state;
  // One optimizer step's collectives (all micro-batches), by kind: the kinds issued.
  std::vector<CollectiveUse> collectives;
  // This rank's checkpoint: the trained weights (masters or shards when there are) and
  // AdamW's two moments, the tensors its rank-R.pt file holds.
  int64_t checkpoint_bytes = 0;
  // The model's parameters as parallelized (global shapes, TP dims): state_bytes_formula's input.
  std::vector<ParameterShape> parameters;
};

// Builds `config`'s job as rank `rank` of `world_size` ranks and runs one step on meta
// tensors (see above). The world is this thread's own, created and destroyed here. A world
// size the parallel degrees do not multiply to is refused as hp-train refuses it.
DryRunRank dry_run_rank(JobConfig config, int64_t world_size, int64_t rank);

struct MeasuredActivations {
  // Allocated and still held when one micro-batch's forward and loss return, less the
  // parameters FSDP holds gathered then: what autograd keeps for backward.
  int64_t saved = 0;
  // The highest allocation above the micro-batch's start during its forward and backward.
  int64_t peak = 0;
};

// One micro-batch of `config`'s job for real, in the world already initialised (hp-run):
// real weights, real collectives; `allocated_bytes` and `reset_peak`/`peak_bytes` read the
// allocator (bench/memory_probe.h's probe). A warm-up micro-batch runs first so that
// gradients already exist and are not counted.
MeasuredActivations measure_activations(JobConfig config, const std::function<int64_t()>& allocated_bytes,
                                        const std::function<void()>& reset_peak,
                                        const std::function<int64_t()>& peak_bytes);

}  // namespace hyper_parallel::train
