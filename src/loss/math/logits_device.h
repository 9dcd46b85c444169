// The loss's inputs live on the logits' device (internal). A kernel reads every pointer it
// is given as memory of the logits' device: a CUDA kernel given a host pointer faults and
// poisons the CUDA context for the whole process. So a target, probability target or class
// weight elsewhere is an error naming both devices before anything runs, as PyTorch's
// device-mismatch error is; nothing is moved behind the caller's back.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace hyper_parallel {

// Throws c10::Error unless `other` (the `what` of op `op`) is `logits`.
void check_on_logits_device(c10::Device logits, c10::Device other, const std::string& what, const std::string& op);

}  // namespace hyper_parallel
