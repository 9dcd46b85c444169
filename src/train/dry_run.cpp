#include "train/dry_run.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/optim/adamw.h>

#include <memory>
#include <stdexcept>

#include "hyper_parallel/core/collective_stats.h"
#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel/core/distributed.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/nn/fully_shard.h"
#include "train/data/batches.h"
#include "hyper_parallel_train/spec/parallelized_model.h"
#include "train/metrics/state_bytes.h"
#include "train/metrics/step_metrics.h"
#include "train/training_job.h"
#include "train/training_step.h"
#include "train/parallel/mesh_sum.h"
#include "hyper_parallel_train/parallel/train_context.h"
#include "hyper_parallel_train/spec/train_spec.h"

namespace hyper_parallel::train {

namespace {

// This replica's rows of a step (the replica's share of the global batch): token 1
// everywhere, on the module's device (a meta tensor holds no ids to check).
Batch replica_batch(const TrainingJob& job) {
  const auto& t = job.config.training;
  const at::TensorOptions o =
      at::TensorOptions().dtype(at::kLong).device(as_causal_lm(*job.model).head_weight().device());
  const int64_t rows = t.batch_size / job.dims.dp_ranks();
  return {at::ones({rows, t.seq_len}, o), at::ones({rows, t.seq_len}, o)};
}

// The Trainer's set-up (training_job.h) without data, checkpoints or metrics. On meta:
// every weight, buffer and moment is shapes only. Otherwise real weights (init_weights of
// training.seed) on the world's device.
std::unique_ptr<TrainingJob> build_job(JobConfig config, bool on_meta) {
  auto job = std::make_unique<TrainingJob>(
      std::move(config), on_meta ? TrainingJob::Weights::ShapesOnly : TrainingJob::Weights::Initialised);
  job->parallelize(nullptr);
  return job;
}

// One micro-batch's forward and loss, as the shared step computes it (training_step.h).
at::Tensor micro_batch_loss(TrainingJob& job, const Batch& rows) {
  auto guard = job.context();
  return job.spec->loss(*job.model, rows, job.context, LossCall{job.config.training.fused_linear_loss, nullptr});
}

void micro_batch_backward(TrainingJob& job, const at::Tensor& loss, bool last) {
  auto guard = job.context();
  job.parallelized->backward(loss, last);
}

// One optimizer step: the Trainer's (training_step.h), on the job's meta tensors.
void run_step(TrainingJob& job) {
  job.optimizer->zero_grad();
  StepResult r;
  PhaseClock clock(r);
  r.loss = forward_backward(job.step_parts(), replica_batch(job), clock);
  clip_and_update(job.step_parts(), r, clock);
}

// This thread's own world for the duration of a dry run or measurement.
class FakeWorld {
 public:
  FakeWorld(int64_t rank, int64_t world_size) {
    TORCH_CHECK(!is_initialized(), "dry run: a process group is already initialised on this thread");
    InitOptions init;
    init.backend = "fake";
    init.per_thread = true;
    init_process_group(c10::make_intrusive<c10d::HashStore>(), rank, world_size, init);
  }
  ~FakeWorld() { destroy_process_group(); }
  FakeWorld(const FakeWorld&) = delete;
  FakeWorld& operator=(const FakeWorld&) = delete;
};

}  // namespace

DryRunRank dry_run_rank(JobConfig config, int64_t world_size, int64_t rank) {
  TORCH_CHECK(config.training.device == "cpu", "hp-dry-run: training.device = ", config.training.device,
              ": the dry run builds the job on the meta device; run it with training.device = cpu (the bytes are the "
              "same on a GPU)");
  ParallelDims::of(config.parallelism).check_world_size(world_size, ParallelDims::Ranks::Played);
  TORCH_CHECK(rank >= 0 && rank < world_size, "hp-dry-run: rank ", rank, " is not in [0, ", world_size, ")");
  FakeWorld world(rank, world_size);
  DryRunRank out;
  out.rank = rank;
  {
    std::unique_ptr<TrainingJob> job = build_job(std::move(config), /*on_meta=*/true);
    out.parameters = parameter_shapes_of(*job->model);
    const CollectiveTally before = collective_tally();
    run_step(*job);
    const CollectiveTally after = collective_tally();
    for (size_t k = 0; k < kCollectiveKinds; ++k) {
      const int64_t count = after.kind_count[k] - before.kind_count[k];
      if (count > 0)
        out.collectives.push_back({kCollectiveKindNames[k], count, after.kind_bytes[k] - before.kind_bytes[k]});
    }
    out.state = measure_state_bytes(*job->parallelized, *job->optimizer);
    out.checkpoint_bytes = checkpoint_bytes(out.state);
    out.sizes = as_causal_lm(*job->model).sizes();
    out.loss_terms = job->context.loss_terms();
    const ModelFamily& family = *job->spec->family;
    if (family.block_activation_bytes) {
      out.block_activation_bytes =
          family.block_activation_bytes(*job->model, block_activation_shape(job->config, job->dims));
    } else {
      out.no_block_activations = "model.name = \"" + family.name +
                                 "\": its family gives no block_activation_bytes (hp-dry-run --measure measures it)";
    }
    out.model = job->spec->describe(*job->model);
  }
  return out;
}

MeasuredActivations measure_activations(JobConfig config, const std::function<int64_t()>& allocated_bytes,
                                        const std::function<void()>& reset_peak,
                                        const std::function<int64_t()>& peak_bytes) {
  std::unique_ptr<TrainingJob> job = build_job(std::move(config), /*on_meta=*/false);
  // Bytes of the model's parameters whose storage is held now (FSDP gathers and frees them).
  auto gathered = [&] {
    int64_t bytes = 0;
    for (const auto& p : job->model->parameters()) bytes += held_bytes(p);
    return bytes;
  };
  const Batch rows = micro_batch(replica_batch(*job), 0, job->config.training.grad_accum_steps);
  MeasuredActivations m;
  for (int pass = 0; pass < 2; ++pass) {  // the first one warms up: gradients exist after it
    const int64_t before = allocated_bytes();
    const int64_t gathered_before = gathered();
    reset_peak();
    at::Tensor loss = micro_batch_loss(*job, rows);
    m.saved = allocated_bytes() - before - (gathered() - gathered_before);
    micro_batch_backward(*job, loss, /*last=*/true);
    loss = at::Tensor();
    m.peak = peak_bytes() - before;
  }
  return m;
}

}  // namespace hyper_parallel::train
