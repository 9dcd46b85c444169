// state_bytes.h — what a rank keeps from step to step (StateBytes, step_result.h), read
// from its live tensors one way for hp-train's metrics and for hp-dry-run's meta tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "hyper_parallel_train/metrics/step_result.h"

namespace torch::optim {
class AdamW;
}

namespace hyper_parallel::train {

class ParallelizedModel;

// The bytes a tensor's local piece holds now: none for an undefined tensor or one whose
// storage is released (FSDP's gathered parameters between steps); a meta tensor counts the
// bytes it would hold.
int64_t held_bytes(const at::Tensor& t);

// The held bytes of what `model` and `optimizer` keep.
StateBytes measure_state_bytes(const ParallelizedModel& model, const torch::optim::AdamW& optimizer);

// What a rank's checkpoint of `state` holds: the trained weights (masters or shards when
// there are, else the model's parameters) and AdamW's two moments.
int64_t checkpoint_bytes(const StateBytes& state);

}  // namespace hyper_parallel::train
