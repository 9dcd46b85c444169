// Activation checkpointing for LibTorch, which has no torch.utils.checkpoint: a function's
// forward runs without keeping its intermediate tensors; its backward runs the function again
// with grad enabled, from the inputs it saved, and takes the gradients of that recomputed
// graph. A checkpointed transformer block keeps its input instead of its activations, for
// one more forward of it in backward. TorchTitan's [activation_checkpoint] keys choose the
// blocks (BlockCheckpointing); a model's forward runs each block through run_block().
//
// One autograd node stands for the whole function, as in PyTorch's reentrant checkpoint, but
// its edges lead to the inputs *and* to the parameters the function reads: backward computes
// the gradients of both (torch::autograd::grad on the recomputed graph) and hands them to the
// engine, so the parameters' own AccumulateGrad nodes and hooks run as without checkpointing
// (fully_shard's reduce-scatter among them), gradients accumulate over micro-batches, and
// torch::autograd::grad works through it (PyTorch's reentrant variant refuses that).
//
// Checked, each a clear error: an input modified in place between forward and backward (the
// inputs are saved as SavedVariables); a recompute whose outputs differ in number, shape or
// dtype from the forward's (PyTorch's determinism check compares the saved tensors' metadata;
// here the outputs'); a tensor that requires grad, read by the function but neither an input
// nor a listed parameter (its gradient would be lost); double backward (create_graph).
//
// DTensors (tensor and sequence parallel blocks) work as plain tensors do. Under fully_shard
// the block's parameters are gathered for its backward by FSDP's hook on the block's output
// (block_hooks.h), which runs just before this node: the recompute reads them there, and they
// are freed once their gradients are taken, so checkpointing adds no all-gather.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace torch::nn {
class Module;
}

namespace hyper_parallel {

struct CheckpointOptions {
  // Random numbers: when the forward draws from LibTorch's default generator (of the CPU or of
  // an input's device) or from a DTensor mesh's random sequence (of the inputs' and
  // parameters' meshes), the recompute starts from the generators' state before the forward
  // and draws the same numbers; the state after it is then put back (PyTorch's fork_rng).
  // false: a forward that draws is refused, since the recompute would draw other numbers.
  // Only the generators named above are seen; the default CPU generator is the process's, so
  // ranks run as threads share it.
  bool preserve_rng_state = true;
};

// Called in the forward and again in backward: what it captures must outlive the backward.
using CheckpointedFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// function(inputs), its activations recomputed in backward. `parameters`: the tensors the
// function reads besides its inputs that need gradients (a module's parameters()). Without
// grad mode, or with nothing that requires grad, it is function(inputs) itself.
std::vector<at::Tensor> checkpoint(const CheckpointedFunction& function, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& parameters, const CheckpointOptions& options = {});

// TorchTitan's activation_checkpoint.mode (its "memory_budget" needs torch.compile).
enum class ActivationCheckpointMode { kNone, kFull, kSelective };

// Which transformer blocks a model checkpoints.
struct BlockCheckpointing {
  ActivationCheckpointMode mode = ActivationCheckpointMode::kNone;
  // kSelective: every `every`-th block, counting from 1 as TorchTitan does (every = 2: blocks
  // 1, 3, 5 ... of 0, 1, 2 ...).
  int64_t every = 2;
  CheckpointOptions options;

  bool checkpoints(int64_t block) const;
  std::string str() const;  // "none", "full", "selective (1 block in 2)"
  // What it does to a model of `blocks` blocks: "full (4 of 4 blocks)", "selective (every 2nd
  // block: 2 of 5 blocks)", and says so when an option larger than the count picks none.
  std::string str(int64_t blocks) const;
};

// From TorchTitan's keys: mode "none" | "full" | "selective", and selective_ac_option a positive
// integer (every N-th block). Its "op" (per-operator selective checkpointing, which rides on
// PyTorch's TorchDispatchMode) is refused. std::invalid_argument naming the key otherwise.
BlockCheckpointing block_checkpointing(const std::string& mode, const std::string& selective_ac_option,
                                       bool preserve_rng_state = true);

// How a model's forward runs block `index`: forward(input), through checkpoint() with the
// block's parameters when `policy` picks the block. Backward calls `forward` again (a copy of
// it): it must not refer to the caller's locals.
at::Tensor run_block(const BlockCheckpointing& policy, int64_t index, const torch::nn::Module& block,
                     const std::function<at::Tensor(const at::Tensor&)>& forward, const at::Tensor& input);

}  // namespace hyper_parallel

HP_PUBLIC_END
