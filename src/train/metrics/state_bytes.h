// state_bytes.h — what a rank keeps from step to step (StateBytes, step_result.h), read
// from its live tensors one way for hp-train's metrics and for hp-dry-run's meta tensors.
#pragma once

#include "hyper_parallel_train/step_result.h"

namespace torch::optim {
class AdamW;
}

namespace hyper_parallel::train {

class ParallelizedModel;

// Bytes each tensor's local piece holds now: a tensor whose storage is released (FSDP's
// gathered parameters between steps) holds none; a meta tensor counts the bytes it would
// hold.
StateBytes measure_state_bytes(const ParallelizedModel& model, const torch::optim::AdamW& optimizer);

}  // namespace hyper_parallel::train
