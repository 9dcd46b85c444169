// Parallel styles and parallelize_module: how a torch::nn model is split over a TP mesh
// (PyTorch's torch.distributed.tensor.parallel, TorchTitan's plans).
//
//   hp::ParallelizePlan plan = {
//       {"tok_embeddings", hp::RowwiseParallel::make({.input_layouts = {{hp::Replicate()}}})},
//       {"layers.*.attention.wq", hp::ColwiseParallel::make()},
//       {"layers.*.attention.wo", hp::RowwiseParallel::make()},
//       {"output", hp::ColwiseParallel::make({.output_layouts = {{hp::Shard(-1)}}, .use_local_output = false})},
//   };
//   hp::parallelize_module(*model, tp_mesh, plan);
//
// Styles shard the parameters of torch::nn::Linear and torch::nn::Embedding (others are a
// clear error) and record how the module's input and output are laid out. LibTorch modules
// have no forward hooks, so a parallelized module is called through hp::parallel_forward
// (the model zoo does), which applies those input/output conversions.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/placement.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace torch::nn {
class Module;
}

namespace hyper_parallel {

// How a parallelized module converts what flows in and out (the hooks of PyTorch's styles).
struct ModuleLayouts {
  DeviceMesh mesh;
  Placements input_layouts;   // how a plain input is laid out (DTensor inputs keep theirs)
  Placements desired_input;   // what the module's computation needs
  Placements output_layouts;  // what the output is redistributed to
  bool use_local_output = true;
  bool use_local_input = false;  // PrepareModuleInput(use_local_output): hand the module local pieces
};

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  virtual std::string name() const = 0;
  // Shards `module`'s parameters over `mesh` and returns its input/output conversions.
  // `path` names the module in messages; `src_data_rank` as in distribute_tensor.
  virtual ModuleLayouts apply(torch::nn::Module& module, const std::string& path, const DeviceMesh& mesh,
                              std::optional<int64_t> src_data_rank) const = 0;
};
using ParallelStylePtr = std::shared_ptr<const ParallelStyle>;

struct StyleOptions {
  std::optional<Placements> input_layouts;
  std::optional<Placements> output_layouts;
  bool use_local_output = true;
};

// Linear: weight Shard(0), bias Shard(0); input Replicate -> output Shard(-1).
// Embedding: weight Shard(1) (embedding dim); output Shard(-1).
class ColwiseParallel : public ParallelStyle {
 public:
  explicit ColwiseParallel(StyleOptions o = {}) : options_(std::move(o)) {}
  static ParallelStylePtr make(StyleOptions o = {}) { return std::make_shared<ColwiseParallel>(std::move(o)); }
  std::string name() const override { return "ColwiseParallel"; }
  ModuleLayouts apply(torch::nn::Module& module, const std::string& path, const DeviceMesh& mesh,
                      std::optional<int64_t> src_data_rank) const override;

 private:
  StyleOptions options_;
};

// Linear: weight Shard(1), bias Replicate; input Shard(-1) -> Partial -> output Replicate.
// Embedding: weight Shard(0) (vocabulary-parallel, masked lookup); input Replicate.
class RowwiseParallel : public ParallelStyle {
 public:
  explicit RowwiseParallel(StyleOptions o = {}) : options_(std::move(o)) {}
  static ParallelStylePtr make(StyleOptions o = {}) { return std::make_shared<RowwiseParallel>(std::move(o)); }
  std::string name() const override { return "RowwiseParallel"; }
  ModuleLayouts apply(torch::nn::Module& module, const std::string& path, const DeviceMesh& mesh,
                      std::optional<int64_t> src_data_rank) const override;

 private:
  StyleOptions options_;
};

// Parameters untouched; only the module's input is converted (PyTorch's
// PrepareModuleInput for a single tensor input): laid out as input_layouts, redistributed
// to desired_input_layouts and, with use_local_output, handed over as the local piece.
class PrepareModuleInput : public ParallelStyle {
 public:
  PrepareModuleInput(Placements input_layouts, Placements desired_input_layouts, bool use_local_output = false)
      : input_(std::move(input_layouts)), desired_(std::move(desired_input_layouts)), local_(use_local_output) {}
  std::string name() const override { return "PrepareModuleInput"; }
  ModuleLayouts apply(torch::nn::Module& module, const std::string& path, const DeviceMesh& mesh,
                      std::optional<int64_t> src_data_rank) const override;

 private:
  Placements input_, desired_;
  bool local_;
};

// Sequence parallel (Megatron-LM's, as PyTorch's SequenceParallel): for modules that work
// per token (norms) between a RowwiseParallel that reduce-scatters to Shard(1) and a
// ColwiseParallel that all-gathers from it, so that the norms and the residual stream hold
// 1 / tp of the sequence. The module's direct parameters become Replicate DTensors: each
// rank's gradient covers only its tokens (Partial over the sequence), and the parameter's
// gradient hook all-reduces it, so every rank holds the sum. Input: a DTensor keeps its
// layout and is redistributed to Shard(sequence_dim); a plain input is taken as this
// rank's even piece. Output: the Shard(sequence_dim) DTensor. Modules that read a
// parameter through a public member must refresh it after parallelize_module
// (`norm->weight = norm->named_parameters(false)["weight"]`), as for Linear's weight.
class SequenceParallel : public ParallelStyle {
 public:
  explicit SequenceParallel(int64_t sequence_dim = 1, bool use_local_output = false)
      : sequence_dim_(sequence_dim), local_(use_local_output) {}
  static ParallelStylePtr make(int64_t sequence_dim = 1, bool use_local_output = false) {
    return std::make_shared<SequenceParallel>(sequence_dim, use_local_output);
  }
  std::string name() const override { return "SequenceParallel"; }
  ModuleLayouts apply(torch::nn::Module& module, const std::string& path, const DeviceMesh& mesh,
                      std::optional<int64_t> src_data_rank) const override;

 private:
  int64_t sequence_dim_;
  bool local_;
};

// Keyed by sub-module path ("layers.0.attention.wq"); '*' matches one path component.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStylePtr>>;

// Applies every entry of the plan; a pattern that matches nothing is an error. Parameters
// are sharded with distribute_tensor(..., src_data_rank), PyTorch's default 0: the values
// of mesh coordinate 0. std::nullopt takes each rank's own values as they are (no
// collective), right only when every rank initialised the module identically.
void parallelize_module(torch::nn::Module& root, const DeviceMesh& mesh, const ParallelizePlan& plan,
                        std::optional<int64_t> src_data_rank = 0);

// The conversions recorded for a module (nullptr when it was not parallelized).
const ModuleLayouts* module_layouts(const torch::nn::Module& module);

// Calls `forward(input)` with the module's input/output conversions applied.
template <typename ModuleHolderT>
at::Tensor parallel_forward(ModuleHolderT& module, const at::Tensor& input);

// The conversions themselves (used by parallel_forward).
at::Tensor prepare_module_input(const ModuleLayouts& layouts, const at::Tensor& input);
at::Tensor prepare_module_output(const ModuleLayouts& layouts, const at::Tensor& output);

template <typename ModuleHolderT>
at::Tensor parallel_forward(ModuleHolderT& module, const at::Tensor& input) {
  const ModuleLayouts* l = module_layouts(*module.ptr());
  if (!l) return module->forward(input);
  return prepare_module_output(*l, module->forward(prepare_module_input(*l, input)));
}

}  // namespace hyper_parallel

HP_PUBLIC_END
